"""A training run's evaluations in Weave: with W&B online, each evaluation the trainer makes becomes
a `weave.Evaluation` named `<run>-step-<N>` (each step a version of the run's `weave.Model`),
replaying the episodes the trainer already ran. Offline or disabled, `weave` is never imported and
the run says once where the data would have gone and what to run later.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from skyrl_tool_agent.config import Config
from skyrl_tool_agent.data.tasks import Task
from skyrl_tool_agent.eval.metrics import group_by
from skyrl_tool_agent.eval.weave_setup import WeaveMode, weave_mode
from skyrl_tool_agent.rollout.trajectory import Trajectory

logger = logging.getLogger(__name__)


def evaluation_name(run_name: str, step: int) -> str:
    """The Weave Evaluation of a training run's evaluation after `step` steps (0: before GRPO)."""
    return f"{run_name}-step-{step}"


class StoredEpisodes:
    """An `EpisodeSource` (`weave_eval`) over episodes already run: each task's, in group order."""

    def __init__(self, trajectories: Sequence[Trajectory]) -> None:
        self._by_task = {task_id: sorted(group, key=lambda t: t.group_index)
                         for task_id, group in group_by(trajectories, lambda t: t.task_id).items()}

    async def episodes(self, task_id: str) -> list[Trajectory]:
        return self._by_task.get(task_id, [])


def replay_evaluation(tasks: Sequence[Task], trajectories: Sequence[Trajectory], *, run_name: str, step: int,
                      model_path: str | None, sql: bool) -> dict[str, Any]:
    """Run the `weave.Evaluation` of the greedy episodes `trajectories` of `tasks` (a trainer's
    evaluation after `step` steps) in the current Weave mode (traced when a client is initialised,
    local otherwise); returns Weave's summary. Imports weave."""
    from skyrl_tool_agent.eval.weave_eval import PolicyModel, object_name, run_weave_evaluation

    model = PolicyModel(name=object_name(run_name), policy="model", model_path=model_path, step=step)
    return asyncio.run(run_weave_evaluation(tasks, StoredEpisodes(trajectories), model,
                                            name=evaluation_name(run_name, step), sql=sql))


class TrainingWeave:
    """Where a training run's evaluations go in Weave (module docstring); `later`: the command that
    evaluates the run's model into Weave."""

    def __init__(self, *, mode: WeaveMode, wandb_mode: str, project: str, run_name: str, sql: bool,
                 later: str) -> None:
        self.mode, self.project, self.run_name, self.sql = mode, project, run_name, sql
        if mode == "disabled":
            why = "W&B is offline" if wandb_mode == "offline" else (
                "W&B is disabled" if wandb_mode == "disabled" else "Weave is off (no WANDB_API_KEY, or WEAVE_DISABLED)")
            logger.info("Weave: %s, so this run's evaluations are not traced; online they would be Weave Evaluations "
                        "%s-step-<N> in project %s; to put the trained model there later: %s",
                        why, run_name, project, later)

    def log(self, tasks: Sequence[Task], trajectories: Sequence[Trajectory], step: int, *,
            model_path: Path | None = None) -> dict[str, Any] | None:
        """The Evaluation of the trainer's evaluation after `step` steps (online only; None
        otherwise or when Weave fails: a warning, training goes on)."""
        if self.mode != "online" or not trajectories:
            return None
        from skyrl_tool_agent.eval.weave_eval import weave_session

        with weave_session(self.project, "online") as mode:
            if mode != "online":  # weave.init failed (warned once): the rest of the run is untraced
                self.mode = "disabled"
                return None
            try:
                return replay_evaluation(tasks, trajectories, run_name=self.run_name, step=step,
                                         model_path=None if model_path is None else str(model_path), sql=self.sql)
            except Exception as exc:  # noqa: BLE001 - tracing must never stop training
                logger.warning("Weave Evaluation %s failed (%s: %s); training goes on",
                               evaluation_name(self.run_name, step), type(exc).__name__, exc)
                return None


def training_weave(config: Config, run_logger: Any, eval_tasks: list[Task]) -> Any:
    """The run's `TrainingWeave`, named after the W&B run (else the output directory)."""
    from skyrl_tool_agent.env.families import resolve_family
    from skyrl_tool_agent.eval.vocabulary import vocabulary

    t = config.training
    out = t.resolved_output_dir()
    run_name = getattr(run_logger, "wandb_run_name", None) or out.name
    subset = f" --limit {len(eval_tasks)} --seed {t.seed}" if t.eval_split == "dev" else ""
    later = (f"WANDB_API_KEY=<key> skyrl-tool-agent eval --policy model --model-path {out / 'final'} "
             f"--split {t.eval_split}{subset} --name {run_name}-final")
    return TrainingWeave(mode=weave_mode(t.wandb.mode), wandb_mode=t.wandb.resolved_mode(),
                         project=t.wandb.weave_project(), run_name=run_name,
                         sql=vocabulary(resolve_family(config.env.task_family).name).sql, later=later)
