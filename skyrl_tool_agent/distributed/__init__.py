"""Full-parameter training over several processes with DeepSpeed ZeRO-3 (`--mode full` under
`deepspeed` or `accelerate launch`). docs/distributed.md has the launch recipes and memory figures.

* `comm`        process group (NCCL on GPUs, gloo on CPU) and lockstep generation rounds
* `engine`      resolved DeepSpeed config, sharded model + reference, `DeepSpeedPolicy`
* `trainer`     `DistributedGRPOTrainer`: task sharding, gathered rewards, balanced update shards
* `checkpoint`  engine checkpoints + consolidated 16-bit export, resume
* `run`         `run_full_distributed`, what train_grpo.py calls on every rank

Nothing here is imported by single-process runs; DeepSpeed is imported only when used.
"""

from __future__ import annotations

from typing import Any


def run_full_distributed(config: Any, *, resume: str | None = None) -> Any:
    """See `skyrl_tool_agent.distributed.run.run_full_distributed`."""
    from skyrl_tool_agent.config import require_extra

    require_extra("deepspeed", "deepspeed", "training.mode=full under a launcher (DeepSpeed ZeRO-3)")
    from skyrl_tool_agent.distributed.run import run_full_distributed as run

    return run(config, resume=resume)


__all__ = ["run_full_distributed"]
