"""One episode as report.html shows it (evaluated samples and training rollouts alike), as plain data
the autoescaped templates turn into HTML, with the `data-*` attributes the page's script reads, and
its final vs gold SQL: a word-level diff, and the first rows of both results (`ResultPreviewer`).

The diff is over SQL tokens (quoted literals and identifiers stay whole), compared without regard
to keyword/identifier case or spacing, and rendered as HTML with every token escaped.

The result rows are computed when the report is written, only through `rewards.limits.run_bounded`,
on the file the SQLite MCP server would open for the db_id (`data.databases.DatabaseRoot`), so a
crafted rollouts file reads no database outside the root. A total time budget bounds a report's
queries; a preview not run, or a database not served, is said in the page instead of rows.
"""

from __future__ import annotations

import difflib
import json
import re
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from markupsafe import Markup, escape

from mcp_tools.sandbox import SandboxError
from skyrl_tool_agent.data.databases import DatabaseRoot, UnservedDatabaseError
from skyrl_tool_agent.env.chat_format import TOOL_CALL_CLOSE, TOOL_CALL_OPEN
from skyrl_tool_agent.rewards.limits import database_fault, run_bounded

#: Rows of each result shown in the page.
RESULT_ROWS = 5
#: Rows fetched to say how many a result has ("37 rows"; beyond this: "100+ rows").
COUNT_ROWS = 100
#: Result columns shown (the rest are counted).
MAX_COLUMNS = 12
#: Characters shown per cell.
MAX_CELL_CHARS = 80
#: Deadline of one query (the sandbox's own deadline; a wall-clock bound follows it).
QUERY_TIMEOUT_S = 2.0
#: Time all the queries of one report may take together.
TIME_BUDGET_S = 60.0

# A quoted literal or identifier (unterminated ones too: model SQL can be cut off), a word, a
# two-character operator, or any other single character.
_TOKEN = re.compile(r"""'(?:[^']|'')*'?|"(?:[^"]|"")*"?|`[^`]*`?|\[[^\]]*\]?|\w+|<=|>=|<>|!=|==|\|\||\S""")


def _spaced_tokens(sql: str) -> list[tuple[str, bool]]:
    """(token, whether whitespace precedes it in `sql`): the diff is shown spaced as written."""
    return [(m.group(0), m.start() > 0 and sql[m.start() - 1].isspace()) for m in _TOKEN.finditer(sql)]


def _key(token: str) -> str:
    # Quoted string literals keep their case ('Paris' != 'paris'); everything else is case-blind.
    return token if token[:1] == "'" else token.lower()


def _join(tokens: list[tuple[str, bool, str]]) -> Markup:
    """(token, space before it, css class or '') -> escaped HTML."""
    out: list[Markup] = []
    for token, space, cls in tokens:
        if out and space:
            out.append(Markup(" "))
        out.append(Markup('<span class="{}">{}</span>').format(cls, token) if cls else escape(token))
    return Markup("").join(out)


@dataclass(frozen=True)
class SqlDiff:
    """`html`: the final query with gold-only tokens struck (class `gold-only`) and final-only ones
    marked (class `final-only`); `same`: no token differs."""

    html: Markup
    same: bool


def sql_diff(final_sql: str | None, gold_sql: str) -> SqlDiff:
    """Word-level diff of `final_sql` against `gold_sql` (module docstring); no answer = all gold struck."""
    gold, final = _spaced_tokens(gold_sql), _spaced_tokens(final_sql or "")
    matcher = difflib.SequenceMatcher(None, [_key(t) for t, _ in gold], [_key(t) for t, _ in final], autojunk=False)
    marked: list[tuple[str, bool, str]] = []
    for op, g0, g1, f0, f1 in matcher.get_opcodes():
        if op == "equal":
            marked.extend((t, space, "") for t, space in final[f0:f1])
            continue
        marked.extend((t, space, "gold-only") for t, space in gold[g0:g1])
        marked.extend((t, space, "final-only") for t, space in final[f0:f1])
    return SqlDiff(_join(marked), same=all(cls == "" for _, _, cls in marked))


@dataclass(frozen=True)
class QueryPreview:
    """The first rows of one query's result, or why there are none.

    `note` is set when the query was not run (no database, budget spent) or failed (`failed`).
    """

    columns: list[str] = field(default_factory=list)
    rows: list[list[Any]] = field(default_factory=list)
    total: int = 0
    total_capped: bool = False  # more rows than COUNT_ROWS exist
    hidden_columns: int = 0
    note: str | None = None
    failed: bool = False

    @property
    def summary(self) -> str:
        if self.note is not None:
            return self.note
        count = f"{self.total}{'+' if self.total_capped else ''} row{'' if self.total == 1 else 's'}"
        shown = f", first {len(self.rows)} shown" if len(self.rows) < self.total or self.total_capped else ""
        cols = f", {self.hidden_columns} more columns not shown" if self.hidden_columns else ""
        return count + shown + cols


def _cell(value: Any) -> Any:
    """A cell as shown: None stays None (the template writes NULL), text is clipped."""
    if value is None or isinstance(value, (int, float)):
        return value
    text = value.hex() if isinstance(value, bytes) else str(value)
    return text if len(text) <= MAX_CELL_CHARS else text[:MAX_CELL_CHARS] + "…"


class ResultPreviewer:
    """Runs a report's queries (sandboxed, bounded, memoised per database and SQL; module docstring).

    `db_root`: the Spider-layout directory of the episodes' databases (None: rows are not shown,
    and the page says so).
    """

    def __init__(self, db_root: str | Path | None) -> None:
        self.db_root = Path(db_root) if db_root is not None else None
        self._databases: DatabaseRoot | None = None  # the server's listing, read at the first preview
        self.spent_s = 0.0
        self.skipped = 0  # previews not run because the budget was spent
        self._memo: dict[tuple[str, str], QueryPreview] = {}

    def preview(self, db_id: str, sql: str | None) -> QueryPreview:
        """The first `RESULT_ROWS` rows of `sql` on database `db_id` (module docstring)."""
        if sql is None:
            return QueryPreview(note="no answer")
        if self.db_root is None:
            return QueryPreview(note="database not available: no database directory was given to the report")
        key = (db_id, sql)
        if key not in self._memo:
            if self._databases is None:
                self._databases = DatabaseRoot(self.db_root)
            try:
                path = self._databases.path(db_id)
            except UnservedDatabaseError as exc:
                return self._memo.setdefault(key, QueryPreview(note=f"database not available: {exc}"))
            preview = self._run(path, sql)
            if preview.note is not None and preview.note.startswith("not run"):
                return preview  # not memoised: it was never tried
            self._memo[key] = preview
        return self._memo[key]

    def _run(self, path: Path, sql: str) -> QueryPreview:
        if self.spent_s >= TIME_BUDGET_S:
            self.skipped += 1
            return QueryPreview(note=f"not run: the report's {TIME_BUDGET_S:g} s for queries were spent")
        start = time.monotonic()
        try:
            result = run_bounded(path, sql, timeout_s=QUERY_TIMEOUT_S, max_rows=COUNT_ROWS)
        except SandboxError as exc:
            fault = database_fault(exc)
            if fault is not None:
                return QueryPreview(note=f"database not available: {fault}")
            return QueryPreview(note=f"error ({exc.kind}): {exc}", failed=True)
        finally:
            self.spent_s += time.monotonic() - start
        keep = min(len(result.columns), MAX_COLUMNS)
        return QueryPreview(
            columns=list(result.columns[:keep]),
            rows=[[_cell(v) for v in row[:keep]] for row in result.rows[:RESULT_ROWS]],
            total=result.row_count, total_capped=result.truncated,
            hidden_columns=len(result.columns) - keep + result.omitted_columns,
        )

    def sql_panel(self, db_id: str, final_sql: str | None, gold_sql: str) -> dict[str, Any]:
        """What the page shows for one episode: the diff, both queries and both previews."""
        return {"diff": sql_diff(final_sql, gold_sql), "final": final_sql, "gold": gold_sql,
                "final_rows": self.preview(db_id, final_sql), "gold_rows": self.preview(db_id, gold_sql)}

    def describe(self) -> str:
        """One line for the page: where the rows come from and what was left out."""
        if self.db_root is None:
            return "Result rows: no database directory was given, so no query was run."
        text = (f"Result rows computed when this report was written, from {self.db_root}, in the read-only "
                f"sandbox ({QUERY_TIMEOUT_S:g} s per query; {self.spent_s:.1f} s in all)")
        if self.skipped:
            text += f"; {self.skipped} previews not run (the {TIME_BUDGET_S:g} s budget was spent)"
        return text + "."


#: Longest message text shown per turn (tool results of big queries are cut, with a note).
MAX_MESSAGE_CHARS = 6000
_TOOL_CALL = re.compile(rf"{re.escape(TOOL_CALL_OPEN)}\s*(.*?)\s*{re.escape(TOOL_CALL_CLOSE)}", re.DOTALL)


def clip(text: str) -> str:
    """`text`, cut to MAX_MESSAGE_CHARS with a note of how much was left out."""
    if len(text) <= MAX_MESSAGE_CHARS:
        return text
    return text[:MAX_MESSAGE_CHARS] + f"\n… ({len(text) - MAX_MESSAGE_CHARS} more characters)"


def tool_names(text: str) -> list[str]:
    """Names of the tools an assistant turn calls (Hermes `<tool_call>` JSON), for the turn label."""
    names = []
    for block in _TOOL_CALL.findall(text):
        try:
            names.append(str(json.loads(block).get("name", "?")))
        except (json.JSONDecodeError, AttributeError):
            names.append("(malformed)")
    return names


def shared_system_prompt(conversations: Iterable[Sequence[Mapping[str, Any]]]) -> str:
    """The first conversation's system message (shown once per view, not per episode)."""
    for messages in conversations:
        if messages and messages[0].get("role") == "system":
            return str(messages[0].get("content", ""))
    return ""


def turns(messages: Sequence[Mapping[str, Any]], system_prompt: str) -> list[dict[str, str]]:
    """(css class, label, text) per message; the shared system prompt is left out."""
    out = []
    for index, message in enumerate(messages):
        role, content = str(message.get("role", "")), str(message.get("content", ""))
        if role == "system" and content == system_prompt:
            continue
        if role == "assistant":
            calls = tool_names(content)
            who, cls = "assistant" + (f" → {', '.join(calls)}" if calls else ""), "assistant"
        elif role == "user" and index > 1:  # after the task message, user turns are tool results
            who, cls = "tool results", "tool"
        else:
            who, cls = role, role if role in ("system", "user") else "other"
        out.append({"cls": cls, "who": who, "text": clip(content)})
    return out


def reward_terms(record: Mapping[str, Any]) -> dict[str, Any]:
    """The reward's named terms, whatever keys the record carries (`reward_terms` or `components`)."""
    terms = record.get("reward_terms")
    if terms is None:
        terms = record.get("components")
    return dict(terms) if isinstance(terms, Mapping) else {}


def _number(value: Any) -> str:
    """A `data-*` value the script can sort on (empty when not a number)."""
    return repr(float(value)) if isinstance(value, (int, float)) and not isinstance(value, bool) else ""


def episode(ident: str, record: Mapping[str, Any], sample: Mapping[str, Any], *, system_prompt: str,
            previewer: ResultPreviewer, facts: Sequence[tuple[str, str]], tags: Sequence[str] = (),
            data: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """What the page shows of one episode: `record` the task, `sample` the episode (the same mapping
    for a rollout); `facts`: (label, text) rows under the question; `data`: extra attributes."""
    solved = bool(sample.get("solved"))
    db_id = str(record.get("db_id", ""))
    attributes = {"failed": "0" if solved else "1", "db": db_id, "difficulty": str(record.get("difficulty", "")),
                  "reward": _number(sample.get("reward")), "turns": _number(sample.get("turns"))}
    attributes.update({k: _number(v) if not isinstance(v, str) else v for k, v in (data or {}).items()})
    return {
        "id": ident,
        "solved": solved,
        "task_id": str(record.get("task_id", "")),
        "db_id": db_id,
        "difficulty": str(record.get("difficulty", "")),
        "question": str(record.get("question", "")),
        "reward": sample.get("reward"),
        "tags": list(tags),
        "facts": list(facts),
        "error": sample.get("error"),
        "terms": reward_terms(sample),
        "sql": (previewer.sql_panel(db_id, sample.get("final_sql"), str(record.get("gold_sql", "")))
                if "ground_truth" not in record else  # a family other than SQL (eval.vocabulary): no SQL to run
                {"plain": True, "final": sample.get("final_sql"), "gold": str(record["ground_truth"]),
                 "answer_label": "final answer", "truth_label": "ground truth"}),
        "turns": turns(sample.get("messages") or [], system_prompt),
        "data": attributes,
    }
