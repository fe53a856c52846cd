"""`DistributedGRPOTrainer`: the GRPO trainer over data-parallel ZeRO-3 ranks.

How the work is split (the same GRPO code as LoRA mode runs on every rank):

* Rollouts: every rank draws the same task batch from its own copy of the loader (same seed, same
  state), keeps tasks ``rank, rank + W, ...`` and rolls out all `group_size` episodes of each (a
  group never spans ranks). Sampling seeds differ per rank.
* Rewards and advantages: the trajectories are all-gathered back into task-major order, so every
  rank computes the same group advantages, curriculum feedback and metrics from the whole batch,
  and the loaders stay identical.
* Update: the kept trajectories are split into W shards balanced by token count; each rank runs
  its shard in micro-batches, padded with inert micro-batches (no loss tokens) up to the largest
  shard's count, because ZeRO-3 needs the same number of forward/backward passes on every rank.
  The loss keeps the whole batch's normaliser and is multiplied by W (DeepSpeed averages gradients
  over ranks), so the update equals a single-process update on the whole batch.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from skyrl_tool_agent.config import Config, UserInputError
from skyrl_tool_agent.data.loader import TaskDataLoader
from skyrl_tool_agent.data.tasks import Task
from skyrl_tool_agent.distributed.checkpoint import (
    CheckpointParts,
    load_distributed_checkpoint,
    save_distributed_checkpoint,
)
from skyrl_tool_agent.distributed.engine import DeepSpeedPolicy
from skyrl_tool_agent.env.pools import EnvRuntime
from skyrl_tool_agent.grpo.batch import TrainBatch
from skyrl_tool_agent.grpo.interrupts import StopOnSignals
from skyrl_tool_agent.grpo.trainer import GRPOTrainer, on_device
from skyrl_tool_agent.policy.qwen import SamplingParams
from skyrl_tool_agent.rollout.collector import CollectorSettings
from skyrl_tool_agent.rollout.trajectory import Trajectory

logger = logging.getLogger(__name__)


def balanced_shards(lengths: Sequence[int], parts: int) -> list[list[int]]:
    """Row indices split into `parts` shards of near-equal total length (longest first to the
    lightest shard); deterministic, so every rank computes every rank's shard."""
    shards: list[list[int]] = [[] for _ in range(parts)]
    loads = [0] * parts
    for row in sorted(range(len(lengths)), key=lambda r: (-lengths[r], r)):
        target = min(range(parts), key=lambda p: (loads[p], len(shards[p]), p))
        shards[target].append(row)
        loads[target] += lengths[row]
    return shards


def inert_micro_batch(batch: TrainBatch) -> TrainBatch:
    """The batch's shortest row with no loss tokens: a forward/backward that adds nothing."""
    row = int(batch.attention_mask.sum(dim=1).argmin())
    mb = batch.slice([row])
    mb.loss_mask = torch.zeros_like(mb.loss_mask)
    mb.advantages = torch.zeros_like(mb.advantages)
    return mb


class DistributedGRPOTrainer(GRPOTrainer):
    """`GRPOTrainer` whose optimizer is a DeepSpeed ZeRO-3 engine over W ranks (module doc)."""

    def __init__(
        self,
        config: Config,
        policy: DeepSpeedPolicy,
        runtime: EnvRuntime | None,
        loader: TaskDataLoader | None,
        eval_tasks: Sequence[Task],
        *,
        output_dir: Path,
        ds_config: dict[str, Any],
    ) -> None:
        import deepspeed

        if config.training.gradient_accumulation is not None:  # minibatch normalisers would span ranks
            raise UserInputError("training.gradient_accumulation: PPO-style minibatches run in one process only; "
                                 "leave it null under DeepSpeed (one optimizer step per update epoch)")
        # The base class builds AdamW and the LR schedule on the (sharded) parameters; DeepSpeed
        # then wraps that optimizer, and the schedule keeps writing the same param-group dicts.
        super().__init__(config, policy, runtime, loader, eval_tasks, output_dir=output_dir)
        engine, *_ = deepspeed.initialize(model=policy.model, optimizer=self.optimizer, config=ds_config)
        policy.attach_engine(engine)
        self.policy: DeepSpeedPolicy = policy
        self.engine = engine
        self.ctx = policy.ctx
        self.ds_config = ds_config

    # ------------------------------------------------------------- rollouts
    def collect(self, tasks: Sequence[Task], group_size: int, params: SamplingParams,
                settings: CollectorSettings | None = None,
                on_episode_done: Callable[[Trajectory], None] | None = None) -> list[Trajectory]:
        """This rank's share of `tasks` rolled out, then everyone's, in task-major order
        (`on_episode_done`: this rank's episodes)."""
        ctx = self.ctx
        mine = list(tasks[ctx.rank :: ctx.world_size])
        # Same step seed on every rank (set by train_step), offset so ranks sample independently.
        torch.manual_seed(torch.initial_seed() + 1_000_003 * ctx.rank)
        local = super().collect(mine, group_size, params, settings, on_episode_done) if mine else []
        self.policy.finish_generation()
        gathered = ctx.all_gather_object(local)
        out: list[Trajectory] = []
        for i in range(len(tasks)):
            rank, j = i % ctx.world_size, i // ctx.world_size
            out.extend(gathered[rank][j * group_size : (j + 1) * group_size])
        return out

    # --------------------------------------------------------------- update
    def _micro_batches(self, batch: TrainBatch, size: int) -> list[TrainBatch]:
        lengths = batch.attention_mask.sum(dim=1).tolist()
        shards = balanced_shards(lengths, self.ctx.world_size)
        count = max(1, max(math.ceil(len(s) / size) for s in shards))
        mine = sorted(shards[self.ctx.rank], key=lambda r: lengths[r])  # similar lengths: less padding
        micro = [batch.slice(mine[i : i + size]) for i in range(0, len(mine), size)]
        micro += [inert_micro_batch(batch) for _ in range(count - len(micro))]
        return [on_device(mb, self.policy.device) for mb in micro]

    def _backward(self, loss: torch.Tensor, *, last: bool) -> None:
        # One optimizer step after the last micro-batch, however many there are.
        self.engine.set_gradient_accumulation_boundary(last)
        # The loss is already divided by the whole batch's normaliser; DeepSpeed averages the
        # ranks' gradients, so scale by W to get their sum.
        self.engine.backward(loss * self.ctx.world_size, scale_wrt_gas=False)

    def _optimizer_step(self) -> float | None:
        self.engine.step()  # clips to gradient_clipping (= training.max_grad_norm), steps, zeroes
        norm = self.engine.get_global_grad_norm()
        if self.config.training.max_grad_norm <= 0 or norm is None:
            return None
        return float(norm)

    def _sum_over_workers(self, sums: dict[str, float]) -> dict[str, float]:
        total: dict[str, float] = {}
        for part in self.ctx.all_gather_object(sums):
            for key, value in part.items():
                total[key] = total.get(key, 0.0) + value
        return total

    def _past_deadline(self, deadline: float | None) -> bool:
        # Rank 0's clock decides, so every rank stops (and checkpoints) after the same step.
        return bool(self.ctx.broadcast_object(deadline is not None and time.monotonic() > deadline))

    def _signal_received(self, stop: StopOnSignals) -> str | None:
        # A signal on any rank stops every rank after the same step (each saves its shard).
        names = [name for name in self.ctx.all_gather_object(stop.received) if name]
        return names[0] if names else None

    # ----------------------------------------------------------- checkpoints
    def save(self) -> Path:
        """DeepSpeed engine state (sharded weights + optimizer) plus a consolidated 16-bit
        `save_pretrained` export; collective."""
        return save_distributed_checkpoint(self._checkpoint_parts(), self.step,
                                           keep=self.config.training.keep_checkpoints)

    def resume(self, path: str | None) -> bool:
        """`path` = a checkpoint dir, 'auto' (latest under output_dir, if any) or None; collective."""
        if path is None:
            return False
        step = load_distributed_checkpoint(self._checkpoint_parts(), path)
        if step is None:
            return False
        self.step = step
        return True

    def _checkpoint_parts(self) -> CheckpointParts:
        return CheckpointParts(ctx=self.ctx, engine=self.engine, policy=self.policy, scheduler=self.scheduler,
                               loader=self.loader, root=self.checkpoint_dir)
