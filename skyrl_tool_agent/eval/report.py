"""`report.html`: one self-contained page per evaluation (no network: inline CSS/JS, the difficulty
plot embedded as base64) with the summary, per-difficulty bars, per-database table and a
trajectory viewer (question, turns with tool calls and results, final SQL, reward components)
that can show only the failed episodes.

All text from models, databases and questions is escaped with `html.escape`; the page's script
only hides and shows episodes (see `report_assets`).
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timezone
from html import escape
from pathlib import Path
from typing import Any

from skyrl_tool_agent.eval.compare import comparison_rows
from skyrl_tool_agent.eval.report_assets import CSS, JS, PAGE

#: Longest message text shown per turn (tool results of big queries are cut, with a note).
MAX_MESSAGE_CHARS = 6000
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
_DIFFICULTY_ORDER = ("easy", "medium", "hard", "extra")
_TOOL_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.S)


def _fmt(value: Any, kind: str) -> str:
    if not isinstance(value, (int, float)):
        return "-"
    if kind == "pct":
        return f"{100 * value:.1f}%"
    return f"{value:.{kind[1]}f}" if kind.startswith("f") else str(value)


def _bar(value: Any) -> str:
    width = max(0.0, min(1.0, float(value))) * 100 if isinstance(value, (int, float)) else 0.0
    return f'<span class="bar"><span style="width:{width:.1f}%"></span></span>'


def _sorted_difficulties(names: Iterable[str]) -> list[str]:
    return sorted(names, key=lambda d: (_DIFFICULTY_ORDER.index(d) if d in _DIFFICULTY_ORDER else 99, d))


def _metrics_table(groups: Mapping[str, Mapping[str, Any]], first: str, names: Sequence[str]) -> str:
    head = (f"<tr><th>{escape(first)}</th><th>n</th><th>execution accuracy</th><th></th><th>exact match</th>"
            "<th>valid SQL</th><th>mean turns</th><th>tool calls</th><th>tool error rate</th></tr>")
    rows = []
    for name in names:
        m = groups[name]
        ex = m.get("execution_accuracy")
        rows.append(
            f"<tr><td>{escape(str(name))}</td><td>{int(m.get('n', 0))}</td><td>{_fmt(ex, 'pct')}</td><td>{_bar(ex)}</td>"
            f"<td>{_fmt(m.get('exact_match'), 'pct')}</td><td>{_fmt(m.get('valid_sql_rate'), 'pct')}</td>"
            f"<td>{_fmt(m.get('mean_turns'), 'f2')}</td><td>{_fmt(m.get('mean_tool_calls'), 'f2')}</td>"
            f"<td>{_fmt(m.get('tool_error_rate'), 'pct')}</td></tr>"
        )
    return f"<table>{head}{''.join(rows)}</table>"


def _summary(results: Mapping[str, Any]) -> str:
    cards = [
        f'<div class="card"><div class="v">{_fmt(results.get(k), kind)}</div><div class="k">{escape(label)}</div></div>'
        for k, label, kind in SUMMARY_METRICS[:3]
    ]
    rows = "".join(f"<tr><td>{escape(label)}</td><td>{_fmt(results.get(k), kind)}</td></tr>" for k, label, kind in SUMMARY_METRICS)
    counts = (f"<tr><td>questions</td><td>{results.get('n', 0)}</td></tr><tr><td>episodes</td><td>{results.get('episodes', 0)}</td></tr>"
              f"<tr><td>skipped (no database)</td><td>{results.get('skipped', 0)}</td></tr>")
    return f'<h2>Summary</h2><div class="cards">{"".join(cards)}</div><table>{counts}{rows}</table>'


def _comparison(baseline: Mapping[str, Any] | None, results: Mapping[str, Any]) -> str:
    if not baseline:
        return ""
    rows = []
    for row in comparison_rows(baseline, results):
        delta = row.delta
        cls = "" if not delta else ("pos" if delta > 0 else "neg")
        d = "-" if delta is None else f"{delta:+.3f}"
        b = "-" if row.base is None else f"{row.base:.3f}"
        c = "-" if row.current is None else f"{row.current:.3f}"
        rows.append(f'<tr><td>{escape(row.label)}</td><td>{b}</td><td>{c}</td><td class="{cls}">{d}</td></tr>')
    head = "<tr><th>metric</th><th>baseline</th><th>this run</th><th>delta</th></tr>"
    return f"<h2>Compared with the baseline</h2><table>{head}{''.join(rows)}</table>"


def _pass_at_k(results: Mapping[str, Any]) -> str:
    levels = results.get("pass_at_k") or {}
    if not levels:
        return ""
    rows = "".join(f"<tr><td>pass@{escape(str(k))}</td><td>{_fmt(v, 'pct')}</td><td>{_bar(v)}</td></tr>"
                   for k, v in sorted(levels.items(), key=lambda kv: int(kv[0])))
    return f"<h2>pass@k ({results.get('num_samples')} samples per question)</h2><table>{rows}</table>"


def _image(png: Path | None) -> str:
    if png is None or not Path(png).is_file():
        return ""
    data = base64.b64encode(Path(png).read_bytes()).decode("ascii")
    return f'<img alt="execution accuracy by difficulty" src="data:image/png;base64,{data}">'


def _clip(text: str) -> str:
    if len(text) <= MAX_MESSAGE_CHARS:
        return escape(text)
    return escape(text[:MAX_MESSAGE_CHARS]) + f"\n… ({len(text) - MAX_MESSAGE_CHARS} more characters)"


def tool_names(text: str) -> list[str]:
    """Names of the tools an assistant turn calls (Hermes `<tool_call>` JSON), for the turn label."""
    names = []
    for block in _TOOL_CALL.findall(text):
        try:
            names.append(str(json.loads(block).get("name", "?")))
        except (json.JSONDecodeError, AttributeError):
            names.append("(malformed)")
    return names


def _turns(messages: Sequence[Mapping[str, Any]], system_prompt: str) -> str:
    out = []
    for index, message in enumerate(messages):
        role, content = str(message.get("role", "")), str(message.get("content", ""))
        if role == "system" and content == system_prompt:
            continue
        if role == "assistant":
            calls = tool_names(content)
            who = "assistant" + (f" → {', '.join(calls)}" if calls else "")
            cls = "assistant"
        elif role == "user" and index > 1:  # after the task message, user turns are tool results
            who, cls = "tool results", "tool"
        else:
            who, cls = role, role
        out.append(f'<div class="turn {escape(cls)}"><div class="who">{escape(who)}</div><pre>{_clip(content)}</pre></div>')
    return "".join(out)


def _episode(record: Mapping[str, Any], sample: Mapping[str, Any], system_prompt: str, multi: bool) -> str:
    solved = bool(sample.get("solved"))
    status = "ok" if solved else "failed"
    difficulty = str(record.get("difficulty", ""))
    comps = sample.get("components") or {}
    comp_rows = "".join(f"<tr><td>{escape(str(k))}</td><td>{_fmt(v, 'f3')}</td></tr>" for k, v in comps.items())
    sample_tag = f'<span class="tag">sample {int(sample.get("group_index", 0))}</span>' if multi else ""
    final_sql = sample.get("final_sql")
    outcome = (f"{escape(str(sample.get('done_reason')))}, {sample.get('turns', 0)} turns, {sample.get('tool_calls', 0)} tool calls, "
               f"{sample.get('tool_errors', 0)} tool errors, {sample.get('format_errors', 0)} format errors")
    error = f"<div>error</div><div>{escape(str(sample['error']))}</div>" if sample.get("error") else ""
    return (
        f'<details class="episode {status}" data-failed="{0 if solved else 1}" data-difficulty="{escape(difficulty)}" '
        f'data-task="{escape(str(record.get("task_id", "")))}">'
        f'<summary><span class="badge">{"✓" if solved else "✗"}</span><span class="tid">{escape(str(record.get("task_id", "")))}</span>'
        f'{sample_tag}<span class="tag">{escape(str(record.get("db_id", "")))}</span><span class="tag">{escape(difficulty)}</span>'
        f'<span class="q">{escape(str(record.get("question", "")))}</span><span>reward {_fmt(sample.get("reward"), "f3")}</span></summary>'
        f'<div class="body"><div class="kv"><div>question</div><div>{escape(str(record.get("question", "")))}</div>'
        f"<div>outcome</div><div>{outcome}; exact match: {'yes' if sample.get('exact_match') else 'no'}</div>{error}</div>"
        f"<div class=\"who\">final SQL</div><pre>{escape(final_sql) if final_sql is not None else '(no answer)'}</pre>"
        f"<div class=\"who\">gold SQL</div><pre>{escape(str(record.get('gold_sql', '')))}</pre>"
        f'<div class="who">reward components</div><table class="comp">{comp_rows}</table>'
        f'<div class="who">turns</div>{_turns(sample.get("messages") or [], system_prompt)}</div></details>'
    )


def _shared_system_prompt(records: Sequence[Mapping[str, Any]]) -> str:
    for record in records:
        for sample in record.get("samples", []):
            messages = sample.get("messages") or []
            if messages and messages[0].get("role") == "system":
                return str(messages[0].get("content", ""))
    return ""


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
    parts.append(datetime.now(timezone.utc).strftime("generated %Y-%m-%d %H:%M UTC"))
    return escape(" · ".join(str(p) for p in parts))


def render_report(results: Mapping[str, Any], records: Sequence[Mapping[str, Any]], *,
                  difficulty_png: Path | None = None, baseline: Mapping[str, Any] | None = None) -> str:
    """The report page as a string (see module doc)."""
    system_prompt = _shared_system_prompt(records)
    multi = int(results.get("num_samples", 1) or 1) > 1
    episodes = [_episode(r, s, system_prompt, multi) for r in records for s in r.get("samples", [])]
    failed = sum(1 for r in records for s in r.get("samples", []) if not s.get("solved"))
    by_difficulty = results.get("by_difficulty") or {}
    difficulties = _sorted_difficulties(by_difficulty)
    by_db = results.get("by_db") or {}
    return PAGE.substitute(
        title=escape(f"Evaluation report: {results.get('name', 'evaluation')}"),
        css=CSS,
        js=JS,
        meta=_meta(results),
        summary=_summary(results),
        comparison=_comparison(baseline, results),
        by_difficulty=_metrics_table(by_difficulty, "difficulty", difficulties),
        difficulty_img=_image(difficulty_png),
        pass_at_k=_pass_at_k(results),
        db_count=len(by_db),
        by_db=_metrics_table(by_db, "database", sorted(by_db)),
        system_prompt=_clip(system_prompt),
        difficulty_options="".join(f'<option value="{escape(d)}">{escape(d)}</option>' for d in difficulties),
        total=len(episodes),
        failed=failed,
        episodes="\n".join(episodes),
    )


def write_report(results: Mapping[str, Any], records: Sequence[Mapping[str, Any]], out_html: Path, *,
                 difficulty_png: Path | None = None, baseline: Mapping[str, Any] | None = None) -> Path:
    """Write `render_report(...)` to `out_html` (UTF-8); returns the path."""
    out_html = Path(out_html)
    out_html.parent.mkdir(parents=True, exist_ok=True)
    out_html.write_text(render_report(results, records, difficulty_png=difficulty_png, baseline=baseline), encoding="utf-8")
    return out_html
