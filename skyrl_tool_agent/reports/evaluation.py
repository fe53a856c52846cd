"""An evaluation's files: results.json, the per-question JSONL, the PNGs and report.html, from an
`eval.evaluate.EvaluationRun` (eval/ runs and measures; this writes what a person reads)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from skyrl_tool_agent.eval.evaluate import EvaluationRun
from skyrl_tool_agent.eval.vocabulary import vocabulary_of
from skyrl_tool_agent.reports.html import TrainingRunView


@dataclass(frozen=True)
class OutputPaths:
    """Where `write_outputs` puts things; defaults sit next to results.json, named after its stem."""

    results: Path
    trajectories: Path
    report: Path
    difficulty_png: Path
    errors_png: Path  # the error anatomy's bars (SQL evaluations)

    @classmethod
    def beside(cls, results: Path, *, trajectories: Path | None = None, report: Path | None = None) -> OutputPaths:
        stem = results.with_suffix("")
        return cls(results, trajectories or Path(f"{stem}_trajectories.jsonl"), report or Path(f"{stem}_report.html"),
                   Path(f"{stem}_by_difficulty.png"), Path(f"{stem}_errors.png"))


def write_outputs(run: EvaluationRun, paths: OutputPaths, *, baseline: dict[str, Any] | None = None,
                  report: bool = True, rollouts: Sequence[dict[str, Any]] | None = None,
                  db_root: Path | None = None, training_run: TrainingRunView | None = None) -> OutputPaths:
    """Write results.json, the per-question JSONL, the difficulty PNG, the error anatomy's PNG (a
    SQL evaluation: this run's counts, beside the baseline's when it has them) and (if `report`)
    report.html. `baseline` (a previous results.json) adds a comparison to the report, `rollouts` (a training
    run's rollouts.jsonl records) a training rollouts view; `db_root` (the episodes' databases)
    lets it show the first rows of the final and gold queries' results; `training_run` (a training
    run's state and curves) heads the report."""
    from skyrl_tool_agent.reports.atomic import replaced_atomically, write_text_atomically
    from skyrl_tool_agent.reports.plots import plot_accuracy_by_difficulty, plot_error_anatomy

    paths.results.parent.mkdir(parents=True, exist_ok=True)
    anatomy = run.results.get("error_anatomy")
    run.results["files"] = {"trajectories": str(paths.trajectories), "difficulty_png": str(paths.difficulty_png),
                            **({"errors_png": str(paths.errors_png)} if anatomy else {}),
                            **({"report": str(paths.report)} if report else {})}
    title = f"{run.results.get('name', 'evaluation')}: {run.results.get('policy', '')}"
    words = vocabulary_of(run.results)
    plot_accuracy_by_difficulty(run.results["by_difficulty"], paths.difficulty_png, title=title, key=words.accuracy,
                                label=words.accuracy_label)
    if anatomy:
        base_anatomy = (baseline or {}).get("error_anatomy")
        bars = [(str(baseline.get("name") or "baseline"), base_anatomy)] if base_anatomy and baseline else []
        plot_error_anatomy([*bars, ("this run" if bars else str(run.results.get("name", "evaluation")), anatomy)],
                           paths.errors_png, title=f"Why answers are wrong: {title}")
    # Replaced atomically, as the report: a training run rewrites them after each evaluation.
    with replaced_atomically(paths.trajectories) as tmp, tmp.open("w", encoding="utf-8") as f:
        for record in run.records:
            f.write(json.dumps(record, ensure_ascii=False) + "\n")
    write_text_atomically(paths.results, json.dumps(run.results, indent=1, ensure_ascii=False) + "\n")
    if report:
        from skyrl_tool_agent.reports.html import write_report

        write_report(run.results, run.records, paths.report, difficulty_png=paths.difficulty_png, baseline=baseline,
                     rollouts=rollouts, db_root=db_root, errors_png=paths.errors_png if anatomy else None,
                     run=training_run)
    return paths
