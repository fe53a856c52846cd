"""`open_run`: the one place a job assembles what it runs with (the MCP environment, a policy, a
GRPO trainer, a run logger) and the one place it is closed, on every exit path.

    with open_run(config, splits.db_root) as run:                       # the environment alone
    with open_run(config, db_root, policy_mode="full") as run:          # + a policy (the SFT arm)
    with open_run(config, db_root, grpo=GRPOParts(...)) as run:         # + a trainer and its logger
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from skyrl_tool_agent.config import Config
from skyrl_tool_agent.data.tasks import Task

if TYPE_CHECKING:
    from skyrl_tool_agent.env.pools import EnvRuntime


@dataclass
class GRPOParts:
    """What a GRPO run's trainer is built from: the tasks it trains on (through `build_loader`) and
    is evaluated on, its output directory, the backend that builds it (`LocalBackend` by default;
    a launch's on every rank), the checkpoint to resume (`GRPOTrainer.resume`), and whether its
    logger carries the run's config (the main job's W&B run does; the arms' do not)."""

    train_tasks: list[Task]
    eval_tasks: Sequence[Task]
    output_dir: Path
    backend: Any = None
    resume: str | None = None
    log_config: bool = True


@dataclass
class Run:
    """An open run: `runtime` always; `policy` when one was asked for; `trainer` (whose policy is
    `policy`), `logger` (rank 0's `RunLogger`, elsewhere a `NullRunLogger`) and `resumed` for GRPO."""

    config: Config
    runtime: EnvRuntime
    policy: Any = None
    trainer: Any = None
    logger: Any = None
    resumed: bool = False


@contextlib.contextmanager
def open_run(config: Config, db_root: Path, *, policy_mode: str | None = None,
             grpo: GRPOParts | None = None) -> Iterator[Run]:
    """Start the MCP servers of `config.env` on `db_root`, then load a policy in `policy_mode`
    (`QwenPolicy.from_config`), or with `grpo` seed every RNG with `training.seed` and build the
    trainer (the same on every rank: LoRA replicas start alike, ZeRO-3 partitions one
    initialisation; a resumed run then restores the checkpoint's RNG states) and its logger.
    On exit the logger finishes (W&B closes the run) and the servers stop, however the body ended."""
    from skyrl_tool_agent.env.pools import EnvRuntime

    with EnvRuntime(config.env, db_root) as runtime:
        run = Run(config, runtime)
        try:
            if grpo is not None:
                run.trainer = _build_trainer(run, grpo)
                run.policy = run.trainer.policy
            elif policy_mode is not None:
                from skyrl_tool_agent.policy.qwen import QwenPolicy

                run.policy = QwenPolicy.from_config(config.model, mode=policy_mode)
            yield run
        finally:
            if run.logger is not None:
                run.logger.finish()


def _build_trainer(run: Run, grpo: GRPOParts) -> Any:
    from skyrl_tool_agent.data.loader import build_loader
    from skyrl_tool_agent.distributed.local import LocalBackend
    from skyrl_tool_agent.grpo.checkpoint import seed_everything
    from skyrl_tool_agent.grpo.run_logging import NullRunLogger, RunLogger

    config, t = run.config, run.config.training
    backend = grpo.backend or LocalBackend()
    seed_everything(t.seed)
    trainer = backend.build_trainer(config, run.runtime, build_loader(config, grpo.train_tasks), list(grpo.eval_tasks),
                                    grpo.output_dir)
    run.resumed = trainer.resume(grpo.resume)
    if not backend.ctx.is_main:
        run.logger = NullRunLogger()
    elif grpo.log_config:
        run.logger = RunLogger(grpo.output_dir, wandb_config=t.wandb, run_config=config.to_dict(), resume=run.resumed)
    else:
        run.logger = RunLogger(grpo.output_dir, wandb_config=t.wandb)
    return trainer
