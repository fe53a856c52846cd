"""Baseline vs trained: two results.json side by side, with deltas (`evaluate.py --compare`), and
the questions newly solved and newly broken (from the baseline's per-question outcomes), measured
here; `reports.evaluation` prints them."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from skyrl_tool_agent.config import UserInputError
from skyrl_tool_agent.eval.vocabulary import SQL_ONLY, vocabulary_of

#: (results key, label) compared overall after the family's accuracy (`eval.vocabulary`), in display order.
METRICS: tuple[tuple[str, str], ...] = (
    ("exact_match", "exact match"),
    ("valid_sql_rate", "valid SQL rate"),
    ("format_ok_rate", "format ok rate"),
    ("reward_mean", "mean reward"),
    ("mean_turns", "mean turns"),
    ("mean_tool_calls", "mean tool calls"),
    ("tool_error_rate", "tool error rate"),
)
#: Direction of "better" for the delta colour (None: neither, e.g. turns).
_BETTER: dict[str, int | None] = {"mean turns": None, "mean tool calls": None, "tool error rate": -1}
_DIFFICULTY_ORDER = ("easy", "medium", "hard", "extra")


@dataclass(frozen=True)
class ComparisonRow:
    """One metric of the comparison; a side is None when that run lacks it."""

    label: str
    base: float | None
    current: float | None

    @property
    def delta(self) -> float | None:
        return None if self.base is None or self.current is None else self.current - self.base

    @property
    def verdict(self) -> int:
        """+1 if the change is an improvement, -1 if it is worse, 0 if neither (or no change)."""
        delta, better = self.delta, _BETTER.get(self.label, 1)
        if not delta or better is None:
            return 0
        return 1 if delta * better > 0 else -1


def load_results(path: str | Path) -> dict[str, Any]:
    """A results.json written by `evaluate.py` (UserInputError if missing or not one)."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise UserInputError(f"--compare: no such file: {path}") from exc
    except RecursionError as exc:  # json's C scanner recurses once per nesting level
        raise UserInputError(f"--compare {path}: not a results.json (nested too deeply)") from exc
    except (OSError, ValueError) as exc:  # ValueError: bad JSON, or bytes that are not UTF-8
        raise UserInputError(f"--compare {path}: not a results.json ({exc})") from exc
    if not isinstance(data, dict):
        raise UserInputError(f"--compare {path}: not a results.json (not a JSON object)")
    if (key := vocabulary_of(data).accuracy) not in data:
        raise UserInputError(f"--compare {path}: not a results.json (no {key})")
    files = data.get("files")
    if isinstance(files, dict) and isinstance(files.get("trajectories"), str):
        # Written relative to where that evaluation ran: look beside the results file too.
        trajectories = Path(files["trajectories"])
        if not trajectories.is_file() and (path.parent / trajectories.name).is_file():
            files["trajectories"] = str(path.parent / trajectories.name)
    return data


def _baseline_records(baseline: Mapping[str, Any]) -> list[dict[str, Any]] | None:
    """The per-question records of the JSONL the baseline's results.json names
    (`files.trajectories`); None when it is not there or not readable."""
    path = (baseline.get("files") or {}).get("trajectories")
    if not isinstance(path, str) or not Path(path).is_file():
        return None
    try:
        records = [json.loads(line) for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]
        if not all(isinstance(r, dict) and "task_id" in r for r in records):
            return None
        return records
    except (OSError, ValueError, RecursionError):  # RecursionError: nested too deeply
        return None


def _per_question(baseline: Mapping[str, Any], value: Callable[[Mapping[str, Any]], Any]) -> dict[str, Any] | None:
    """`value` of each of the baseline's per-question records by task id (None values left out),
    from its `task_ids`/`solved` lists or else the JSONL its results.json names; None: neither."""
    ids, solved = baseline.get("task_ids"), baseline.get("solved")
    if isinstance(ids, list) and isinstance(solved, list) and len(ids) == len(solved):
        records = [{"task_id": t, "solved": bool(s), "scored": s is not None} for t, s in zip(ids, solved)]
    elif (records := _baseline_records(baseline)) is None:
        return None
    values = {str(r["task_id"]): value(r) for r in records}
    return {task_id: v for task_id, v in values.items() if v is not None}


def baseline_outcomes(baseline: Mapping[str, Any]) -> dict[str, bool] | None:
    """Whether the baseline solved each question it scored (its first sample), by task id
    (`_per_question`)."""
    return _per_question(baseline, lambda r: bool(r.get("solved")) if r.get("scored", True) else None)


def success_rate(record: Mapping[str, Any]) -> float | None:
    """The share of a question's scored samples that solved it: with k samples (avg@k), what the
    execution accuracy averages; None when none was scored (infrastructure errors)."""
    samples = record.get("samples")
    if isinstance(samples, list) and samples and all(isinstance(s, Mapping) for s in samples):
        scored = [bool(s.get("solved")) for s in samples if s.get("done_reason") != "error"]
        return sum(scored) / len(scored) if scored else None
    return float(bool(record.get("solved"))) if record.get("scored", True) is not False else None


@dataclass(frozen=True)
class OutcomeChanges:
    """Questions of this run whose outcome differs from the baseline's (records of this run);
    `compared`: questions in both runs."""

    newly_solved: list[Mapping[str, Any]]
    newly_broken: list[Mapping[str, Any]]
    compared: int


def outcome_changes(base: Mapping[str, bool], records: Sequence[Mapping[str, Any]]) -> OutcomeChanges:
    """Newly solved / newly broken questions of `records` (per-question records, `solved` = the
    question's first sample solved) against the baseline's outcomes `base`."""
    solved: list[Mapping[str, Any]] = []
    broken: list[Mapping[str, Any]] = []
    compared = 0
    for record in records:
        task_id = str(record.get("task_id"))
        if task_id not in base or record.get("scored") is False:  # unscored on either side: no change
            continue
        compared += 1
        now = bool(record.get("solved"))
        if now and not base[task_id]:
            solved.append(record)
        elif base[task_id] and not now:
            broken.append(record)
    return OutcomeChanges(solved, broken, compared)


def sorted_difficulties(names: Iterable[str]) -> list[str]:
    """Difficulty names in Spider's order (easy, medium, hard, extra), any others after them by name."""
    return sorted(names, key=lambda d: (_DIFFICULTY_ORDER.index(d) if d in _DIFFICULTY_ORDER else 99, d))


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def comparison_rows(base: Mapping[str, Any], current: Mapping[str, Any]) -> list[ComparisonRow]:
    """Overall metrics, pass@k (levels in either run), then accuracy per difficulty, in the task
    family's words (`eval.vocabulary`: execution accuracy and the SQL-only metrics for SQL)."""
    b_words, c_words = vocabulary_of(base), vocabulary_of(current)
    rows = [ComparisonRow(c_words.accuracy_label, _num(base.get(b_words.accuracy)), _num(current.get(c_words.accuracy)))]
    rows += [ComparisonRow(label, _num(base.get(key)), _num(current.get(key))) for key, label in METRICS
             if (key in base or key in current) and (c_words.sql or key not in SQL_ONLY)]
    b_pass, c_pass = base.get("pass_at_k") or {}, current.get("pass_at_k") or {}
    for k in sorted({*b_pass, *c_pass}, key=int):
        rows.append(ComparisonRow(f"pass@{k}", _num(b_pass.get(k)), _num(c_pass.get(k))))
    b_diff, c_diff = base.get("by_difficulty") or {}, current.get("by_difficulty") or {}
    for name in sorted_difficulties({*b_diff, *c_diff}):
        rows.append(ComparisonRow(f"{c_words.short} {name}", _num((b_diff.get(name) or {}).get(b_words.accuracy)),
                                  _num((c_diff.get(name) or {}).get(c_words.accuracy))))
    return rows


def comparison_warnings(base: Mapping[str, Any], current: Mapping[str, Any]) -> list[str]:
    """Why the two runs may not be comparable (different questions, dataset or sampling)."""
    out = [f"{key} differs: {base.get(key)} vs {current.get(key)}"
           for key in ("family", "dataset", "split") if base.get(key) != current.get(key)]
    if base.get("task_ids_sha1") and current.get("task_ids_sha1") and base["task_ids_sha1"] != current["task_ids_sha1"]:
        out.append(f"different question sets (n={base.get('n')} vs n={current.get('n')})")
    if base.get("num_samples", 1) != current.get("num_samples", 1):
        out.append(f"num_samples differs: {base.get('num_samples', 1)} vs {current.get('num_samples', 1)}")
    return out


def run_labels(base_path: str | Path, current_path: str | Path) -> tuple[str, str]:
    """Column names for two results files: the file's stem, or its directory's name for the usual
    `<run>/results.json`; the paths themselves when those are the same."""
    def label(path: Path) -> str:
        return path.parent.name if path.stem == "results" and path.parent.name else path.stem

    b, c = Path(base_path), Path(current_path)
    if label(b) != label(c):
        return label(b), label(c)
    return (str(b), str(c)) if b.resolve() != c.resolve() else (f"{b} (baseline)", f"{c} (this run)")


def paired_change(base: Mapping[str, Any], records: Sequence[Mapping[str, Any]]) -> Any:
    """The execution accuracy's change on the questions both runs scored, paired by question (each
    side's `success_rate`, so avg@k), with its 95% paired-bootstrap interval; None when the
    baseline has no per-question outcomes or no question is shared."""
    from skyrl_tool_agent.eval.stats import paired_bootstrap

    rates = _per_question(base, success_rate)  # the baseline's, by task id
    if rates is None:
        return None
    pairs = [(rates[str(r.get("task_id"))], rate) for r in records
             if str(r.get("task_id")) in rates and (rate := success_rate(r)) is not None]
    if not pairs:
        return None
    return paired_bootstrap([b for b, _ in pairs], [a for _, a in pairs])


def _first_sample_categories(records: Sequence[Mapping[str, Any]]) -> dict[str, tuple[str | None, bool]] | None:
    """(error category of the question's first sample, scored) by task id; None when the records
    were written without the anatomy."""
    out: dict[str, tuple[str | None, bool]] = {}
    for r in records:
        samples = r.get("samples") or []
        if not samples or "error_category" not in samples[0]:
            return None
        out[str(r.get("task_id"))] = (samples[0]["error_category"], r.get("scored") is not False)
    return out


def baseline_categories(baseline: Mapping[str, Any]) -> dict[str, tuple[str | None, bool]] | None:
    """The baseline's error category per question (first sample's) and whether it was scored, by
    task id, from its lists or else its per-question JSONL; None when neither holds the anatomy."""
    ids, cats, solved = baseline.get("task_ids"), baseline.get("error_categories"), baseline.get("solved")
    if isinstance(ids, list) and isinstance(cats, list) and isinstance(solved, list) and len(ids) == len(cats) == len(solved):
        return {str(t): (c, s is not None) for t, c, s in zip(ids, cats, solved)}
    records = _baseline_records(baseline)
    try:
        return None if records is None else _first_sample_categories(records)
    except (KeyError, TypeError, AttributeError):  # samples that are not a list of objects
        return None


@dataclass(frozen=True)
class AnatomyRow:
    """One error category of a comparison: its count on the questions both runs have, before and
    after, and the change of its rate with the paired-bootstrap interval (None: not measurable)."""

    category: str
    label: str
    base: int
    current: int
    change: Any  # stats.PairedDelta | None


def anatomy_comparison(baseline: Mapping[str, Any], records: Sequence[Mapping[str, Any]]) -> list[AnatomyRow] | None:
    """Each error category's rate on both sides (shared questions, first samples) and its paired
    change (`anatomy.anatomy_changes`); None when either side has no anatomy or nothing is shared."""
    from skyrl_tool_agent.eval.anatomy import CATEGORIES, LABELS, anatomy_changes

    base, current = baseline_categories(baseline), _first_sample_categories(records)
    if base is None or current is None:
        return None
    shared = [t for t in current if t in base]
    if not shared:
        return None
    before, after = [base[t][0] for t in shared], [current[t][0] for t in shared]
    before_scored = [0 if base[t][1] else None for t in shared]  # None: never scored, left out
    after_scored = [0 if current[t][1] else None for t in shared]
    changes = anatomy_changes(before, before_scored, after, after_scored)
    return [AnatomyRow(c, LABELS[c], sum(1 for x, s in zip(before, before_scored) if x == c and s is not None),
                       sum(1 for x, s in zip(after, after_scored) if x == c and s is not None), changes.get(c))
            for c in CATEGORIES]
