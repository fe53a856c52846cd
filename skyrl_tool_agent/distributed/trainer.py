"""`DistributedGRPOTrainer`: the GRPO trainer over data-parallel ZeRO-3 ranks (full mode).

What ZeRO-3 adds to `DataParallelTrainer`: every rank runs as many micro-batches as the largest
shard needs (inert ones pad: every forward all-gathers), and the loss is multiplied by W (DeepSpeed
averages gradients over ranks), so the update equals a single-process update on the whole batch.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from skyrl_tool_agent.config import Config
from skyrl_tool_agent.data.loader import TaskDataLoader
from skyrl_tool_agent.data.tasks import Task
from skyrl_tool_agent.distributed.checkpoint import (
    CheckpointParts,
    load_distributed_checkpoint,
    save_distributed_checkpoint,
)
from skyrl_tool_agent.distributed.data_parallel import DataParallelTrainer
from skyrl_tool_agent.distributed.zero3 import DeepSpeedPolicy
from skyrl_tool_agent.env.pools import EnvRuntime

logger = logging.getLogger(__name__)


class DistributedGRPOTrainer(DataParallelTrainer):
    """`DataParallelTrainer` whose optimizer is a DeepSpeed ZeRO-3 engine over W ranks (module doc)."""

    lockstep_micro_batches = True

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

        # The base class builds AdamW and the LR schedule on the (sharded) parameters; DeepSpeed
        # then wraps that optimizer, and the schedule keeps writing the same param-group dicts.
        super().__init__(config, policy, runtime, loader, eval_tasks, output_dir=output_dir, ctx=policy.ctx)
        engine, *_ = deepspeed.initialize(model=policy.model, optimizer=self.optimizer, config=ds_config)
        policy.attach_engine(engine)
        self.policy: DeepSpeedPolicy = policy
        self.engine = engine
        self.ds_config = ds_config

    # --------------------------------------------------------------- update
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

    # ----------------------------------------------------------- checkpoints
    def save(self) -> Path:
        """DeepSpeed engine state (sharded weights + optimizer), no consolidated export (that is
        final/'s, or `export`'s on request: `distributed.checkpoint`); collective."""
        return save_distributed_checkpoint(self._checkpoint_parts(), self.step,
                                           keep=self.config.training.keep_checkpoints, elapsed_s=self.elapsed_s())

    def resume(self, path: str | None) -> bool:
        """`path` = a checkpoint dir, 'auto' (latest under output_dir, if any) or None; collective."""
        if path is None:
            return False
        restored = load_distributed_checkpoint(self._checkpoint_parts(), path)
        if restored is None:
            return False
        self.step, self.prior_elapsed_s = restored  # the time budget counts across --resume
        return True

    def _checkpoint_parts(self) -> CheckpointParts:
        return CheckpointParts(ctx=self.ctx, engine=self.engine, policy=self.policy, scheduler=self.scheduler,
                               loader=self.loader, root=self.checkpoint_dir, config_yaml=self.config.dump_yaml())
