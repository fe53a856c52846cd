"""Whether an evaluation talks to Weave, decided before `weave` is imported.

Importing `weave` sets up Sentry reporting that sends a session at exit; a run without credentials
must never touch the network, so `prepare_weave("disabled")` turns that off with tracing.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping
from typing import Literal

WeaveMode = Literal["online", "disabled"]
_TRUE = {"1", "true", "yes", "on"}


def weave_mode(wandb_mode: str = "auto", environ: Mapping[str, str] | None = None) -> WeaveMode:
    """online only with credentials (WANDB_API_KEY) and nothing turning W&B off: the config's
    `training.wandb.mode` (offline/disabled), WANDB_MODE=offline|disabled or WEAVE_DISABLED=true."""
    env = os.environ if environ is None else environ
    off = (not env.get("WANDB_API_KEY") or wandb_mode in ("offline", "disabled")
           or env.get("WANDB_MODE", "").lower() in ("offline", "disabled", "dryrun")
           or env.get("WEAVE_DISABLED", "").lower() in _TRUE)
    return "disabled" if off else "online"


def prepare_weave(mode: WeaveMode) -> None:
    """Process-wide settings for `mode`; idempotent. disabled: no error reporting to sentry.io
    (set before weave is imported; an already-imported weave's reporter is switched off)."""
    # Weave logs one INFO line per evaluated row; progress is our own bar's job.
    logging.getLogger("weave.evaluation.eval").setLevel(logging.WARNING)
    if mode != "disabled":
        return
    os.environ["WANDB_ERROR_REPORTING"] = "false"
    sentry_module = sys.modules.get("weave.telemetry.trace_sentry")
    if sentry_module is not None:
        # The reporter reads the variable once, when weave is imported; its documented opt-out
        # is that variable, and this flag is what the variable sets.
        sentry_module.global_trace_sentry._disabled = True
