"""Shared fixtures. Async tests use anyio (`@pytest.mark.anyio`) on the asyncio backend."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.fixtures.config_files import CONFIGS

REPO_ROOT = Path(__file__).resolve().parents[1]
BUILTIN_DATA = REPO_ROOT / "data" / "processed"
BUILTIN_DB_ROOT = BUILTIN_DATA / "databases"
SPIDER_ROOT = (REPO_ROOT / ".." / "shared" / "spider").resolve()


@pytest.fixture
def cfg_dir(tmp_path: Path) -> Path:
    """A private copy of the shipped configs/ to break (config tests)."""
    target = tmp_path / "configs"
    shutil.copytree(CONFIGS, target)
    return target


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO_ROOT


@pytest.fixture(scope="session")
def spider_root() -> Path:
    if not (SPIDER_ROOT / "dev.json").is_file():
        pytest.skip(f"Spider not found at {SPIDER_ROOT}")
    return SPIDER_ROOT


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory) -> Path:
    """The launched two-rank tests' run directory (tasks, the shop database, a tiny random Qwen2),
    built once per test process for test_deepspeed, test_data_parallel and test_multinode alike; they
    only read it."""
    from tests.fixtures.distributed import tiny_run_root

    return tiny_run_root(tmp_path_factory.mktemp("tiny_run"))
