"""The built-in dataset on disk: built into the cache on first use (where it is read from:
`skyrl_tool_agent.config.builtin_paths`, whose file names this module re-exports).

`python training/scripts/build_data.py` (`skyrl-tool-agent build-data`) writes the same files.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from skyrl_tool_agent.config.builtin_paths import (
    BUILTIN_SEED,
    DB_DIR,
    DEV_FILE,
    TRAIN_FILE,
    builtin_data_location,
    default_output_dir,
    is_complete,
)

__all__ = ["DB_DIR", "DEV_FILE", "TRAIN_FILE", "build_into", "builtin_data_dir", "default_output_dir"]

logger = logging.getLogger(__name__)


def builtin_data_dir() -> Path:
    """The directory of the built-in dataset, building it into the cache on first use."""
    target = builtin_data_location()
    if not is_complete(target):
        build_into(target)
    return target


def build_into(target: Path, build: Callable[[Path], object] | None = None,
               complete: Callable[[Path], bool] = is_complete) -> Path:
    """Build into `target` through a staging directory renamed into place, so a concurrent or
    interrupted build never leaves a half-written `target`. `build` writes the staging directory
    (default: the built-in data); `complete` tells a finished `target`."""
    if build is None:
        from skyrl_tool_agent.data.builtin.generate import build_builtin

        logger.info("building the built-in dataset into %s (first use)", target)
        build = lambda staging: build_builtin(staging, seed=BUILTIN_SEED)  # noqa: E731
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".building-", dir=target.parent))
    try:
        build(staging)
        if target.exists() and not complete(target):  # the leftover of something else: ours to replace
            shutil.rmtree(target)
        try:
            os.rename(staging, target)
        except OSError:
            if not complete(target):  # not a concurrent build that finished first
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target
