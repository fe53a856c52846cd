"""Where the built-in dataset is read from, whatever the working directory.

1. A source checkout's `data/processed` (the package sits next to it: `pip install -e .` or a
   clone on sys.path), when it holds train.json, dev.json and databases/.
2. Else the cache, `$SKYRL_TOOL_AGENT_CACHE/builtin/<key>` (default ~/.cache/skyrl_tool_agent),
   built there on first use by `build_builtin` (seed 0; deterministic, a few seconds of CPU). The
   key is a digest of the generator's source, so a changed generator never reads a stale build.

`python training/scripts/build_data.py` (`skyrl-tool-agent build-data`) writes the same files.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import sqlite3
import tempfile
from pathlib import Path

from skyrl_tool_agent.config.model import cache_root

logger = logging.getLogger(__name__)

#: The source checkout this package lives in, if any (a wheel install has no pyproject.toml beside it).
_PACKAGE_DIR = Path(__file__).resolve().parents[2]
CHECKOUT_ROOT = _PACKAGE_DIR.parent
CHECKOUT_DATA = CHECKOUT_ROOT / "data" / "processed"
#: The seed the built-in data is generated with (build_data.py's default).
BUILTIN_SEED = 0
#: What a complete built-in data directory holds (relative to it).
TRAIN_FILE = "train.json"
DEV_FILE = "dev.json"
DB_DIR = "databases"
#: Package sources whose change changes the generated files (the cache key digests them).
_GENERATOR_SOURCES = ("data/builtin", "data/tasks.py", "data/hardness.py")


def is_complete(directory: Path) -> bool:
    """Whether `directory` holds a built-in dataset (train.json, dev.json, databases/)."""
    return (directory / TRAIN_FILE).is_file() and (directory / DEV_FILE).is_file() and (directory / DB_DIR).is_dir()


def in_checkout() -> bool:
    """Whether the package is imported from a source checkout (its pyproject.toml is beside it)."""
    return (CHECKOUT_ROOT / "pyproject.toml").is_file() and (CHECKOUT_ROOT / "skyrl_tool_agent").is_dir()


def generator_digest() -> str:
    """12 hex digits over the generator's source files and the SQLite version (which shapes the
    .sqlite bytes): with the seed, the cache key of a build."""
    digest = hashlib.sha256(f"sqlite={sqlite3.sqlite_version}".encode())
    for entry in _GENERATOR_SOURCES:
        path = _PACKAGE_DIR / entry
        files = sorted(path.rglob("*.py")) if path.is_dir() else [path]
        for file in files:
            digest.update(file.relative_to(_PACKAGE_DIR).as_posix().encode())
            digest.update(file.read_bytes())
    return digest.hexdigest()[:12]


def cached_data_dir(seed: int = BUILTIN_SEED) -> Path:
    """Where the cache holds (or will hold) the built-in data of `seed` for this generator."""
    return cache_root() / "builtin" / f"seed{seed}-{generator_digest()}"


def default_output_dir(seed: int = BUILTIN_SEED) -> Path:
    """Where `build-data` writes by default: the checkout's data/processed, else the cache entry."""
    return CHECKOUT_DATA if in_checkout() else cached_data_dir(seed)


def builtin_data_dir() -> Path:
    """The directory of the built-in dataset, building it into the cache on first use."""
    if in_checkout() and is_complete(CHECKOUT_DATA):
        return CHECKOUT_DATA
    target = cached_data_dir()
    if not is_complete(target):
        build_into(target)
    return target


def build_into(target: Path) -> Path:
    """Build the built-in data into `target` through a staging directory renamed into place, so a
    concurrent or interrupted build never leaves a half-written `target`."""
    from skyrl_tool_agent.data.builtin.generate import build_builtin

    target.parent.mkdir(parents=True, exist_ok=True)
    logger.info("building the built-in dataset into %s (first use)", target)
    staging = Path(tempfile.mkdtemp(prefix=".building-", dir=target.parent))
    try:
        build_builtin(staging, seed=BUILTIN_SEED)
        if target.exists() and not is_complete(target):  # the leftover of something else: ours to replace
            shutil.rmtree(target)
        try:
            os.rename(staging, target)
        except OSError:
            if not is_complete(target):  # not a concurrent build that finished first
                raise
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    return target
