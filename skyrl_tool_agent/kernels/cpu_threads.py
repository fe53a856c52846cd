"""The OpenMP worker threads torch's CPU ops run on, freed by a thread that goes idle.

OpenMP keeps a pool of worker threads for each thread that has run a parallel op (torch's CPU
backend: GNU OpenMP on Linux, LLVM's on macOS). When the pools together hold more threads than the
machine has cores, GNU OpenMP stops letting its workers spin between parallel regions: every region
then waits for the kernel to wake them. The rollout engine decodes in its own thread beside the main
thread (the update, the evaluations), so on a 2-core machine both pools exist and every op of both
threads pays that wake-up: the engine's decode ran ~1.5x slower with the main thread's pool merely
present (issue 46, lab notebook session 17). So a thread about to wait for another frees its pool
(`omp_pause_resource_all`, OpenMP 5.0), and the pool is rebuilt at its next parallel op.
"""

from __future__ import annotations

import ctypes
import functools
import os
from collections.abc import Callable
from pathlib import Path

_OMP_PAUSE_SOFT = 1
_RUNTIMES = ("libgomp", "libomp", "libiomp")


def _loaded_runtimes() -> list[str]:
    """Paths of the OpenMP runtimes in this process: from /proc/self/maps (Linux), else torch's own
    bundled copies (opened only if already loaded, below)."""
    paths: list[str] = []
    maps = Path("/proc/self/maps")
    if maps.exists():
        for line in maps.read_text().splitlines():
            path = line.split(maxsplit=5)[-1] if "/" in line else ""
            if os.path.basename(path).startswith(_RUNTIMES) and path not in paths:
                paths.append(path)
    import torch

    paths += [str(p) for p in sorted((Path(torch.__file__).parent / "lib").glob("lib*omp*"))]
    return paths


@functools.cache
def _pause() -> Callable[[int], int] | None:
    for path in _loaded_runtimes():
        try:  # RTLD_NOLOAD: the runtime torch already uses, never a second copy
            pause = ctypes.CDLL(path, mode=os.RTLD_NOLOAD | os.RTLD_LAZY).omp_pause_resource_all
        except (OSError, AttributeError):
            continue
        pause.argtypes, pause.restype = [ctypes.c_int], ctypes.c_int
        return pause
    return None


def release_thread_pool() -> bool:
    """Free the calling thread's OpenMP worker threads (module docstring); they come back at its
    next parallel op. False where torch's OpenMP runtime does not offer it (nothing happens)."""
    pause = _pause()
    return pause is not None and pause(_OMP_PAUSE_SOFT) == 0
