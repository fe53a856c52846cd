"""A training run's report.html: its latest evaluation against the one before training, with its
rollouts view, headed by the run's state and curves; written by `reports.run_files.RunOutputs`
with `eval_final.json`, `eval_final_trajectories.jsonl` and `eval_final_by_difficulty.png`.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from statistics import mean
from typing import Any

from skyrl_tool_agent.config import Config, UserInputError
from skyrl_tool_agent.data.tasks import Task
from skyrl_tool_agent.eval.evaluate import difficulty_of, scored_run
from skyrl_tool_agent.reports.evaluation import OutputPaths, write_outputs
from skyrl_tool_agent.env.families import resolve_family
from skyrl_tool_agent.reports.html import TrainingRunView
from skyrl_tool_agent.eval.vocabulary import localise, vocabulary
from skyrl_tool_agent.reports.rollouts import ROLLOUTS_FILE, load_rollouts
from skyrl_tool_agent.rollout.collector import CollectorSettings
from skyrl_tool_agent.rollout.trajectory import Trajectory

logger = logging.getLogger(__name__)

#: The report's file name in the run's output directory.
REPORT_FILE = "report.html"


def write_training_report(config: Config, eval_tasks: Sequence[Task], trajectories: Sequence[Trajectory],
                          before: Mapping[str, Any], *, db_root: Path, step: int,
                          run: TrainingRunView | None = None) -> OutputPaths:
    """Write the run's latest evaluation files and report.html into `training.output_dir` (module
    docstring); at `step` 0 the evaluation before training is shown alone."""
    out = config.training.resolved_output_dir()
    family = resolve_family(config.env.task_family).name
    words = vocabulary(family)
    evaluation = scored_run(eval_tasks, trajectories, db_root, family=family)
    results = evaluation.results
    results.update(name="evaluation before training" if step == 0 else f"evaluation after step {step}", policy="model",
                   model_path=str(out / "final"), step=step, temperature=0.0,
                   dataset=config.training.data.dataset, split=config.training.eval_split,
                   max_turns=CollectorSettings.from_config(config, evaluation=True).max_turns)
    # The evaluation before training has per-task outcomes (`solved`), not per-difficulty metrics.
    by_difficulty: dict[str, list[float]] = defaultdict(list)
    for task, solved in zip(eval_tasks, before.get("solved") or []):
        if solved is not None:  # None: never scored (infrastructure error)
            by_difficulty[difficulty_of(task)].append(float(solved))
    # `before` carries its error anatomy (`error_categories` in `eval_tasks` order): the report compares it.
    baseline = {**before, "name": "before training", "dataset": results["dataset"], "split": results["split"],
                "task_ids": [t.task_id for t in eval_tasks],
                "by_difficulty": {d: {words.accuracy: mean(v)} for d, v in by_difficulty.items()}}
    baseline = {**localise(baseline, words), "family": family}
    rollouts = None
    if (out / ROLLOUTS_FILE).is_file():
        try:
            rollouts = load_rollouts(out / ROLLOUTS_FILE)
        except UserInputError as exc:  # a damaged log must not fail a finished run: the report goes without it
            logger.warning("report.html without the training rollouts: %s", exc)
    paths = OutputPaths.beside(out / "eval_final.json", report=out / REPORT_FILE)
    return write_outputs(evaluation, paths, baseline=baseline if step else None, rollouts=rollouts, db_root=db_root,
                         training_run=run)
