"""Training over several processes: LoRA/QLoRA replicas over plain `torch.distributed`, and
full-parameter training with DeepSpeed ZeRO-3, each started by a launcher that sets WORLD_SIZE
(`torchrun`, `accelerate launch`, `deepspeed`). docs/distributed.md has the recipes and memory figures.

* `comm`           process group (NCCL on GPUs, gloo on CPU), gradient sums, heartbeats (who stopped answering)
* `agreement`      what the ranks must agree on (settings, model files, output directory, task stream)
* `data_parallel`  `DataParallelTrainer`: task sharding, gathered rewards, balanced update shards
* `replicated`     LoRA/QLoRA: `ReplicatedBackend`, a whole policy per rank, gradients all-reduced
* `zero3`          full mode: resolved DeepSpeed config, ZeRO-3 sharded model + reference, `DeepSpeedPolicy`
* `trainer`        full mode: `DistributedGRPOTrainer` (ZeRO-3 engine)
* `checkpoint`     full mode's engine checkpoints + consolidated 16-bit export; the agreed resume point
* `run`            `DeepSpeedBackend`; the backends are what `jobs.train.run_training` runs on every rank

Nothing here is imported by single-process runs; DeepSpeed is imported only by full mode.
"""

from __future__ import annotations

from typing import Any


def deepspeed_backend(config: Any) -> Any:
    """`skyrl_tool_agent.distributed.run.DeepSpeedBackend(config)`, with a one-line error naming the
    pip extra when DeepSpeed is not installed."""
    from skyrl_tool_agent.config import require_extra

    require_extra("deepspeed", "deepspeed", "training.mode=full under a launcher (DeepSpeed ZeRO-3)")
    from skyrl_tool_agent.distributed.run import DeepSpeedBackend

    return DeepSpeedBackend(config)


__all__ = ["deepspeed_backend"]
