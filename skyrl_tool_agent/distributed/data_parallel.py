"""`DataParallelTrainer`: what GRPO over W data-parallel ranks does the same way whatever holds the
weights (ZeRO-3 shards in full mode, a whole replica per rank in LoRA mode).

* Rollouts: every rank draws the same task batch from its own copy of the loader (same seed, same
  state), keeps tasks ``rank, rank + W, ...`` and rolls out all `group_size` episodes of each (a
  group never spans ranks). Sampling seeds differ per rank.
* Rewards and advantages: the trajectories are all-gathered back into task-major order, so every
  rank computes the same advantages, curriculum feedback and metrics, and the loaders stay
  identical. Evaluation is split the same way.
* Update: W shards balanced by token count, each rank's loss divided by the whole batch's
  normaliser, so the gradients add up to one process's (how they are added: the subclass's).
* Stopping: rank 0's clock decides the time budget, and a signal on any rank stops every rank,
  after the same step.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from skyrl_tool_agent.config import Config, UserInputError
from skyrl_tool_agent.data.loader import TaskDataLoader
from skyrl_tool_agent.data.tasks import Task
from skyrl_tool_agent.distributed.agreement import check_same_tasks, task_ids_digest
from skyrl_tool_agent.distributed.comm import DistContext
from skyrl_tool_agent.env.pools import EnvRuntime
from skyrl_tool_agent.grpo.batch import TrainBatch, on_device
from skyrl_tool_agent.grpo.interrupts import StopOnSignals
from skyrl_tool_agent.grpo.trainer import GRPOTrainer
from skyrl_tool_agent.policy.qwen import QwenPolicy
from skyrl_tool_agent.policy.sampling_params import SamplingParams
from skyrl_tool_agent.rollout.collector import CollectorSettings
from skyrl_tool_agent.rollout.trajectory import Trajectory


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


class DataParallelTrainer(GRPOTrainer):
    """`GRPOTrainer` whose rollouts, evaluations and update rows are split over `ctx`'s ranks
    (module doc). Subclasses say how gradients meet (`_backward` / `_optimizer_step`)."""

    #: True: every rank runs as many micro-batches as the largest shard (ZeRO-3 gathers in every
    #: forward); False: at least one each, so every rank joins each step's collective.
    lockstep_micro_batches = False

    def __init__(self, config: Config, policy: QwenPolicy, runtime: EnvRuntime | None, loader: TaskDataLoader | None,
                 eval_tasks: Sequence[Task], *, output_dir: Path, ctx: DistContext) -> None:
        if config.training.gradient_accumulation is not None:  # minibatch normalisers would span ranks
            raise UserInputError("training.gradient_accumulation: PPO-style minibatches run in one process only; "
                                 "leave it null under a distributed launcher (one optimizer step per update epoch)")
        super().__init__(config, policy, runtime, loader, eval_tasks, output_dir=output_dir)
        self.ctx = ctx

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
        self.policy.prepare_sampling()  # collective where the weights are sharded: every rank, even one with no tasks
        local = super().collect(mine, group_size, params, settings, on_episode_done) if mine else []
        # Each rank's digest of the whole batch travels with its episodes: a rank that drew other
        # tasks (other task files on its node) would scramble the groups below.
        gathered = ctx.all_gather_object((task_ids_digest(tasks), local))
        check_same_tasks([digest for digest, _ in gathered], self.step)
        out: list[Trajectory] = []
        for i in range(len(tasks)):
            rank, j = i % ctx.world_size, i // ctx.world_size
            out.extend(gathered[rank][1][j * group_size : (j + 1) * group_size])
        return out

    # --------------------------------------------------------------- update
    def _micro_batches(self, batch: TrainBatch, size: int) -> list[TrainBatch]:
        """This rank's balanced shard of `batch` in micro-batches of similar lengths (less padding),
        padded with inert ones: to the largest shard's count under lockstep, else to at least one."""
        lengths = batch.attention_mask.sum(dim=1).tolist()
        shards = balanced_shards(lengths, self.ctx.world_size)
        mine = sorted(shards[self.ctx.rank], key=lambda r: lengths[r])
        micro = [batch.slice(mine[i : i + size]) for i in range(0, len(mine), size)]
        count = max(math.ceil(len(s) / size) for s in shards) if self.lockstep_micro_batches else len(micro)
        micro += [inert_micro_batch(batch) for _ in range(max(1, count) - len(micro))]
        return [on_device(mb, self.policy.device) for mb in micro]

    def _sum_over_workers(self, sums: dict[str, float]) -> dict[str, float]:
        total: dict[str, float] = {}
        for part in self.ctx.all_gather_object(sums):
            for key, value in part.items():
                total[key] = total.get(key, 0.0) + value
        return total

    # ----------------------------------------------------------------- loop
    def _past_deadline(self, deadline: float | None) -> bool:
        # Rank 0's clock decides, so every rank stops (and checkpoints) after the same step.
        return bool(self.ctx.broadcast_object(deadline is not None and time.monotonic() > deadline))

    def _signal_received(self, stop: StopOnSignals) -> str | None:
        # A signal on any rank stops every rank after the same step (and they checkpoint together).
        names = [name for name in self.ctx.all_gather_object(stop.received) if name]
        return names[0] if names else None
