"""Constants redrawn from the database: supervised examples where recalling a memorised constant
never pays (the shipped start's dev failures are mostly `literal_only`).

`redraw_constants(task, db_path, rng)` returns a copy of a task whose stated constants are replaced,
in the question and the gold query together, by other values of the same column; the new gold is
kept only when it returns rows. Trained on a fresh draw each epoch, the only way to be right is to
copy the constant from the question.

A constant is redrawn when it is compared with a column (``=``, ``<>``, ``<``, ``<=``, ``>``,
``>=``) whose table the query names, and its text occurs in the question exactly once as a whole
word (so the question and the query change together). The draw keeps the constant's kind: a
string stays a string without quotes in it, an integer an integer, a number a number. Anything
else (LIMIT counts, LIKE patterns, constants the question words differently) is left as it is.
"""

from __future__ import annotations

import logging
import random
import re
from dataclasses import dataclass
from pathlib import Path

from sqlglot import exp

from mcp_tools.sandbox import SandboxError
from skyrl_tool_agent.data.tasks import Task
from skyrl_tool_agent.rewards.limits import run_bounded
from skyrl_tool_agent.rewards.sqlnorm import parse_query

logger = logging.getLogger(__name__)

__all__ = ["redraw_constants", "stated_constants"]

_COMPARISONS = (exp.EQ, exp.NEQ, exp.GT, exp.GTE, exp.LT, exp.LTE)
#: Distinct values read per column to draw from.
MAX_CANDIDATES = 500


@dataclass(frozen=True)
class StatedConstant:
    """A constant of the gold query the question states: its SQL text (``'Thriller'``, ``713``),
    its value as the question writes it, and the column (table, name) it is compared with."""

    sql: str
    text: str
    is_string: bool
    table: str
    column: str


def _whole(text: str) -> re.Pattern[str]:
    return re.compile(rf"(?<![\w.-]){re.escape(text)}(?![\w-]|\.\d)")


def stated_constants(task: Task) -> list[StatedConstant]:
    """The constants of `task`'s gold query that the question states once (module docstring)."""
    tree = parse_query(task.gold_sql)
    if tree is None:
        return []
    out: dict[str, StatedConstant] = {}
    for cmp in tree.find_all(*_COMPARISONS):
        column, literal = cmp.this, cmp.expression
        if isinstance(column, exp.Literal):
            column, literal = literal, column
        if not isinstance(column, exp.Column) or not isinstance(literal, exp.Literal):
            continue
        select = cmp.parent_select
        if select is None:
            continue
        tables = {(t.alias_or_name).lower(): t.name for t in select.find_all(exp.Table) if t.parent_select is select}
        qualifier = column.table.lower()
        table = tables.get(qualifier) if qualifier else (next(iter(tables.values())) if len(tables) == 1 else None)
        if table is None:
            continue
        text = literal.this
        if len(_whole(text).findall(task.question)) != 1:
            continue
        sql = literal.sql(dialect="sqlite")
        out.setdefault(sql, StatedConstant(sql, text, literal.is_string, table, column.name))
    return list(out.values())


def _kind_ok(old: StatedConstant, value: object) -> bool:
    if old.is_string:
        return isinstance(value, str) and bool(value) and "'" not in value and value != old.text
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    integral = re.fullmatch(r"-?\d+", old.text) is not None
    return (not integral or float(value).is_integer()) and float(value) != float(old.text)


def _as_text(old: StatedConstant, value: object) -> tuple[str, str]:
    """(SQL text, question text) of a drawn value of `old`'s kind."""
    if old.is_string:
        return f"'{value}'", str(value)
    text = str(int(value)) if float(value).is_integer() and re.fullmatch(r"-?\d+", old.text) else repr(float(value))
    return text, text


def redraw_constants(task: Task, db_path: str | Path, rng: random.Random, *, tries: int = 8,
                     timeout_s: float = 2.0) -> Task | None:
    """A copy of `task` with every stated constant redrawn from `db_path` (module docstring), its
    task id suffixed ``~redrawn``; None when it states none, or when no draw in `tries` gives a
    gold query that runs and returns rows."""
    constants = stated_constants(task)
    if not constants:
        return None
    candidates: dict[str, list[object]] = {}
    for c in constants:
        try:
            rows = run_bounded(db_path, f'SELECT DISTINCT "{c.column}" FROM "{c.table}" WHERE "{c.column}" IS NOT NULL '
                               f"LIMIT {MAX_CANDIDATES}", timeout_s=timeout_s, max_rows=MAX_CANDIDATES).rows
        except SandboxError as exc:
            logger.debug("no values of %s.%s for %s: %s", c.table, c.column, task.task_id, exc)
            return None
        values = sorted((r[0] for r in rows if _kind_ok(c, r[0])), key=repr)
        if not values:
            return None
        candidates[c.sql] = values
    for _ in range(tries):
        question, gold = task.question, task.gold_sql
        for c in constants:
            sql, text = _as_text(c, rng.choice(candidates[c.sql]))
            question = _whole(c.text).sub(lambda _m, t=text: t, question, count=1)
            # a quoted string is one token as it stands; a number only as a whole token (713, not 7130)
            gold = gold.replace(c.sql, sql) if c.is_string else _whole(c.sql).sub(lambda _m, t=sql: t, gold)
        try:
            result = run_bounded(db_path, gold, timeout_s=timeout_s, max_rows=1)
        except SandboxError:
            continue
        if result.row_count:
            return task.model_copy(update={"task_id": f"{task.task_id}~redrawn", "question": question,
                                           "gold_sql": gold})
    return None
