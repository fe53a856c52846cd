"""The single-process backend (LoRA, QLoRA or full, on CPU, MPS or one GPU), beside a launch's
(`replicated.ReplicatedBackend`, `DeepSpeedBackend`): `run_training` is one loop for all of them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from skyrl_tool_agent.config import Config
from skyrl_tool_agent.data.loader import TaskDataLoader
from skyrl_tool_agent.data.tasks import Task


class LocalContext:
    """The process group of a single-process run: rank 0 of 1. A launched run's
    `distributed.comm.DistContext` has the same methods, so `run_training` is one loop for both,
    gated on `is_main` (one writer of files, logs and W&B)."""

    rank = 0
    world_size = 1
    is_main = True

    def barrier(self) -> None:
        pass

    def broadcast_object(self, obj: Any) -> Any:
        return obj

    def close(self) -> None:
        pass


class LocalBackend:
    """Builds a single-process trainer (LoRA, QLoRA or full, on CPU, MPS or one GPU). A launch's
    backends (`distributed`: ReplicatedBackend for LoRA, DeepSpeedBackend for full) have the same two members."""

    def __init__(self) -> None:
        self.ctx = LocalContext()

    def build_trainer(self, config: Config, runtime: Any, loader: TaskDataLoader, eval_tasks: list[Task],
                      out: Path) -> Any:
        from skyrl_tool_agent.grpo.trainer import GRPOTrainer
        from skyrl_tool_agent.policy.qwen import QwenPolicy

        policy = QwenPolicy.from_config(config.model, mode=config.training.mode)
        return GRPOTrainer(config, policy, runtime, loader, eval_tasks, output_dir=out)

