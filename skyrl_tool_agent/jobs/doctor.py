"""The doctor job (`skyrl-tool-agent doctor`): is this machine ready to train? Every check of
`doctor_checks.CHECKS`, then the memory plan a `train` with the same flags would make, one line
each, then the count. Needs no file outside the package."""

from __future__ import annotations

import functools
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from skyrl_tool_agent.config import Config
from skyrl_tool_agent.jobs.doctor_checks import CHECKS, FAIL, check_memory_plan

logger = logging.getLogger(__name__)


@dataclass
class Check:
    """One line of the report."""

    status: str
    name: str
    detail: str
    seconds: float = 0.0

    def line(self) -> str:
        return f"{self.status:<4}  {self.name}: {self.detail} ({self.seconds:.1f} s)"


def run_check(name: str, check: Callable[[], tuple[str, str]]) -> Check:
    """`check`'s line, timed; an exception is its FAIL line (the other checks still run)."""
    start = time.perf_counter()
    try:
        status, detail = check()
    except Exception as exc:  # noqa: BLE001 - a failing check is a FAIL line, the others still run
        logger.debug("check %s failed", name, exc_info=True)
        status, detail = FAIL, f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"
    return Check(status, name, detail, time.perf_counter() - start)


def doctor(device: torch.device, config: Config, *, gpu_memory_gib: float | None = None, gpus: int | None = None,
           emit: Callable[[str], None] = lambda line: None) -> list[Check]:
    """Run every check on `device`, then plan `config` (the run train's flags describe) for a GPU of
    `gpu_memory_gib` (x `gpus`, default WORLD_SIZE, else 1), else for `device`. `emit` gets each
    line as it comes, then the count."""
    world = gpus or int(os.environ.get("WORLD_SIZE", "1"))
    checks = [(name, functools.partial(check, device) if takes_device else check) for name, check, takes_device in CHECKS]
    checks.append(("memory plan", lambda: check_memory_plan(config, device, gpu_memory_gib=gpu_memory_gib, world=world)))
    results = []
    for name, check in checks:
        results.append(run_check(name, check))
        emit(results[-1].line())
    failed = [c.name for c in results if c.status == FAIL]
    emit(f"doctor: {len(results) - len(failed)} of {len(results)} checks without failure"
         + (f"; failed: {', '.join(failed)}" if failed else ""))
    return results
