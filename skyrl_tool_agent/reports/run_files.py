"""A GRPO run's files for a person: while it runs, training_curves.png, metrics_table.md and
report.html (`RunOutputs`); at its end, before_after.json, error_anatomy.png and the model card
(`finish_run`).

The run's report.html (`write_training_report`) shows its latest evaluation against the one before
training, with its rollouts view, headed by the run's state and curves; it is written with
`eval_final.json`, `eval_final_trajectories.jsonl` and `eval_final_by_difficulty.png`.
"""

from __future__ import annotations

import json
import logging
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from statistics import mean
from typing import Any

from skyrl_tool_agent.config import Config, UserInputError
from skyrl_tool_agent.data.tasks import Task
from skyrl_tool_agent.env.families import resolve_family
from skyrl_tool_agent.eval.evaluate import difficulty_of, scored_run
from skyrl_tool_agent.eval.vocabulary import localise, vocabulary
from skyrl_tool_agent.reports.evaluation import OutputPaths, write_outputs
from skyrl_tool_agent.reports.html import TrainingRunView
from skyrl_tool_agent.reports.rollouts import ROLLOUTS_FILE, load_rollouts
from skyrl_tool_agent.reports.tables import (RunSummary, before_after_record, split_record, write_metrics_table,
                                             write_model_card)
from skyrl_tool_agent.rollout.collector import CollectorSettings
from skyrl_tool_agent.rollout.trajectory import Trajectory

logger = logging.getLogger(__name__)

#: The report's file name in the run's output directory.
REPORT_FILE = "report.html"


class RunOutputs:
    """A run's training_curves.png, metrics_table.md and report.html, each with the run's state and
    replaced atomically, rewritten after every evaluation and probe (`after_measurement`) and at
    the end, so a long run shows what it learns while it runs."""

    def __init__(self, config: Config, eval_tasks: list[Task], before: dict[str, Any], db_root: Path) -> None:
        self.config, self.eval_tasks, self.before, self.db_root = config, eval_tasks, before, db_root
        self.out = config.training.resolved_output_dir()

    def write(self, trainer: Any, *, after: dict[str, Any] | None = None, stop_reason: str = "",
              grpo_seconds: float | None = None, test: dict[str, Any] | None = None) -> None:
        """Write the three files for `trainer`'s step and latest evaluation (`after`, default its
        `last_eval`); `stop_reason`: "" while it runs; `test`: the test split's `split_record`."""
        from skyrl_tool_agent.reports.plots import plot_training_curves

        t = self.config.training
        if after is not None:
            evaluated_at = trainer.step
        else:
            after, evaluated_at = ((trainer.last_eval, trainer.last_eval_step) if trainer.last_eval is not None
                                   else (self.before, 0))
        minutes = (trainer.elapsed_s() if grpo_seconds is None else grpo_seconds) / 60
        # the run's state in words, as its curves, table and report carry it
        state = f"step {trainer.step} of {t.max_steps}, {minutes:.1f} min of GRPO, " + (
            f"stopped: {stop_reason}" if stop_reason else "running")
        curves = plot_training_curves(self.out / "metrics.jsonl", self.out / "training_curves.png",
                                      eval_split=t.eval_split, kl_off=self.config.grpo.kl_coef == 0, state=state)
        record = before_after_record(self.before, after, trainer.step, stop_reason=stop_reason,
                                     training_seconds=trainer.train_seconds, test=test)
        write_metrics_table(self.out / METRICS_TABLE_FILE, record, vocabulary(resolve_family(self.config.env.task_family).name),
                            state=state, split=t.eval_split,
                            after_label="after GRPO" if stop_reason else f"step {evaluated_at}")
        if trainer.last_eval_trajectories:  # a resumed run has none until it evaluates: its report stays
            # report.html: the latest evaluation's episodes against `before`, with the run's rollouts.jsonl
            write_training_report(self.config, self.eval_tasks, trainer.last_eval_trajectories, self.before,
                                  db_root=self.db_root, step=evaluated_at, run=TrainingRunView(state, curves))

    def write_during_run(self, trainer: Any, *, stop_reason: str = "") -> None:
        """`write` where a failure to write (a full disk, a file made read-only) must not end the
        training: one warning, and the next evaluation or probe tries again."""
        try:
            self.write(trainer, stop_reason=stop_reason)
        except OSError as exc:
            logger.warning("the run's curves, table and report were not rewritten at step %d (%s: %s)",
                           trainer.step, type(exc).__name__, exc)


#: The before/after table of a run, in its output directory (`RunOutputs`).
METRICS_TABLE_FILE = "metrics_table.md"


def finish_run(out: Path, before: dict[str, Any], after: dict[str, Any], steps: int, *, stop_reason: str,
               seconds: float, training_seconds: float, config: Config,
               test: tuple[dict[str, Any], dict[str, Any]] | None = None) -> RunSummary:
    """Write before_after.json (`before_after_record`; `test`: the test split's evaluations before
    and after), error_anatomy.png and the model card in final/ (the curves, the table and
    report.html: `RunOutputs`)."""
    from skyrl_tool_agent.reports.plots import plot_error_anatomy

    record = before_after_record(before, after, steps, stop_reason=stop_reason, training_seconds=training_seconds,
                                 test=split_record(*test) if test else None)
    (out / "before_after.json").write_text(json.dumps(record, indent=1) + "\n")
    if before.get("error_anatomy") and after.get("error_anatomy"):
        plot_error_anatomy([("before GRPO", before["error_anatomy"]), ("after GRPO", after["error_anatomy"])],
                           out / "error_anatomy.png",
                           title=f"Why answers are wrong ({config.training.eval_split}, greedy)")
    if (out / "final").is_dir():
        write_model_card(out / "final", config, record)
    return RunSummary(before, after, steps, seconds, out, stop_reason, record["execution_accuracy_delta"],
                      family=resolve_family(config.env.task_family).name, sampled_delta=record["avg_at_k_delta"],
                      anatomy_delta=record["error_anatomy_delta"], test=record.get("test"))


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
