"""The main job's whole wall time (`training.job_budget_minutes`): load, the probe, the evaluation
before GRPO, GRPO, the evaluation after it (the same tasks), saving and the report.

GRPO's own budget (`training.time_budget_minutes`) counts only GRPO; the evaluations around it cost
what the machine makes them cost. So the job is planned on one clock from its start:

1. the evaluations are sized from the step-0 probe's measured speed: as many eval tasks (a
   stratified subset, the same before and after) as fit two evaluations beside `MIN_GRPO_SHARE`;
2. GRPO gets what is left once the second evaluation and the finish are reserved.

Pure arithmetic on an injectable clock, so a test decides the machine's speed.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from skyrl_tool_agent.config.training import TrainingConfig

#: Seconds kept at the end for the final save, before_after.json, report.html and the plots.
FINISH_RESERVE_S = 30.0
#: The second evaluation is reserved this multiple of the first's measured time (a trained policy
#: may end episodes later; the process is warmer, which helps the other way).
AFTER_EVAL_MARGIN = 1.15
#: The evaluations are sized so that GRPO keeps at least this share of the whole job.
MIN_GRPO_SHARE = 0.35
#: An evaluation episode costs about this many probe episodes (measured on the README's 2-core EPYC:
#: 0.15 s against 0.083 s; dev episodes run longer than the frontier's).
EVAL_VS_PROBE_EPISODE = 1.8
#: Fewer eval tasks than this make a before/after difference noise: the evaluation keeps this
#: many however slow the machine (the GRPO share then shrinks instead).
MIN_EVAL_TASKS = 64


@dataclass
class JobBudget:
    """The plan of one main job over `total_s` seconds from `started` (on `clock`), GRPO capped
    at `grpo_cap_s` (None: no cap of its own)."""

    total_s: float
    grpo_cap_s: float | None
    clock: Callable[[], float] = time.monotonic
    started: float = field(default=-1.0)

    def __post_init__(self) -> None:
        if self.started < 0:
            self.started = self.clock()

    @classmethod
    def for_run(cls, training: TrainingConfig, started: float | None = None) -> JobBudget | None:
        """The plan of a run, counted from `started` (a `time.monotonic()` reading; default now; the
        train command passes its process's start, so imports and data loading count too)."""
        if training.job_budget_minutes is None:
            return None
        return cls(60.0 * training.job_budget_minutes, training.time_budget_s,
                   started=time.monotonic() if started is None else started)

    def spent_s(self) -> float:
        """Seconds of the whole budget spent."""
        return self.clock() - self.started

    def left_s(self) -> float:
        """Seconds of the whole budget not yet spent."""
        return self.total_s - self.spent_s()

    def eval_tasks_that_fit(self, wanted: int, episodes_per_task: int, probe_episode_s: float) -> int:
        """How many of `wanted` eval tasks two evaluations can hold (each task `episodes_per_task`
        episodes at `EVAL_VS_PROBE_EPISODE` x the probe's seconds per episode), leaving GRPO
        `MIN_GRPO_SHARE` and the finish its reserve."""
        room = self.left_s() - FINISH_RESERVE_S - MIN_GRPO_SHARE * self.total_s
        episode_s = EVAL_VS_PROBE_EPISODE * max(probe_episode_s, 1e-9)
        per_task = max(episodes_per_task, 1) * episode_s * (1 + AFTER_EVAL_MARGIN)
        fits = int(room / per_task)
        return max(min(wanted, fits), min(wanted, MIN_EVAL_TASKS))

    def grpo_budget_s(self, before_eval_s: float, grpo_spent_s: float = 0.0) -> float:
        """GRPO's seconds from now (module docstring), at most its own budget less `grpo_spent_s` (a
        resumed run's); never negative."""
        left = self.left_s() - FINISH_RESERVE_S - AFTER_EVAL_MARGIN * before_eval_s
        if self.grpo_cap_s is not None:
            left = min(left, self.grpo_cap_s - grpo_spent_s)
        return max(0.0, left)


def process_start() -> float:
    """This process's start on the `time.monotonic()` clock (now when the system does not say)."""
    try:
        import psutil

        return time.monotonic() - max(0.0, time.time() - psutil.Process().create_time())
    except Exception:  # noqa: BLE001 - no process table: the clock starts now
        return time.monotonic()


def start_line(budget: JobBudget, *, eval_tasks: int, eval_split: str, episodes_per_task: int,
               probe_tasks: int, test_tasks: int = 0) -> str:
    """What the job says when it starts: how long it will take, in words."""
    ends = time.strftime("%H:%M:%S", time.localtime(time.time() + budget.left_s()))
    grpo = "no cap of its own" if budget.grpo_cap_s is None else f"at most {budget.grpo_cap_s / 60:.1f} min"
    sizing = (f"sized to fit from the probe's speed ({probe_tasks} episodes)" if probe_tasks
              else "not sized (training.probe_tasks is 0: nothing measured first)")
    return (f"main job: at most {budget.total_s / 60:.1f} min in all (training.job_budget_minutes), ending by "
            f"{ends}: an evaluation of up to {eval_tasks} {eval_split} tasks"
            + (f" and {test_tasks} test tasks" if test_tasks else "") + f" ({episodes_per_task} episodes each) "
            f"before GRPO and the same tasks after, {sizing}; GRPO gets the time between them ({grpo})")
