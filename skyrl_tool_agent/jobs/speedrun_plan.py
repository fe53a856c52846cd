"""What the speedrun does and within what time (`SpeedrunPlan`, the command's flags), its config
overrides and file names, and the arithmetic that splits its budget (`arm_seconds`) and its pool
(`hold_out_rl_pool`). The run itself is `jobs.speedrun`."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from skyrl_tool_agent.config import UserInputError
from skyrl_tool_agent.data.tasks import Task
from skyrl_tool_agent.warmstart.scratch import ModelShape

#: The speedrun's episode and step shape, applied before the user's --set (which wins): the gpu
#: profile's GRPO shape on the CPU profile's environment (a model built in minutes cannot explore
#: Spider without a schema), fp32 everywhere (every arm in one dtype), micro-batches of 32 (a tiny
#: model leaves a GPU idle at 8).
SPEEDRUN_OVERRIDES = (
    "grpo.group_size=16", "training.tasks_per_step=16", "grpo.max_turns=4",
    "env.collector.concurrency=256", "env.sessions_per_server=8",
    "training.eval_samples=8", "training.eval_every=0", "training.probe_tasks=64", "training.probe_every=5",
    "training.checkpoint_every=0", "training.keep_checkpoints=1", "training.time_budget_minutes=null",
    "training.max_steps=100000", "training.rollouts_every=0", "training.wandb.mode=disabled",
    "training.data.train_pool=generated", "model.dtype=float32", "training.micro_batch_size=32",
)

#: Supervised steps of the build on CUDA without `--build-steps` (batches of 64: about the examples
#: the shipped start saw); the build's time cap guards it.
GPU_BUILD_STEPS = 2000

#: Later evaluations are sized as the start's times this (a trained policy may answer differently).
EVAL_SLACK = 1.2
#: Files in the output directory.
RESULT_FILE, TABLE_FILE, CURVES_FILE, METRICS_FILE, LOG_FILE = (
    "speedrun.json", "speedrun.md", "speedrun.png", "grpo_metrics.jsonl", "speedrun.log")


@dataclass
class SpeedrunPlan:
    """What the speedrun does and within what time (the command's flags)."""

    minutes: float = 10.0
    shape: ModelShape = field(default_factory=ModelShape)
    #: Fraction of the budget for the build (oracle episodes + supervised training to the plateau).
    build_share: float = 0.45
    #: Supervised steps of the build: the cosine schedule's fixed length, the time cap only a guard
    #: (None: `GPU_BUILD_STEPS` on CUDA; elsewhere the schedule is fitted to the time cap).
    build_steps: int | None = None
    #: Pool tasks held out of the build for GRPO (and the SFT arm) to train on (`hold_out_rl_pool`).
    rl_pool_tasks: int = 256
    sft_batch_size: int = 64
    #: Oracle episodes of a stratified subset of this many pool tasks (None: the whole pool).
    pool_tasks: int | None = None
    #: Validation tasks the build's curve is measured on (None: the whole split).
    validation_tasks: int | None = None
    build_evaluations: int = 6
    #: Dev evaluations per arm, evenly over its training time (fewer when time is short).
    points: int = 2
    #: Seconds kept free at the end: one GRPO step past a mark, the report's files.
    margin_s: float | None = None

    def check(self) -> None:
        """One `UserInputError` for a plan that cannot run."""
        if self.minutes <= 0:
            raise UserInputError(f"--minutes must be positive, got {self.minutes:g}")
        if not 0 < self.build_share < 1:
            raise UserInputError(f"--build-share must be between 0 and 1, got {self.build_share:g}")
        if reason := self.shape.check():
            raise UserInputError(f"model shape: {reason}")
        for name in ("sft_batch_size", "build_evaluations", "points", "rl_pool_tasks"):
            if getattr(self, name) < 1:
                raise UserInputError(f"--{name.replace('_', '-')} must be at least 1")
        if self.pool_tasks is not None and self.rl_pool_tasks >= self.pool_tasks:
            raise UserInputError(f"--rl-pool-tasks {self.rl_pool_tasks} leaves nothing of --pool-tasks "
                                 f"{self.pool_tasks} for the build")
        for name in ("pool_tasks", "validation_tasks", "build_steps"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise UserInputError(f"--{name.replace('_', '-')} must be at least 1")

    @property
    def margin(self) -> float:
        return self.margin_s if self.margin_s is not None else max(5.0, 0.04 * 60 * self.minutes)


def arm_seconds(remaining_s: float, eval_s: float, points: int, margin_s: float, setup_s: float = 0.0) -> float:
    """Training seconds each arm gets when `remaining_s` must hold both arms' training, `points`
    evaluations each (sized `eval_s` x EVAL_SLACK), the second arm's `setup_s` (model, servers)
    and `margin_s`."""
    return (remaining_s - 2 * points * EVAL_SLACK * eval_s - setup_s - margin_s) / 2


def hold_out_rl_pool(pool: Sequence[Task], n: int, *, seed: int) -> tuple[list[Task], list[Task]]:
    """(build pool, RL pool): `n` tasks of `pool` (a stratified fixed subset) for RL, and the rest less
    every task sharing a gold query with them (the pool rewords queries), so the build never sees
    an RL task's answer. `UserInputError` when nothing is left for the build."""
    from skyrl_tool_agent.data.batching import fixed_subset

    rl = fixed_subset(list(pool), n, seed=seed)
    held = {t.gold_sql for t in rl}
    build = [t for t in pool if t.gold_sql not in held]
    if not build:
        raise UserInputError(f"holding {len(rl)} RL tasks out of {len(pool)} pool tasks leaves none for the build")
    return build, rl
