"""LoRA / QLoRA over data-parallel ranks: each rank holds the whole policy (a replica), plain
`torch.distributed` joins them (NCCL on GPUs, gloo on CPU), no DeepSpeed.

    torchrun --nproc_per_node 8 training/scripts/train_grpo.py --mode lora ...

Before clipping and the optimizer step the trainable parameters' gradients are summed over the
ranks in one all-reduce, so every replica applies one process's update on the whole batch.
Checkpoints are the single-process ones, written by rank 0, so they resume under any world size.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from skyrl_tool_agent.config import Config
from skyrl_tool_agent.data.loader import TaskDataLoader
from skyrl_tool_agent.data.tasks import Task
from skyrl_tool_agent.distributed.checkpoint import agreed_checkpoint
from skyrl_tool_agent.distributed.comm import DistContext
from skyrl_tool_agent.distributed.data_parallel import DataParallelTrainer
from skyrl_tool_agent.env.pools import EnvRuntime
from skyrl_tool_agent.policy.qwen import QwenPolicy


class ReplicatedPolicy(QwenPolicy):
    """A `QwenPolicy` held whole by every rank of `ctx`; `save` is collective (rank 0 writes)."""

    ctx: DistContext

    @classmethod
    def on_rank(cls, config: Config, ctx: DistContext) -> ReplicatedPolicy:
        """This rank's replica, loaded as a single process loads it (its device: `resolve_device`,
        LOCAL_RANK's GPU under CUDA; QLoRA's 4-bit base included)."""
        policy = cls.from_config(config.model, mode=config.training.mode)
        assert isinstance(policy, ReplicatedPolicy)
        policy.ctx = ctx
        return policy

    def save(self, path: str | Path) -> None:
        """`QwenPolicy.save` on rank 0 (the replicas are identical); every rank calls it and waits."""
        if self.ctx.is_main:
            super().save(path)
        self.ctx.barrier()


class ReplicatedGRPOTrainer(DataParallelTrainer):
    """GRPO over ranks that each hold a `ReplicatedPolicy` (module doc)."""

    def __init__(self, config: Config, policy: ReplicatedPolicy, runtime: EnvRuntime | None,
                 loader: TaskDataLoader | None, eval_tasks: Sequence[Task], *, output_dir: Path) -> None:
        super().__init__(config, policy, runtime, loader, eval_tasks, output_dir=output_dir, ctx=policy.ctx)
        self.policy: ReplicatedPolicy = policy
        # Every rank seeded its LoRA initialisation alike; starting from rank 0's values makes
        # identical replicas a fact rather than an assumption about RNG use before this point.
        self.ctx.broadcast_parameters(policy.trainable_parameters())

    def _optimizer_step(self) -> float | None:
        # The ranks' losses are shares of the whole batch's, so their gradients sum to its gradient.
        self.ctx.sum_gradients(self.policy.trainable_parameters())
        return super()._optimizer_step()

    def save(self) -> Path:
        """The single-process checkpoint, written by rank 0 while the others wait; collective."""
        return Path(self.ctx.broadcast_object(str(super().save()) if self.ctx.is_main else None))

    def resume(self, path: str | None) -> bool:
        """Every rank loads the checkpoint rank 0 chose (`agreed_checkpoint`); collective."""
        if path is None:
            return False
        chosen = agreed_checkpoint(self.ctx, self.checkpoint_dir, path)
        return chosen is not None and super().resume(str(chosen))


class ReplicatedBackend:
    """What `jobs.train.run_training` needs on every rank of a LoRA/QLoRA launch (torchrun,
    accelerate launch, deepspeed): the process group its ranks joined and agreed on
    (`agreement.joined_launch`), and a `ReplicatedGRPOTrainer`."""

    def __init__(self, ctx: DistContext) -> None:
        self.ctx = ctx

    def build_trainer(self, config: Config, runtime: EnvRuntime, loader: TaskDataLoader, eval_tasks: list[Task],
                      out: Path) -> ReplicatedGRPOTrainer:
        policy = ReplicatedPolicy.on_rank(config, self.ctx)
        return ReplicatedGRPOTrainer(config, policy, runtime, loader, eval_tasks, output_dir=out)
