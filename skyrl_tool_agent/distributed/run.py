"""`DeepSpeedBackend`: what `jobs.train.run_training` needs on every rank of a DeepSpeed launch: the
process group, the DeepSpeed config validated before any work, the ZeRO-3 policy and
`DistributedGRPOTrainer`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from skyrl_tool_agent.config import Config, load_deepspeed_config
from skyrl_tool_agent.data.loader import TaskDataLoader
from skyrl_tool_agent.data.tasks import Task
from skyrl_tool_agent.distributed.agreement import agree_on_launch
from skyrl_tool_agent.distributed.comm import DistContext, collective_timeout
from skyrl_tool_agent.distributed.zero3 import build_deepspeed_policy, model_hidden_size, resolve_deepspeed_config
from skyrl_tool_agent.distributed.trainer import DistributedGRPOTrainer
from skyrl_tool_agent.env.pools import EnvRuntime


def deepspeed_config_for(config: Config) -> Any:
    """The DeepSpeed JSON this run uses: the one an `accelerate launch --config_file` names
    (ACCELERATE_DEEPSPEED_CONFIG_FILE), else the config's own (configs/deepspeed_config.json)."""
    accelerate_file = os.environ.get("ACCELERATE_DEEPSPEED_CONFIG_FILE")
    if accelerate_file:
        overrides = [o.text for o in config.sources.overrides_for("deepspeed")]
        return load_deepspeed_config(accelerate_file, overrides, mode=config.training.mode)
    return config.load_deepspeed()


class DeepSpeedBackend:
    """Full-parameter ZeRO-3 training on this launch's ranks (`deepspeed --num_gpus N
    training/scripts/train_grpo.py --mode full`, or `accelerate launch --config_file
    configs/accelerate_config.yaml ...`; docs/distributed.md has the recipes)."""

    def __init__(self, config: Config) -> None:
        self.ctx = DistContext.init_deepspeed(collective_timeout(config.training.collective_timeout_minutes))
        self.ds_file = deepspeed_config_for(config)  # validated (ZeRO-3, bf16) before any work
        agree_on_launch(self.ctx, config, self.ds_file.model_dump(mode="json"))

    def build_trainer(self, config: Config, runtime: EnvRuntime, loader: TaskDataLoader, eval_tasks: list[Task],
                      out: Path) -> DistributedGRPOTrainer:
        ds_config = resolve_deepspeed_config(self.ds_file, config, hidden_size=model_hidden_size(config),
                                             world_size=self.ctx.world_size)
        policy = build_deepspeed_policy(config, self.ctx, ds_config)
        return DistributedGRPOTrainer(config, policy, runtime, loader, eval_tasks, output_dir=out, ds_config=ds_config)
