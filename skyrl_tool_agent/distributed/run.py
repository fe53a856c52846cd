"""`run_full_distributed`: the full-parameter training job on every rank of a DeepSpeed launch.

The same job as `pipeline.run_training` (before/after evaluation on the fixed dev subset,
checkpoints, metrics.jsonl, final/ export, curves), with rank 0 doing the file writing and logging
and every rank taking part in rollouts, evaluation, updates and saves.
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import Any

from skyrl_tool_agent.config import Config, load_deepspeed_config
from skyrl_tool_agent.pipeline import (
    RunSummary,
    build_loader,
    ensure_embedded_model,
    finish_run,
    load_task_splits,
    rl_train_tasks,
    run_eval_tasks,
)

logger = logging.getLogger(__name__)

EVAL_KEYS = ("execution_accuracy", "reward_mean", "format_ok_rate")


class _NoLogger:
    """Stands in for `RunLogger` on ranks other than 0 (one writer per run)."""

    def log(self, metrics: dict[str, Any]) -> None:
        pass

    def log_rollouts(self, records: list[dict[str, Any]]) -> None:
        pass

    def truncate_after(self, step: int) -> None:
        pass

    def finish(self) -> None:
        pass


def deepspeed_config_for(config: Config) -> Any:
    """The DeepSpeed JSON this run uses: the one an `accelerate launch --config_file` names
    (ACCELERATE_DEEPSPEED_CONFIG_FILE), else the config's own (configs/deepspeed_config.json)."""
    accelerate_file = os.environ.get("ACCELERATE_DEEPSPEED_CONFIG_FILE")
    if accelerate_file:
        overrides = [o.text for o in config.sources.overrides_for("deepspeed")]
        return load_deepspeed_config(accelerate_file, overrides, mode=config.training.mode)
    return config.load_deepspeed()


def run_full_distributed(config: Config, *, resume: str | None = None) -> RunSummary | None:
    """Train all parameters with ZeRO-3 on this launch's ranks; returns the summary on rank 0.

    Launch: `deepspeed --num_gpus N training/scripts/train_grpo.py --mode full` (or `accelerate
    launch --config_file configs/accelerate_config.yaml ...`); docs/distributed.md has the recipes.
    """
    from skyrl_tool_agent.distributed.comm import DistContext
    from skyrl_tool_agent.distributed.engine import build_deepspeed_policy, model_hidden_size, resolve_deepspeed_config
    from skyrl_tool_agent.distributed.trainer import DistributedGRPOTrainer
    from skyrl_tool_agent.env.pools import EnvRuntime
    from skyrl_tool_agent.grpo.checkpoint import seed_everything
    from skyrl_tool_agent.grpo.interrupts import TrainingInterrupted
    from skyrl_tool_agent.grpo.run_logging import RunLogger

    ctx = DistContext.init()
    if not ctx.is_main:
        logging.getLogger().setLevel(logging.WARNING)  # one rank narrates
    t = config.training
    out = Path(t.output_dir)
    ds_file = deepspeed_config_for(config)  # validated (ZeRO-3, bf16) before any work
    train_tasks, dev_tasks, db_root = load_task_splits(config)
    if ctx.is_main:
        out.mkdir(parents=True, exist_ok=True)
        ensure_embedded_model(config, train_tasks, dev_tasks, db_root)  # first run only; others wait
        (out / "config.yaml").write_text(config.dump_yaml())
    ctx.barrier()
    eval_tasks = run_eval_tasks(config, train_tasks, dev_tasks, db_root)  # deterministic: same on every rank
    train_tasks = rl_train_tasks(config, train_tasks, dev_tasks, db_root)
    ds_config = resolve_deepspeed_config(ds_file, config, hidden_size=model_hidden_size(config), world_size=ctx.world_size)
    start = time.monotonic()
    runtime = EnvRuntime(config.env, db_root)
    try:
        seed_everything(t.seed)  # the same on every rank: DeepSpeed partitions one initialisation
        policy = build_deepspeed_policy(config, ctx, ds_config)
        loader = build_loader(config, train_tasks)
        trainer = DistributedGRPOTrainer(config, policy, runtime, loader, eval_tasks, output_dir=out, ds_config=ds_config)
        resumed = trainer.resume(resume)
        run_logger: Any = (RunLogger(out, wandb_config=t.wandb, run_config=config.to_dict(), resume=resumed)
                           if ctx.is_main else _NoLogger())
        before_path = out / "before.json"
        reuse_before = ctx.broadcast_object(resumed and before_path.is_file())
        if reuse_before:
            before = json.loads(before_path.read_text())
            run_logger.truncate_after(trainer.step)
        else:
            before = trainer.evaluate()
            if ctx.is_main:
                before_path.write_text(json.dumps(before, indent=1) + "\n")
            run_logger.truncate_after(0)
            run_logger.log({"step": 0, **{f"eval/{k}": before[k] for k in EVAL_KEYS}})
        # The time budget is GRPO's own: it starts after the first evaluation (rank 0's clock decides).
        deadline = time.monotonic() + 60 * t.time_budget_minutes if t.time_budget_minutes else None
        try:
            history = trainer.train(run_logger, on_step=_log_step if ctx.is_main else None, deadline=deadline)
        except TrainingInterrupted:  # its checkpoint is saved; W&B closes the run cleanly, the servers in `finally`
            run_logger.finish()
            raise
        after = trainer.last_eval if history and "eval/execution_accuracy" in history[-1] else trainer.evaluate()
        policy.save(out / "final")
        run_logger.finish()
    finally:
        runtime.close()
    if not ctx.is_main:
        ctx.close()  # waits for rank 0's outputs
        return None
    summary = finish_run(out, before, after, trainer.step, stop_reason=trainer.stop_reason,
                         seconds=time.monotonic() - start, history=history, training_seconds=trainer.train_seconds,
                         config=config)
    ctx.close()
    return summary


def _log_step(metrics: dict[str, Any]) -> None:
    logger.info("step %d: reward %.3f, loss %.4f, kl %.4f, %.1f tokens/s", metrics["step"], metrics["reward/mean"],
                metrics["train/loss"], metrics["train/kl"], metrics["tokens_per_s"])
