"""Where the built-in dataset lives, whatever the working directory (paths only: nothing here
builds it; `skyrl_tool_agent.data.builtin.location.builtin_data_dir` builds it on first use).

1. A source checkout's `data/processed`, when it holds train.json, dev.json and databases/.
2. Else the cache, `$SKYRL_TOOL_AGENT_CACHE/builtin/<key>`, the key a digest of the generator's
   source, so a changed generator never reads a stale build.
"""

from __future__ import annotations

import hashlib
import sqlite3
from pathlib import Path

from skyrl_tool_agent.config.model import cache_root

#: The source checkout this package lives in, if any (a wheel install has no pyproject.toml beside it).
_PACKAGE_DIR = Path(__file__).resolve().parents[1]
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


def builtin_data_location() -> Path:
    """Where the built-in dataset is read from: the checkout's data/processed when complete, else
    the cache entry (which may not be built yet)."""
    if in_checkout() and is_complete(CHECKOUT_DATA):
        return CHECKOUT_DATA
    return cached_data_dir()
