"""The process group of a DeepSpeed run, and the lockstep protocol that keeps ZeRO-3 ranks'
generation calls matched.

Under ZeRO-3 every forward pass all-gathers each layer's parameter shards, so every rank must run
the same number of forward passes, in the same order. Inside one `generate` call transformers'
`synced_gpus=True` does that (a rank that finished keeps running dummy steps until all have).
Across calls, the collector's number of generation batches depends on the rank's own episodes
(turn counts, retries), so `LockstepRounds` adds one all-reduce per call: a rank that has finished
its episodes keeps joining the others' calls with a one-token dummy prompt until no rank has work.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

logger = logging.getLogger(__name__)

#: How long a collective may wait for the slowest rank (rank 0 may build the embedded model).
DEFAULT_TIMEOUT = timedelta(minutes=60)


@dataclass(frozen=True)
class DistContext:
    """This process's place in the data-parallel group: rank, world size, local rank, device."""

    rank: int
    world_size: int
    local_rank: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @classmethod
    def init(cls, timeout: timedelta = DEFAULT_TIMEOUT) -> DistContext:
        """Join the process group the launcher (deepspeed, accelerate, torchrun) set up through
        RANK/WORLD_SIZE/MASTER_ADDR: NCCL on GPUs, gloo on CPU (`DS_ACCELERATOR=cpu`)."""
        import deepspeed
        from deepspeed.accelerator import get_accelerator

        accelerator = get_accelerator()
        local_rank = int(os.environ.get("LOCAL_RANK", 0))
        on_cpu = accelerator.device_name() == "cpu"
        if not on_cpu:
            accelerator.set_device(local_rank)
        backend = "gloo" if on_cpu else accelerator.communication_backend_name()
        if not dist.is_initialized():
            deepspeed.init_distributed(dist_backend=backend, timeout=timeout)
        device = torch.device("cpu") if on_cpu else torch.device(accelerator.device_name(local_rank))
        ctx = cls(dist.get_rank(), dist.get_world_size(), local_rank, device)
        logger.info("rank %d/%d on %s (%s)", ctx.rank, ctx.world_size, device, backend)
        return ctx

    def close(self) -> None:
        """Leave the group together: all ranks meet, then tear the backend down. Exiting with the
        group alive lets the interpreter destroy gloo's threads while they are still joinable, which
        aborts a rank at exit ("terminate called without an active exception", seen once in CI)."""
        if dist.is_initialized():
            dist.barrier()
            dist.destroy_process_group()

    # ------------------------------------------------------------ collectives
    def barrier(self) -> None:
        dist.barrier()

    def all_gather_object(self, obj: Any) -> list[Any]:
        """Every rank's `obj`, indexed by rank (pickled; for results and stats, not tensors)."""
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj)
        return out

    def broadcast_object(self, obj: Any, src: int = 0) -> Any:
        """Rank `src`'s `obj` on every rank (decisions that must agree, e.g. 'stop now')."""
        box = [obj]
        dist.broadcast_object_list(box, src=src)
        return box[0]

    def all_reduce_sum(self, value: int) -> int:
        tensor = torch.tensor([value], dtype=torch.long, device=self.device)
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
        return int(tensor.item())


class LockstepRounds:
    """One all-reduce per generation call, so ranks with fewer calls join the others' (see module doc).

    `enter()` is called by a rank about to generate (it announces work); `drain(idle)` by a rank
    whose episodes are done: it keeps calling `idle()` (a dummy generation) while any other rank
    still announces work, and returns when none does. Every rank makes exactly one all-reduce and
    (while anyone works) exactly one generation call per round.
    """

    def __init__(self, ctx: DistContext) -> None:
        self.ctx = ctx
        self.idle_calls = 0

    def enter(self) -> None:
        if self.ctx.world_size > 1:
            self.ctx.all_reduce_sum(1)

    def drain(self, idle: Callable[[], None]) -> None:
        if self.ctx.world_size == 1:
            return
        while self.ctx.all_reduce_sum(0) > 0:
            self.idle_calls += 1
            idle()
