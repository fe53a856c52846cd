"""The process group of a data-parallel run (LoRA over plain `torch.distributed`, full mode through
DeepSpeed): rank context, object and gradient collectives. Sampling needs none: each rank's rollout
engine samples from its own copy of the weights (ZeRO-3 ranks gather it once per step).

A collective waits at most `training.collective_timeout_minutes`; a dead rank is named within
seconds by the ranks' beats in the launch's rendezvous store (`Heartbeat`), whether a collective
fails (gloo) or hangs (NCCL).
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from skyrl_tool_agent.config import TrainingConfig, UserInputError
from skyrl_tool_agent.config.base import default_of

logger = logging.getLogger(__name__)


def collective_timeout(minutes: float = default_of(TrainingConfig, "collective_timeout_minutes")) -> timedelta:
    """How long a collective may wait for the slowest rank (`training.collective_timeout_minutes`)."""
    return timedelta(minutes=minutes)


#: Seconds between a rank's heartbeats.
BEAT_S = 2.0


class Heartbeat:
    """This rank's beats, counted in the launch's rendezvous store (a daemon thread), and every
    rank's: which ranks stopped answering. `on_lost(line)` is called once, from the thread, when a
    rank's beats have stopped for `lost_after_s` (a launch passes the collective timeout, so a live
    rank starved by a long write is never taken for dead)."""

    def __init__(self, store: Any, rank: int, world_size: int, *, where: str, lost_after_s: float,
                 beat_s: float = BEAT_S, on_lost: Callable[[str], None] | None = None) -> None:
        self.store, self.rank, self.world_size, self.where = store, rank, world_size, where
        self.beat_s, self.lost_after_s, self.on_lost = beat_s, lost_after_s, on_lost
        now = time.monotonic()
        self._counts: list[int | None] = [None] * world_size
        self._advanced = [now] * world_size  # when each rank's count last moved (this rank's clock)
        self._store_ok = now
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="skyrl-heartbeat", daemon=True)

    @classmethod
    def from_env(cls, rank: int, world_size: int, **kwargs: Any) -> Heartbeat | None:
        """A heartbeat on the store of the launcher's MASTER_ADDR/MASTER_PORT (torchrun's agent or
        rank 0's store), started; None without one (a process group made in code)."""
        host, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
        if world_size < 2 or not host or not port:
            return None
        try:
            store = dist.TCPStore(host, int(port), is_master=False, timeout=timedelta(seconds=10),
                                  wait_for_workers=False)
        except (RuntimeError, ValueError) as exc:  # a launcher whose store is elsewhere: the timeout alone remains
            logger.warning("no heartbeat for rank %d (the store at %s:%s: %s): a lost rank is noticed only after "
                           "training.collective_timeout_minutes", rank, host, port, exc)
            return None
        beat = cls(store, rank, world_size, where=f"{host}:{port}", **kwargs)
        beat.start()
        return beat

    @staticmethod
    def _key(rank: int) -> str:
        return f"skyrl-tool-agent/heartbeat/{rank}"

    @staticmethod
    def _following_key(rank: int) -> str:
        return f"skyrl-tool-agent/following/{rank}"

    def _verdict(self, line: str | None) -> str | None:
        """`line`, with this rank recorded in the store as stopping because of the lost ranks, so a
        later verdict does not name this one (whose beats stop a moment after) among the lost."""
        if line is not None:
            with contextlib.suppress(Exception):  # noqa: BLE001 - a store that is gone: the verdict says so already
                self.store.add(self._following_key(self.rank), 1)
        return line

    def _following(self, rank: int) -> bool:
        """Whether `rank` recorded that it stops because of another's loss (`_verdict`)."""
        try:
            return int(self.store.add(self._following_key(rank), 0)) > 0
        except Exception:  # noqa: BLE001 - an unreachable store: name the rank, as before
            return False

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5 * self.beat_s)

    def _beat(self) -> None:
        try:
            self.store.add(self._key(self.rank), 1)
            counts = [int(self.store.add(self._key(r), 0)) for r in range(self.world_size)]
        except Exception:  # noqa: BLE001 - an unreachable store is what `stalled` reports
            return
        now = self._store_ok = time.monotonic()
        for r, count in enumerate(counts):
            if count != self._counts[r]:
                self._counts[r], self._advanced[r] = count, now

    def _run(self) -> None:
        reported = False
        while not self._stop.wait(self.beat_s):
            self._beat()
            if self.on_lost is not None and not reported:
                line = self._verdict(self.stalled(self.lost_after_s))
                if line is not None:
                    reported = True
                    self.on_lost(line)

    def stalled(self, silent_s: float) -> str | None:
        """One line naming the ranks (or the store) silent for `silent_s` seconds, first silent
        first; None when every rank beats."""
        now, advanced = time.monotonic(), list(self._advanced)  # one look: the beat thread moves them
        if now - self._store_ok > silent_s:
            return (f"the launch's rendezvous store at {self.where} stopped answering for {now - self._store_ok:.0f} s: "
                    "the launcher or rank 0 on the first node is gone")
        silent = sorted((r for r in range(self.world_size) if r != self.rank and now - advanced[r] > silent_s),
                        key=lambda r: advanced[r])
        lost = [r for r in silent if not self._following(r)]
        silent = lost or silent  # every silent rank stopped following another: name them, there is no better account
        if not silent:
            return None
        names = ", ".join(str(r) for r in silent)
        whose = "their processes" if len(silent) > 1 else "its process"
        return (f"rank{'s' if len(silent) > 1 else ''} {names} stopped answering (no heartbeat for "
                f"{now - advanced[silent[0]]:.0f} s: {whose} died, or the node is gone): "
                f"rank {self.rank} stops too; resume from the last checkpoint with --resume auto")

    def after_failure(self) -> str | None:
        """Called when a collective failed: `stalled` over 2.5 beats (a live rank's count is seen to
        move at least every 2), one beat after a rank is first that silent, or None when none is
        within 4.5 beats (a dead rank's last beat is seen up to one beat after it died)."""
        silent_s = 2.5 * self.beat_s
        deadline = time.monotonic() + silent_s + 2 * self.beat_s
        while (line := self.stalled(silent_s)) is None and time.monotonic() < deadline:
            time.sleep(self.beat_s / 4)
        if line is not None:  # one beat more: a launcher stops a lost rank's node-mates within a beat or
            time.sleep(self.beat_s)  # two, whose last beats may even precede the lost one's: name them together
            line = self.stalled(silent_s) or line
        return self._verdict(line)


def exit_on_lost_rank(line: str) -> None:
    """The heartbeat's verdict while the main thread waits in a collective that neither returns nor
    fails (NCCL's wait for a dead peer): one `error:` line, then this process ends at once. The run's
    watchdog (`mcp.reaper`) kills its servers; the last finished checkpoint stays intact."""
    sys.stderr.write(f"error: {line}\n")
    sys.stderr.flush()
    os._exit(1)


def narrate_on_rank_0(rank: int) -> None:
    """One rank narrates: on every other rank only warnings and errors are logged, from the first
    line on. The handlers are raised too: DeepSpeed's op checks (distutils' log) set the root
    logger back to INFO."""
    if rank == 0:
        return
    root = logging.getLogger()
    root.setLevel(logging.WARNING)
    for handler in root.handlers:
        handler.setLevel(logging.WARNING)


def skip_cpu_shared_memory_op() -> None:
    """Keep DeepSpeed on the CPU from compiling `deepspeed_shm_comm`: only tensor-parallel inference
    uses it, building it cost ~50 s, and a killed build's lock made every later start wait forever.
    Marked incompatible, the op is left out and gloo reduces."""
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
    heartbeat: Heartbeat | None = field(default=None, compare=False, repr=False)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @classmethod
    def init(cls, device: torch.device, timeout: timedelta | None = None) -> DistContext:
        """Join the process group a launcher describes (RANK/WORLD_SIZE/MASTER_ADDR) with plain
        `torch.distributed` on `device`: NCCL for CUDA, gloo otherwise."""
        narrate_on_rank_0(int(os.environ.get("RANK", 0)))
        local_rank = int(os.environ.get("LOCAL_RANK", 0))
        if device.type == "cuda":
            if device.index is not None and device.index >= torch.cuda.device_count():
                raise UserInputError(f"local rank {local_rank} has no GPU: this node has {torch.cuda.device_count()} "
                                     "(start at most one process per GPU, e.g. torchrun --nproc_per_node N)")
            torch.cuda.set_device(device)  # before NCCL: each rank's communicator on its own GPU
        backend = "nccl" if device.type == "cuda" else "gloo"
        timeout = timeout or collective_timeout()
        if not dist.is_initialized():
            dist.init_process_group(backend=backend, timeout=timeout)
        return cls._joined(local_rank, device, backend, timeout)

    @classmethod
    def init_deepspeed(cls, timeout: timedelta | None = None) -> DistContext:
        """Join the process group through DeepSpeed (full mode): its accelerator picks the device and
        backend, NCCL on GPUs, gloo on CPU (`DS_ACCELERATOR=cpu`), as ZeRO-3 will use them."""
        narrate_on_rank_0(int(os.environ.get("RANK", 0)))  # before DeepSpeed's import-time op checks log
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
        timeout = timeout or collective_timeout()
        if not dist.is_initialized():
            deepspeed.init_distributed(dist_backend=backend, timeout=timeout)
        device = torch.device("cpu") if on_cpu else torch.device(accelerator.device_name(local_rank))
        return cls._joined(local_rank, device, backend, timeout)

    @classmethod
    def _joined(cls, local_rank: int, device: torch.device, backend: str, timeout: timedelta) -> DistContext:
        rank, world_size = dist.get_rank(), dist.get_world_size()
        beat = Heartbeat.from_env(rank, world_size, lost_after_s=timeout.total_seconds(), on_lost=exit_on_lost_rank)
        ctx = cls(rank, world_size, local_rank, device, backend, beat)
        narrate_on_rank_0(rank)
        logger.info("rank %d/%d on %s (%s)", ctx.rank, ctx.world_size, device, backend)
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
            if self.heartbeat is not None:  # every rank is here: none will be missed from now on
                self.heartbeat.stop()
            dist.destroy_process_group()

    def lost_rank(self, error: BaseException) -> str | None:
        """One line naming the rank that stopped answering when `error` (a failed collective: a
        RuntimeError, DeepSpeed's included) came from one, else None (this rank's own fault)."""
        if self.heartbeat is None or not isinstance(error, RuntimeError):
            return None
        return self.heartbeat.after_failure()

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
