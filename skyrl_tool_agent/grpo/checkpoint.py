"""Checkpoints: weights (adapter or model), optimizer, scheduler, RNG states, data-loader state, step.

A checkpoint is written to `step-XXXXXX.tmp` and renamed when complete, so `--resume auto` never
picks up a half-written one (e.g. after `kill -9` mid-save).
"""

from __future__ import annotations

import json
import logging
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

logger = logging.getLogger(__name__)

STATE_FILE = "trainer_state.json"


def rng_state() -> dict[str, Any]:
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])


def save_checkpoint(
    root: Path,
    step: int,
    *,
    policy: Any,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    trainer_state: dict[str, Any],
    keep: int,
) -> Path:
    final = root / f"step-{step:06d}"
    tmp = root / f"step-{step:06d}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    policy.model.save_pretrained(tmp / "weights")
    torch.save(
        {"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(), "rng": rng_state()},
        tmp / "optim.pt",
    )
    (tmp / STATE_FILE).write_text(json.dumps({"step": step, **trainer_state}) + "\n")
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    for old in sorted(p for p in root.glob("step-*") if not p.name.endswith(".tmp"))[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    logger.info("checkpoint saved: %s", final)
    return final


def latest_checkpoint(root: Path) -> Path | None:
    done = sorted(p for p in root.glob("step-*") if not p.name.endswith(".tmp") and (p / STATE_FILE).is_file())
    return done[-1] if done else None


def load_checkpoint(path: Path, *, policy: Any, optimizer: torch.optim.Optimizer, scheduler: Any) -> dict[str, Any]:
    """Restore weights, optimizer, scheduler and RNG in place; returns the trainer state dict."""
    weights = path / "weights"
    if policy.mode == "lora":
        from peft import set_peft_model_state_dict
        from safetensors.torch import load_file

        set_peft_model_state_dict(policy.model, load_file(str(weights / "adapter_model.safetensors")))
    else:
        from transformers import AutoModelForCausalLM

        loaded = AutoModelForCausalLM.from_pretrained(weights, dtype=next(policy.model.parameters()).dtype)
        policy.model.load_state_dict(loaded.state_dict())
    blob = torch.load(path / "optim.pt", weights_only=False)
    optimizer.load_state_dict(blob["optimizer"])
    scheduler.load_state_dict(blob["scheduler"])
    set_rng_state(blob["rng"])
    return json.loads((path / STATE_FILE).read_text())
