"""The OpenMP worker threads torch's CPU ops run on, freed by a thread that goes idle.

OpenMP keeps a worker pool per thread that ran a parallel op; when the pools hold more threads than
there are cores, GNU OpenMP's workers stop spinning and every region waits for a wake-up (the
engine's decode thread ran ~1.5x slower beside the main thread's idle pool). So a thread about to
wait for another frees its pool (`omp_pause_resource_all`), rebuilt at its next parallel op.
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
