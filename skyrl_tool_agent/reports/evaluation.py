"""An evaluation's files: results.json, the per-question JSONL, the PNGs and report.html, from an
`eval.evaluate.EvaluationRun`, and its console tables, alone and against a baseline (eval/ runs and
measures; this writes what a person reads)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from skyrl_tool_agent.eval.compare import AnatomyRow, comparison_rows, comparison_warnings, paired_change
from skyrl_tool_agent.eval.evaluate import EvaluationRun
from skyrl_tool_agent.eval.vocabulary import vocabulary_of
from skyrl_tool_agent.reports.html import TrainingRunView, render_report
from skyrl_tool_agent.reports.tables import print_table


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
    """Write results.json, the per-question JSONL, the difficulty and error anatomy PNGs and (if
    `report`) report.html (`reports.html.render_report` takes the other arguments)."""
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
    if report:  # replaced atomically too: a training run rewrites its report while a person may have it open
        write_text_atomically(paths.report, render_report(
            run.results, run.records, difficulty_png=paths.difficulty_png, baseline=baseline, rollouts=rollouts,
            db_root=db_root, errors_png=paths.errors_png if anatomy else None, run=training_run))
    return paths


def print_results(results: dict[str, Any], paths: OutputPaths) -> None:
    """The evaluation's table on the console (overall and per difficulty), pass@k, the endpoint's
    requests, why answers are wrong, and where the files went."""
    from rich.console import Console

    from skyrl_tool_agent.eval.anatomy import LABELS
    from skyrl_tool_agent.eval.metrics import format_rate

    words = vocabulary_of(results)
    columns = ("", "n", "scored", "infra err", words.short, *(("exact", "valid SQL") if words.sql else ()), "turns",
               "tool calls", "tool err")

    def row(name: str, m: dict[str, Any]) -> tuple[str, ...]:  # rates: over the scored episodes (None: none scored)
        sql = (format_rate(m["exact_match"]), format_rate(m.get("valid_sql_rate"))) if words.sql else ()
        return (name, str(m["n"]), f"{m.get('scored', 0):.0f}", f"{m.get('infra_errors', 0):.0f}",
                format_rate(m[words.accuracy]), *sql, format_rate(m["mean_turns"], digits=2),
                format_rate(m["mean_tool_calls"], digits=2), format_rate(m["tool_error_rate"]))

    print_table(f"{results['name']} — {results['policy']} (n={results['n']}, skipped={results['skipped']}, "
                f"{results['seconds']:.1f} s)", columns,
                [row("overall", results), *(row(name, m) for name, m in results["by_difficulty"].items())])
    console = Console()
    for k, v in (results.get("pass_at_k") or {}).items():
        console.print(f"pass@{k}: {format_rate(v)}")
    if endpoint := results.get("endpoint"):
        refused = ", ".join(f"{reason} {n}" for reason, n in (endpoint.get("protocol_errors") or {}).items())
        console.print(f"endpoint {endpoint['base_url']} · model {endpoint['model']} · {endpoint['requests']} requests, "
                      f"{endpoint['retries']} retries, {endpoint['failed_turns']} turns the server could not produce"
                      + (f" · episodes unscored by its answers: {refused}" if refused else ""))
    if anatomy := results.get("error_anatomy"):
        parts = ", ".join(f"{LABELS[c]} {n}" for c, n in anatomy["counts"].items() if n)
        console.print(f"why answers are wrong ({anatomy['wrong']} of {anatomy['scored']} scored): {parts or 'none wrong'}")
    console.print(f"{words.short} {format_rate(results[words.accuracy], results)} · results {paths.results} · trajectories {paths.trajectories}"
                  + (f" · report {paths.report}" if "report" in results.get("files", {}) else ""))


def print_comparison(base: Mapping[str, Any], current: Mapping[str, Any], *, base_label: str = "baseline",
                     current_label: str = "this run", console: Any = None,
                     records: Sequence[Mapping[str, Any]] | None = None) -> None:
    """A rich table: metric | baseline | this run | delta (green up, red down), then the change of
    the headline with its paired-bootstrap interval (given this run's per-question `records`), then
    any warnings."""
    from rich.console import Console

    from skyrl_tool_agent.reports.templates import fmt

    console = console or Console()
    rows = []
    for row in comparison_rows(base, current):
        style = {1: "green", -1: "red"}.get(row.verdict)
        rows.append((row.label, fmt(row.base), fmt(row.current),
                     f"[{style}]{row.delta:+.3f}[/]" if style else fmt(row.delta, "+f3")))
    print_table(f"{base_label} vs {current_label} (n={base.get('n')} / {current.get('n')})",
                ("metric", base_label, current_label, "delta"), rows, console)
    change = paired_change(base, records) if records is not None else None
    if change is not None:
        console.print(f"{vocabulary_of(current).accuracy_label} change ({current_label} - {base_label}): "
                      f"{100 * change.delta:+.1f} points, {100 * change.confidence:.0f}% paired-bootstrap interval "
                      f"[{100 * change.low:+.1f}, {100 * change.high:+.1f}] over {change.n} questions in both"
                      + (f", each the mean of its {samples} samples" if (samples := current.get("num_samples") or 1) > 1
                         else ""))
    elif records is not None:
        console.print(f"no paired interval: {base_label} has no per-question outcomes for these questions")
    for warning in comparison_warnings(base, current):
        console.print(f"[yellow]warning:[/] {warning}")


def print_anatomy(rows: Sequence[AnatomyRow], *, base_label: str = "baseline", current_label: str = "this run") -> None:
    """A rich table: error category | baseline | this run | change of its rate [95% interval], as
    '-2.5 points [-4.1, -0.9]' ('-' where it is not measurable)."""
    print_table("Why answers are wrong (first sample of each question in both runs)",
                ("error", base_label, current_label, "change [95% paired bootstrap]"),
                [(row.label, str(row.base), str(row.current), "-" if (c := row.change) is None else
                  f"{100 * c.delta:+.1f} points [{100 * c.low:+.1f}, {100 * c.high:+.1f}]") for row in rows])
