"""Baseline vs trained: two results.json side by side, with deltas (`evaluate.py --compare`)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from skyrl_tool_agent.config import UserInputError

#: (results key, label) compared overall, in display order.
METRICS: tuple[tuple[str, str], ...] = (
    ("execution_accuracy", "execution accuracy"),
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


def load_results(path: str | Path) -> dict[str, Any]:
    """A results.json written by `evaluate.py` (UserInputError if missing or not one)."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise UserInputError(f"--compare: no such file: {path}") from exc
    except (OSError, json.JSONDecodeError) as exc:
        raise UserInputError(f"--compare {path}: not a results.json ({exc})") from exc
    if not isinstance(data, dict) or "execution_accuracy" not in data:
        raise UserInputError(f"--compare {path}: not a results.json (no execution_accuracy)")
    return data


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def comparison_rows(base: Mapping[str, Any], current: Mapping[str, Any]) -> list[ComparisonRow]:
    """Overall metrics, pass@k (levels in either run), then execution accuracy per difficulty."""
    rows = [ComparisonRow(label, _num(base.get(key)), _num(current.get(key))) for key, label in METRICS
            if key in base or key in current]
    b_pass, c_pass = base.get("pass_at_k") or {}, current.get("pass_at_k") or {}
    for k in sorted({*b_pass, *c_pass}, key=int):
        rows.append(ComparisonRow(f"pass@{k}", _num(b_pass.get(k)), _num(c_pass.get(k))))
    b_diff, c_diff = base.get("by_difficulty") or {}, current.get("by_difficulty") or {}
    names = sorted({*b_diff, *c_diff}, key=lambda d: (_DIFFICULTY_ORDER.index(d) if d in _DIFFICULTY_ORDER else 99, d))
    for name in names:
        rows.append(ComparisonRow(f"EX {name}", _num((b_diff.get(name) or {}).get("execution_accuracy")),
                                  _num((c_diff.get(name) or {}).get("execution_accuracy"))))
    return rows


def comparison_warnings(base: Mapping[str, Any], current: Mapping[str, Any]) -> list[str]:
    """Why the two runs may not be comparable (different questions, dataset or sampling)."""
    out = []
    for key in ("dataset", "split"):
        if base.get(key) != current.get(key):
            out.append(f"{key} differs: {base.get(key)} vs {current.get(key)}")
    if base.get("task_ids_sha1") and current.get("task_ids_sha1") and base["task_ids_sha1"] != current["task_ids_sha1"]:
        out.append(f"different question sets (n={base.get('n')} vs n={current.get('n')})")
    if base.get("num_samples", 1) != current.get("num_samples", 1):
        out.append(f"num_samples differs: {base.get('num_samples', 1)} vs {current.get('num_samples', 1)}")
    return out


def print_comparison(base: Mapping[str, Any], current: Mapping[str, Any], *, base_label: str = "baseline",
                     current_label: str = "this run", console: Any = None) -> None:
    """A rich table: metric | baseline | this run | delta (green up, red down), then any warnings."""
    from rich.console import Console
    from rich.table import Table

    console = console or Console()
    table = Table(title=f"{base_label} vs {current_label} (n={base.get('n')} / {current.get('n')})")
    table.add_column("metric")
    table.add_column(base_label, justify="right")
    table.add_column(current_label, justify="right")
    table.add_column("delta", justify="right")
    for row in comparison_rows(base, current):
        delta, better = row.delta, _BETTER.get(row.label, 1)
        style = "" if not delta or better is None else ("green" if delta * better > 0 else "red")
        table.add_row(row.label, _fmt(row.base), _fmt(row.current),
                      f"[{style}]{delta:+.3f}[/]" if delta is not None and style else _fmt(delta, signed=True))
    console.print(table)
    for warning in comparison_warnings(base, current):
        console.print(f"[yellow]warning:[/] {warning}")


def _fmt(value: float | None, *, signed: bool = False) -> str:
    if value is None:
        return "-"
    return f"{value:+.3f}" if signed else f"{value:.3f}"
