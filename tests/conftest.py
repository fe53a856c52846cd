"""Shared fixtures. Async tests use anyio (`@pytest.mark.anyio`) on the asyncio backend."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests.fixtures.config_files import CONFIGS

REPO_ROOT = Path(__file__).resolve().parents[1]
BUILTIN_DATA = REPO_ROOT / "data" / "processed"
BUILTIN_DB_ROOT = BUILTIN_DATA / "databases"
SPIDER_ROOT = (REPO_ROOT / ".." / "shared" / "spider").resolve()
#: Each test module's seconds in a whole run (`benchmarks/bench_suite.py --module-seconds-out` writes it
#: from the JUnit file scripts/test.sh leaves): the order the modules are handed to the workers in.
MODULE_SECONDS = Path(__file__).with_name("module_seconds.json")


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Longest modules first, each module's tests together and in their own order. scripts/test.sh
    hands the workers one module at a time (`--dist loadscope`, in this order): the long modules
    start at once and the many short ones fill in at the end, so both workers finish together
    (the last long module started late left one worker alone for up to a minute), and a module's
    fixtures are built on one worker only. A module not in the file (new) counts as the longest:
    run early, it cannot be the one left running alone. Only the order changes, never what runs."""
    seconds = json.loads(MODULE_SECONDS.read_text()) if MODULE_SECONDS.is_file() else {}
    first_seen: dict[str, int] = {}
    for item in items:
        first_seen.setdefault(item.nodeid.split("::")[0], len(first_seen))

    def key(item: pytest.Item) -> tuple[float, int]:
        module = item.nodeid.split("::")[0]
        return -seconds.get(module, float("inf")), first_seen[module]

    items.sort(key=key)  # stable: each module's own order is kept


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
