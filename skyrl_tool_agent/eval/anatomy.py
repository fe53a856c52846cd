"""Error anatomy: why each wrong answer is wrong, read against its gold query.

Every wrong SQL episode gets exactly one category, the first of this list that holds:

``no_answer``
    The episode ended (turn or token cap) without a final query, and every tool call it made was
    well formed and accepted: the policy talked or explored until it ran out.
``tool_misuse``
    No final query, and the episode had a malformed tool call (format error) or a call the server
    refused (tool error): the agent lost its turns to the tools' protocol.
``retyped``
    The final query is not the last query the agent ran (``EpisodeResult.last_query``), and that
    query returns gold's result: the agent tested a right query, then answered another. The error
    is in writing the answer out again, whatever the answer then got wrong.
``not_executable``
    The final query does not parse as one SQLite query (sqlglot), or SQLite refuses it on the
    task's database (no such column, a syntax error sqlglot let through, a timeout, ...).
``literal_only``
    The final query is gold's skeleton with a wrong constant: after normalisation
    (``rewards.sqlnorm.normalise``: case, quoting, aliases) and with every literal -- number,
    string, date, LIMIT count -- replaced by a placeholder, both queries render the same. This is
    the copy error: 89.95 written as 89.99, 'SK945' as 'SK954'. (Not the clause sets of
    ``rewards.partial``: they drop column qualifiers, and ``T2.name`` for ``T1.name`` is a wrong
    column, not a wrong constant.)
``wrong_table_or_join``
    The tables the query reads from (its FROM and JOIN clauses, set operations' branches
    included; not the subqueries of a condition, which are conditions) differ from gold's, or
    its JOIN ... ON conditions do.
``wrong_column``
    Gold's skeleton with other columns: with literals *and* columns (name and table) masked the
    two are the same query (a column picked wrong in SELECT, WHERE, GROUP BY or ORDER BY).
``empty_result``
    Gold's tables and joins, another structure, and the query returns no rows where gold returns
    some (a result both empty would have matched): its conditions select nothing.
``wrong_aggregate_or_condition``
    Gold's tables and joins, but another aggregate, condition, grouping, ordering, limit,
    DISTINCT or set operation (every remaining structural difference), returning rows.
``other``
    What none of the above explains: the same normalised query as gold judged different (ties
    under LIMIT), or a gold query that sqlglot cannot parse.

A solved or never-scored (infrastructure error) episode has no category (None) and is left out
of every count; rates are over scored episodes. `classify_answer` is pure; `PredictionRunner`
runs the final query as the reward does (`rewards.limits.run_bounded`).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlglot import exp

from mcp_tools.sandbox import SandboxError
from skyrl_tool_agent.data.databases import DatabaseRoot, UnservedDatabaseError
from skyrl_tool_agent.eval.stats import NothingScored, PairedDelta, paired_bootstrap
from skyrl_tool_agent.rewards.execution import GoldQueryError, compare_execution
from skyrl_tool_agent.rewards.gold_cache import GoldResultCache
from skyrl_tool_agent.rewards.limits import DEFAULT_TIMEOUT_S, database_fault, run_bounded
from skyrl_tool_agent.rewards.sqlnorm import normalise, parse_query, render
from skyrl_tool_agent.rollout.trajectory import EpisodeResult, Trajectory

logger = logging.getLogger(__name__)

__all__ = [
    "CATEGORIES",
    "LABELS",
    "PredictionRun",
    "PredictionRunner",
    "anatomy_changes",
    "anatomy_counts",
    "category_outcomes",
    "classify_answer",
    "classify_episodes",
    "skeleton",
]

#: Every category, in the order the classifier tries them (module docstring), and how tables and
#: pictures name it.
LABELS: dict[str, str] = {
    "no_answer": "no answer",
    "tool_misuse": "tool misuse",
    "retyped": "retyped (ran a right query, answered another)",
    "not_executable": "not executable",
    "literal_only": "literal only (wrong constant)",
    "wrong_table_or_join": "wrong table or join",
    "wrong_column": "wrong column",
    "empty_result": "empty result",
    "wrong_aggregate_or_condition": "wrong aggregate or condition",
    "other": "other",
}
CATEGORIES: tuple[str, ...] = tuple(LABELS)
_PLACEHOLDER_COLUMN = "_c"


@dataclass(frozen=True)
class PredictionRun:
    """What the final query did: `rows` returned (None: it failed, with `error`); `unknown`: not
    run (no database), so only sqlglot's verdicts remain."""

    rows: int | None = None
    error: str | None = None
    unknown: bool = False


@functools.lru_cache(maxsize=4096)  # each query parsed once per evaluation; trees are large, so few are kept
def _normalised(sql: str) -> exp.Expression | None:
    """`sql` parsed and normalised, never mutated (callers copy); None when it does not parse."""
    tree = parse_query(sql)
    if tree is None:
        return None
    try:
        return normalise(tree)
    except Exception:  # sqlglot can fail on odd trees; such a query has no skeleton
        logger.debug("could not normalise %r", sql[:200], exc_info=True)
        return None


def _masked(sql: str, *, columns: bool) -> exp.Expression | None:
    """`sql` normalised, every literal a placeholder (with `columns`, every column `_c`)."""
    normal = _normalised(sql)
    if normal is None:
        return None
    tree = normal.copy()
    for literal in list(tree.find_all(exp.Literal)):
        literal.replace(exp.Placeholder())
    if columns:
        for column in tree.find_all(exp.Column):
            column.set("this", exp.to_identifier(_PLACEHOLDER_COLUMN))
            column.set("table", None)
    return tree


@functools.lru_cache(maxsize=65536)  # a gold query is read once per category test and per evaluation
def skeleton(sql: str, *, columns: bool = False) -> str | None:
    """The query with its constants (and with `columns`, its columns) masked, as SQLite text:
    ``SELECT title FROM books WHERE pages > ?``; None when `sql` is not one query."""
    tree = _masked(sql, columns=columns)
    return None if tree is None else render(tree)


def _same_skeleton(pred_sql: str, gold_sql: str, *, columns: bool) -> bool:
    pred = skeleton(pred_sql, columns=columns)
    return pred is not None and pred == skeleton(gold_sql, columns=columns)


@functools.lru_cache(maxsize=65536)
def _tables_and_joins(sql: str) -> tuple[frozenset[str], frozenset[str]] | None:
    """The table names a query reads from (not those of a condition's subqueries) and its
    JOIN ... ON conditions (operands sorted, constants masked); None when it does not parse."""
    tree = _masked(sql, columns=False)
    if tree is None:
        return None
    tables = frozenset(t.name for t in tree.find_all(exp.Table)
                       if t.name and t.find_ancestor(exp.Where, exp.Having) is None)
    joins: set[str] = set()
    for join in tree.find_all(exp.Join):
        if join.find_ancestor(exp.Where, exp.Having) is not None:  # a condition's subquery
            continue
        on = join.args.get("on")
        for pred in (on.flatten() if isinstance(on, exp.And) else [on]) if on is not None else []:
            if isinstance(pred, exp.EQ):
                joins.add(" = ".join(sorted((render(pred.this), render(pred.expression)))))
            else:
                joins.add(render(pred))
        using = join.args.get("using")
        if using:
            joins.add("using " + ",".join(sorted(render(u) for u in using)))
    return tables, frozenset(joins)


def _same_query(a: str, b: str) -> bool:
    """Whether two queries are one after normalisation (the text itself when one does not parse)."""
    na, nb = _normalised(a), _normalised(b)
    if na is None or nb is None:
        return a.strip().rstrip(";").strip() == b.strip().rstrip(";").strip()
    return render(na) == render(nb)


def classify_answer(final_sql: str | None, gold_sql: str, run: PredictionRun | None = None, *,
                    format_errors: int = 0, tool_errors: int = 0, tested_right: bool = False) -> str:
    """The category of one wrong answer (module docstring); `run` None or `unknown`: not run, so
    `not_executable` and `empty_result` rest on sqlglot alone. `tested_right`: the last query the
    agent ran, another than `final_sql`, returns gold's result (`PredictionRunner.tested_right`)."""
    if final_sql is None:
        return "tool_misuse" if format_errors or tool_errors else "no_answer"
    if tested_right:
        return "retyped"
    ran = run is not None and not run.unknown
    if _normalised(final_sql) is None or (ran and run.rows is None):
        return "not_executable"
    gold_parts = _tables_and_joins(gold_sql)
    if gold_parts is None:
        return "other"
    if render(_normalised(final_sql)) == render(_normalised(gold_sql)):  # gold itself, judged different
        return "other"
    if _same_skeleton(final_sql, gold_sql, columns=False):
        return "literal_only"
    if _tables_and_joins(final_sql) != gold_parts:
        return "wrong_table_or_join"
    if _same_skeleton(final_sql, gold_sql, columns=True):
        return "wrong_column"
    if ran and run.rows == 0:
        return "empty_result"
    return "wrong_aggregate_or_condition"


class PredictionRunner:
    """Runs final queries under `db_root`, memoised per (db_id, SQL); at most one row is fetched
    (only whether it runs and returns a row matter). `tested_right` compares a tested query's
    result with gold's, as the reward does."""

    def __init__(self, db_root: str | Path | None) -> None:
        self.databases = DatabaseRoot(Path(db_root)) if db_root is not None else None
        self._memo: dict[tuple[str, str], PredictionRun] = {}
        self._tested: dict[tuple[str, str, str], bool] = {}
        self._gold_cache = GoldResultCache()

    def tested_right(self, db_id: str, tested: str | None, final_sql: str, gold_sql: str) -> bool:
        """Whether `tested` (the last query the agent ran) is another query than `final_sql` and
        returns gold's result; False when there is none or no database to run it on."""
        if tested is None or self.databases is None or _same_query(tested, final_sql):
            return False
        key = (db_id, tested, gold_sql)
        if key not in self._tested:
            try:
                path = self.databases.path(db_id)
                self._tested[key] = compare_execution(tested, gold_sql, path, cache=self._gold_cache).match
            except (UnservedDatabaseError, GoldQueryError):  # nothing to read it against
                self._tested[key] = False
        return self._tested[key]

    def run(self, db_id: str, sql: str | None) -> PredictionRun:
        if sql is None or self.databases is None:
            return PredictionRun(unknown=True)
        key = (db_id, sql)
        if key not in self._memo:
            self._memo[key] = self._run(db_id, sql)
        return self._memo[key]

    def _run(self, db_id: str, sql: str) -> PredictionRun:
        assert self.databases is not None
        try:
            path = self.databases.path(db_id)
        except UnservedDatabaseError:
            return PredictionRun(unknown=True)
        try:
            result = run_bounded(path, sql, timeout_s=DEFAULT_TIMEOUT_S, max_rows=1)
        except SandboxError as exc:
            if database_fault(exc) is not None:  # the database's fault, not the query's
                return PredictionRun(unknown=True)
            return PredictionRun(error=f"{exc.kind}: {exc}")
        return PredictionRun(rows=result.row_count)


def classify_episode(result: EpisodeResult, gold_sql: str, runner: PredictionRunner) -> str | None:
    """The category of one episode (None: solved or never scored)."""
    if result.done_reason == "error" or result.solved:
        return None
    if result.final_sql is None:
        return classify_answer(None, gold_sql, format_errors=result.format_errors, tool_errors=result.tool_errors)
    return classify_answer(result.final_sql, gold_sql, runner.run(result.db_id, result.final_sql),
                           tested_right=runner.tested_right(result.db_id, result.last_query, result.final_sql, gold_sql))


def classify_episodes(trajectories: Sequence[Trajectory], gold_sql: Mapping[str, str],
                      db_root: str | Path | None) -> list[str | None]:
    """Each episode's category, in order; `db_root` None: queries are not run."""
    runner = PredictionRunner(db_root)
    return [classify_episode(t.result, gold_sql[t.task_id], runner) for t in trajectories]


def anatomy_counts(categories: Sequence[str | None], scored: int) -> dict[str, Any]:
    """Counts and rates (over `scored` episodes) of every category, `wrong` in all."""
    counts = {c: sum(1 for x in categories if x == c) for c in CATEGORIES}
    wrong = sum(counts.values())
    return {"scored": scored, "wrong": wrong, "counts": counts,
            "rates": {c: (n / scored if scored else None) for c, n in counts.items()}}


def category_outcomes(categories: Sequence[str | None], solved: Sequence[int | None],
                      category: str) -> list[float | None]:
    """Per episode, 1.0 in `category`, 0.0 not, None never scored: what a paired interval resamples."""
    return [None if s is None else float(c == category) for c, s in zip(categories, solved, strict=True)]


def anatomy_changes(before: Sequence[str | None], before_solved: Sequence[int | None],
                    after: Sequence[str | None], after_solved: Sequence[int | None]) -> dict[str, PairedDelta]:
    """Each category's rate change between two evaluations of the same tasks (same order), with
    its 95% paired-bootstrap interval; a category no task was scored for on both sides is left out."""
    if len(before) != len(after):
        raise ValueError(f"paired categories need equal lengths, got {len(before)} and {len(after)}")
    out: dict[str, PairedDelta] = {}
    for c in CATEGORIES:
        b, a = category_outcomes(before, before_solved, c), category_outcomes(after, after_solved, c)
        try:
            out[c] = paired_bootstrap(b, a)
        except NothingScored:
            continue
    return out


def anatomy_deltas(before: dict[str, Any], after: dict[str, Any]) -> dict[str, dict[str, float]] | None:
    """`anatomy_changes` of two results dicts, or None when either lacks the anatomy."""
    b, a = before.get("error_categories"), after.get("error_categories")
    if not b or not a or len(b) != len(a) or len(before.get("solved") or ()) != len(b) \
            or len(after.get("solved") or ()) != len(a):
        return None
    return {c: d.to_dict() for c, d in anatomy_changes(b, before["solved"], a, after["solved"]).items()}
