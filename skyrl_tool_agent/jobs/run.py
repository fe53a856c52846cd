"""`open_run`: the one place a job assembles what it runs with (the MCP environment, a policy, a
GRPO trainer and its logger) and the one place that is closed, on every exit path."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from skyrl_tool_agent.config import Config
from skyrl_tool_agent.data.tasks import Task


@dataclass
class GRPOParts:
    """A GRPO trainer's makings: the tasks it trains on (`build_loader`) and is evaluated on, its
    output directory, its backend (`LocalBackend` by default; a launch's on every rank), the
    checkpoint to resume, and whether its W&B run carries the config (the main job's does)."""

    train_tasks: list[Task]
    eval_tasks: Sequence[Task]
    output_dir: Path
    backend: Any = None
    resume: str | None = None
    log_config: bool = True


@dataclass
class Run:
    """An open run: `runtime` (`EnvRuntime`); `policy` when asked for; with GRPO, `trainer` (whose
    policy is `policy`), `logger` (rank 0's `RunLogger`, elsewhere a `NullRunLogger`), `resumed`."""

    runtime: Any
    policy: Any = None
    trainer: Any = None
    logger: Any = None
    resumed: bool = False


@contextlib.contextmanager
def open_run(config: Config, db_root: Path, *, policy_mode: str | None = None,
             grpo: GRPOParts | None = None) -> Iterator[Run]:
    """Start `config.env`'s MCP servers on `db_root`; then load a policy in `policy_mode`, or with
    `grpo` seed every RNG with `training.seed` (the same on every rank), build the trainer, resume
    it and open its logger. On exit the policy's rollout engine stops (its thread joined), the logger
    finishes and the servers stop, however it ended: nothing of the run outlives it."""
    from skyrl_tool_agent.env.pools import EnvRuntime

    with EnvRuntime(config.env, db_root) as runtime:
        run = Run(runtime)
        try:
            if grpo is not None:
                from skyrl_tool_agent.data.loader import build_loader
                from skyrl_tool_agent.distributed.local import LocalBackend
                from skyrl_tool_agent.grpo.checkpoint import seed_everything
                from skyrl_tool_agent.grpo.run_logging import NullRunLogger, RunLogger

                t, backend = config.training, grpo.backend or LocalBackend()
                seed_everything(t.seed)
                run.trainer = backend.build_trainer(config, runtime, build_loader(config, grpo.train_tasks),
                                                    list(grpo.eval_tasks), grpo.output_dir)
                run.policy, run.resumed = run.trainer.policy, run.trainer.resume(grpo.resume)
                logged = {"run_config": config.to_dict(), "resume": run.resumed} if grpo.log_config else {}
                run.logger = (RunLogger(grpo.output_dir, wandb_config=t.wandb, **logged) if backend.ctx.is_main
                              else NullRunLogger())
            elif policy_mode is not None:
                from skyrl_tool_agent.policy.qwen import QwenPolicy

                run.policy = QwenPolicy.from_config(config.model, mode=policy_mode)
            yield run
        finally:
            if run.policy is not None:
                run.policy.release_rollout_engine()
            if run.logger is not None:
                run.logger.finish()
