"""`report.html`: one self-contained page per evaluation (no network: inline CSS/JS, plots as
base64): summary, comparison with a baseline, per-difficulty and per-database tables, the error
anatomy, and a viewer of the episodes (turns, reward terms, final vs gold SQL with their first rows:
`episodes`); given a training run's rollouts, a "Training rollouts" view. Both viewers filter,
search and sort in the page; a URL fragment sets the filters (`report.html#failed`). Jinja
autoescapes every text (`templates`).
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from markupsafe import Markup

from skyrl_tool_agent.eval.anatomy import CATEGORIES, LABELS
from skyrl_tool_agent.eval.compare import (
    anatomy_comparison,
    baseline_outcomes,
    comparison_rows,
    comparison_warnings,
    outcome_changes,
    sorted_difficulties,
)
from skyrl_tool_agent.reports.episodes import ResultPreviewer, episode, shared_system_prompt
from skyrl_tool_agent.reports.rollouts import rollouts_view
from skyrl_tool_agent.reports.templates import CSS, JS, environment, fmt
from skyrl_tool_agent.eval.vocabulary import SQL_ONLY, vocabulary_of

__all__ = ["SUMMARY_METRICS", "TrainingRunView", "render_report"]


@dataclass(frozen=True)
class TrainingRunView:
    """What heads a training run's report: its state in words (step, minutes, running or why it
    stopped) and its training_curves.png."""

    state: str
    curves_png: Path | None = None

SUMMARY_METRICS: tuple[tuple[str, str, str], ...] = (  # key, label, format
    ("execution_accuracy", "execution accuracy", "pct"),
    ("exact_match", "exact match", "pct"),
    ("valid_sql_rate", "valid SQL", "pct"),
    ("format_ok_rate", "format ok", "pct"),
    ("answered_rate", "answered", "pct"),
    ("reward_mean", "mean reward", "f3"),
    ("mean_turns", "mean turns", "f2"),
    ("mean_tool_calls", "mean tool calls", "f2"),
    ("tool_error_rate", "tool error rate", "pct"),
    ("infra_error_rate", "infra error rate", "pct"),
)

def _summary(results: Mapping[str, Any]) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """(cards, table rows) of the summary."""
    words = vocabulary_of(results)
    metrics = SUMMARY_METRICS if words.sql else [(words.accuracy, words.accuracy_label, "pct"), *(
        m for m in SUMMARY_METRICS[1:] if m[0] not in SQL_ONLY)]
    cards = [(label, fmt(results.get(k), kind)) for k, label, kind in metrics[:3]]
    rows = [("questions", str(results.get("n", 0))), ("episodes", str(results.get("episodes", 0))),
            ("skipped (no database)" if words.sql else "skipped", str(results.get("skipped", 0)))]
    rows += [(label, fmt(results.get(k), kind)) for k, label, kind in metrics]
    rows += [(f"mean reward term: {name}", fmt(value)) for name, value in (results.get("reward_terms") or {}).items()]
    return cards, rows


def _comparison(baseline: Mapping[str, Any] | None, results: Mapping[str, Any], records: Sequence[Mapping[str, Any]],
                ids: Mapping[str, str]) -> dict[str, Any] | None:
    if not baseline:
        return None
    rows = [{"label": row.label, "base": row.base, "current": row.current, "delta": row.delta,
             "cls": {1: "pos", -1: "neg"}.get(row.verdict, "")} for row in comparison_rows(baseline, results)]
    outcomes = baseline_outcomes(baseline)
    name = baseline.get("name")
    return {
        "label": f"the baseline ({name})" if name else "the baseline",
        "base_label": str(name or "baseline"),
        "rows": rows,
        "warnings": comparison_warnings(baseline, results),
        "changes": outcome_changes(outcomes, records) if outcomes is not None else None,
        "anatomy": anatomy_comparison(baseline, records),
        "missing": "Per-question outcomes of the baseline not found (its results.json names a "
                   "_trajectories.jsonl that is not there), so newly solved/broken questions cannot be listed.",
        "ids": ids,
    }


def _anatomy(results: Mapping[str, Any]) -> list[dict[str, Any]] | None:
    """This run's error categories: label, count, share of the wrong answers, rate over scored."""
    anatomy = results.get("error_anatomy")
    if not anatomy:
        return None
    wrong = anatomy.get("wrong") or 0
    return [{"category": c, "label": LABELS[c], "count": anatomy["counts"].get(c, 0),
             "share": anatomy["counts"].get(c, 0) / wrong if wrong else None, "rate": anatomy["rates"].get(c)}
            for c in CATEGORIES]


def _image(png: Path | None) -> str:
    if png is None or not Path(png).is_file():
        return ""
    return "data:image/png;base64," + base64.b64encode(Path(png).read_bytes()).decode("ascii")


def _meta(results: Mapping[str, Any]) -> str:
    parts = [f"policy: {results.get('policy')}"]
    if results.get("model_path"):
        parts.append(f"model: {results['model_path']}")
    if results.get("step") is not None:
        parts.append(f"step {results['step']}")
    parts.append(f"data: {results.get('dataset', '?')}/{results.get('split', '?')}")
    sampling = "greedy" if not results.get("temperature") else f"T={results.get('temperature')}"
    parts.append(f"{results.get('num_samples', 1)} sample(s) per question, {sampling}, max {results.get('max_turns', '?')} turns")
    if isinstance(results.get("seconds"), (int, float)):
        parts.append(f"{results['seconds']:.1f} s")
    parts.append(f"weave: {(results.get('weave') or {}).get('mode', 'n/a')}")
    parts.append(datetime.now(UTC).strftime("generated %Y-%m-%d %H:%M UTC"))
    return " · ".join(str(p) for p in parts)


def _evaluation_view(records: Sequence[Mapping[str, Any]], multi: bool, previewer: ResultPreviewer) -> dict[str, Any]:
    """The evaluated episodes (one per sample) and the viewer's filter options."""
    system_prompt = shared_system_prompt(s.get("messages") or [] for r in records for s in r.get("samples", []))
    items = []
    for record in records:
        for sample in record.get("samples", []):
            outcome = (f"{sample.get('done_reason')}, {sample.get('turns', 0)} turns, {sample.get('tool_calls', 0)} tool "
                       f"calls, {sample.get('tool_errors', 0)} tool errors, {sample.get('format_errors', 0)} format "
                       f"errors" + (f"; exact match: {'yes' if sample.get('exact_match') else 'no'}" if "exact_match" in sample else ""))
            tags = [f"sample {int(sample.get('group_index', 0))}"] if multi else []
            facts = [("outcome", outcome)]
            if sample.get("error_category") in LABELS:
                facts.append(("why wrong", LABELS[sample["error_category"]]))
                tags.append(LABELS[sample["error_category"]])
            items.append(episode(f"e{len(items)}", record, sample, system_prompt=system_prompt, previewer=previewer,
                                 facts=facts, tags=tags))
    return {"episodes": items, "system_prompt": system_prompt,
            "dbs": sorted({str(r.get("db_id", "")) for r in records})}


def render_report(results: Mapping[str, Any], records: Sequence[Mapping[str, Any]], *,
                  difficulty_png: Path | None = None, baseline: Mapping[str, Any] | None = None,
                  rollouts: Sequence[Mapping[str, Any]] | None = None, db_root: Path | None = None,
                  errors_png: Path | None = None, run: TrainingRunView | None = None) -> str:
    """The report page as a string (module docstring). `baseline`: a results.json to compare with;
    `db_root`: for the result rows; `run`: the training run the evaluation belongs to (its state and
    curves head the page).
    """
    previewer = ResultPreviewer(db_root)
    ev = _evaluation_view(records, int(results.get("num_samples", 1) or 1) > 1, previewer)
    ro = rollouts_view(rollouts, previewer) if rollouts else None
    # A question links to its first sample's episode (from the newly solved/broken lists).
    ids: dict[str, str] = {}
    for item in ev["episodes"]:
        ids.setdefault(item["task_id"], item["id"])
    by_difficulty = results.get("by_difficulty") or {}
    cards, summary = _summary(results)
    levels = results.get("pass_at_k") or {}
    return environment().get_template("page.html").render(
        title=f"Evaluation report: {results.get('name', 'evaluation')}",
        css=Markup(CSS),
        js=Markup(JS),
        meta=_meta(results),
        cards=cards,
        summary=summary,
        comparison=_comparison(baseline, results, records, ids),
        by_difficulty=by_difficulty,
        difficulties=sorted_difficulties(by_difficulty),
        image=_image(difficulty_png),
        anatomy=_anatomy(results),
        errors_image=_image(errors_png),
        pass_at_k=sorted(levels.items(), key=lambda kv: int(kv[0])),
        num_samples=results.get("num_samples"),
        by_db=results.get("by_db") or {},
        words=vocabulary_of(results),
        ev=ev,
        failed=sum(1 for item in ev["episodes"] if not item["solved"]),
        ro=ro,
        rows_note=previewer.describe(),  # after the views: it counts their queries
        run=None if run is None else {"state": run.state, "curves": _image(run.curves_png)},
    )

