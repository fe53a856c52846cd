"""The memory a plan is drawn from on this machine's device, and how bytes are written in logs."""

from __future__ import annotations

import resource
import sys
from dataclasses import dataclass
from typing import Any

GIB = 2**30
MIB = 2**20


@dataclass(frozen=True)
class DeviceMemory:
    """What a budget is drawn from: `total` bytes the fraction applies to, `in_use` of them taken."""

    total: int
    in_use: int
    where: str  # "of cuda:0" or "of available RAM"


def device_memory(device: Any) -> DeviceMemory:
    """The memory a budget on `device` is drawn from: on CUDA the device's total and what is in use
    (the caching allocator's free blocks count as free); on a CPU the RAM available now."""
    if device.type == "cuda":
        import torch

        free, total = torch.cuda.mem_get_info(device)
        others = total - free - torch.cuda.memory_reserved(device)
        return DeviceMemory(total, others + torch.cuda.memory_allocated(device), f"of {device}")
    import psutil

    return DeviceMemory(psutil.virtual_memory().available, 0, "of available RAM")


def format_bytes(n: int) -> str:
    """`n` bytes in GiB, MiB or KiB (the largest unit it fills)."""
    for unit, size in (("GiB", GIB), ("MiB", MIB)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n / 1024:.1f} KiB"


def peak_rss_gib() -> float:
    """This process's peak resident memory so far (the kernel's high-water mark, VmHWM), GiB: the
    figure a machine's RAM must hold, rollout, update and evaluations included."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**30 if sys.platform == "darwin" else peak / 2**20  # macOS reports bytes, Linux KiB
