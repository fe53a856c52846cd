"""The process group of a data-parallel run (LoRA over plain `torch.distributed`, full mode through
DeepSpeed): rank context, object and gradient collectives. Sampling needs none: each rank's rollout
engine samples from its own copy of the weights (ZeRO-3 ranks gather it once per step).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from skyrl_tool_agent.config import UserInputError

logger = logging.getLogger(__name__)

#: How long a collective may wait for the slowest rank (rank 0 may build the embedded model).
DEFAULT_TIMEOUT = timedelta(minutes=60)


def skip_cpu_shared_memory_op() -> None:
    """Keep DeepSpeed on the CPU from compiling its shared-memory communication op.

    DeepSpeed's communication backend builds `deepspeed_shm_comm` (C++, torch's JIT extension
    loader) whenever the CPU accelerator is compatible with it, but the op serves only
    `inference_all_reduce` (tensor-parallel inference): ZeRO-3 training never calls it. Building
    it cost ~50 s on a machine's first start, and the loader's build lock
    (`$TORCH_EXTENSIONS_DIR/.../deepspeed_shm_comm/lock`), left behind by a start that was killed
    while it held it, made every later start wait on it forever. Marked incompatible, DeepSpeed
    leaves the op out and reduces through gloo as for any other collective."""
    import deepspeed.ops

    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False


@dataclass(frozen=True)
class DistContext:
    """This process's place in the data-parallel group: rank, world size, local rank, device, backend."""

    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    backend: str = "gloo"

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @classmethod
    def init(cls, device: torch.device, timeout: timedelta = DEFAULT_TIMEOUT) -> DistContext:
        """Join the process group a launcher (torchrun, accelerate, deepspeed) describes through
        RANK/WORLD_SIZE/MASTER_ADDR with plain `torch.distributed`, this rank working on `device`:
        NCCL for CUDA devices, gloo otherwise. No DeepSpeed import (LoRA data parallel)."""
        local_rank = int(os.environ.get("LOCAL_RANK", 0))
        if device.type == "cuda":
            if device.index is not None and device.index >= torch.cuda.device_count():
                raise UserInputError(f"local rank {local_rank} has no GPU: this node has {torch.cuda.device_count()} "
                                     "(start at most one process per GPU, e.g. torchrun --nproc_per_node N)")
            torch.cuda.set_device(device)  # before NCCL: each rank's communicator on its own GPU
        backend = "nccl" if device.type == "cuda" else "gloo"
        if not dist.is_initialized():
            dist.init_process_group(backend=backend, timeout=timeout)
        return cls._joined(local_rank, device, backend)

    @classmethod
    def init_deepspeed(cls, timeout: timedelta = DEFAULT_TIMEOUT) -> DistContext:
        """Join the process group through DeepSpeed (full mode): its accelerator picks the device and
        backend, NCCL on GPUs, gloo on CPU (`DS_ACCELERATOR=cpu`), as ZeRO-3 will use them."""
        import deepspeed
        from deepspeed.accelerator import get_accelerator

        accelerator = get_accelerator()
        local_rank = int(os.environ.get("LOCAL_RANK", 0))
        on_cpu = accelerator.device_name() == "cpu"
        if not on_cpu:
            accelerator.set_device(local_rank)
        backend = "gloo" if on_cpu else accelerator.communication_backend_name()
        if on_cpu:
            skip_cpu_shared_memory_op()
        if not dist.is_initialized():
            deepspeed.init_distributed(dist_backend=backend, timeout=timeout)
        device = torch.device("cpu") if on_cpu else torch.device(accelerator.device_name(local_rank))
        return cls._joined(local_rank, device, backend)

    @classmethod
    def _joined(cls, local_rank: int, device: torch.device, backend: str) -> DistContext:
        ctx = cls(dist.get_rank(), dist.get_world_size(), local_rank, device, backend)
        logger.info("rank %d/%d on %s (%s)", ctx.rank, ctx.world_size, device, backend)
        if not ctx.is_main:
            logging.getLogger().setLevel(logging.WARNING)  # one rank narrates
        return ctx

    @property
    def comm_device(self) -> torch.device:
        """Where collective tensors live: the CPU under gloo (whatever the model's device, MPS
        included), else the rank's accelerator (NCCL and DeepSpeed's other device backends)."""
        return torch.device("cpu") if self.backend == "gloo" else self.device

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

    def sum_gradients(self, params: Sequence[torch.nn.Parameter]) -> None:
        """Replace each parameter's gradient by the sum of every rank's, in one all-reduce of one
        flat fp32 buffer (bf16 adapters lose nothing in the sum). A parameter without a gradient
        on this rank (it ran no loss tokens) contributes zeros."""
        flat = self._flat([p.grad if p.grad is not None else torch.zeros_like(p) for p in params])
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        for p, value in zip(params, self._unflat(flat, params), strict=True):
            p.grad = value

    def broadcast_parameters(self, params: Sequence[torch.nn.Parameter]) -> None:
        """Overwrite `params` with rank 0's values (one flat broadcast): replicas start identical."""
        flat = self._flat([p.detach() for p in params])
        dist.broadcast(flat, src=0)
        with torch.no_grad():
            for p, value in zip(params, self._unflat(flat, params), strict=True):
                p.copy_(value)

    def _flat(self, tensors: Sequence[torch.Tensor]) -> torch.Tensor:
        if not tensors:
            return torch.zeros(0, dtype=torch.float32, device=self.comm_device)
        return torch.cat([t.reshape(-1).to(self.comm_device, torch.float32) for t in tensors])

    @staticmethod
    def _unflat(flat: torch.Tensor, like: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """`flat` cut back into tensors shaped, typed and placed like `like`."""
        out, offset = [], 0
        for t in like:
            out.append(flat[offset : offset + t.numel()].view(t.shape).to(t.device, t.dtype))
            offset += t.numel()
        return out

    def all_reduce_sum(self, value: int) -> int:
        """The sum of every rank's `value` (ints: counts and votes)."""
        tensor = torch.tensor([value], dtype=torch.long, device=self.comm_device)
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
        return int(tensor.item())
