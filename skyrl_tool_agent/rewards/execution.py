"""Execution match: does the predicted SQL return the same result as the gold SQL?

Semantics follow the official Spider test-suite evaluator (``exec_eval.py``: ``eval_exec_match`` +
``result_eq``): a match when some permutation of the prediction's columns makes its rows equal to
gold's, as a list when gold orders its result, as a bag otherwise. Both queries run through
``limits.run_bounded``. How ``results_match`` decides, and where it deliberately differs:

* Both empty -> match (whatever the columns); different row or column counts -> no match.
* Column order: an exact, deterministic backtracking search over the pred columns whose value bags
  equal a gold column's (the official code enumerates random-pruned permutations): same answers,
  no randomness.
* Values are compared after canonicalisation: ``None`` equals ``None`` (NULL-safe, as Python's
  ``==`` in the official code), booleans are ints, integral floats are ints (``1.0 == 1`` as in
  Python), other floats are rounded to 10 significant digits so ``0.1 + 0.2`` matches ``0.3``
  (DIFFERENCE: the official code compares floats exactly; relative tolerance here ~5e-11).
  Strings and blobs compare exactly; ``'1'`` never equals ``1`` (as in the official code).
* Order sensitivity: only a top-level ORDER BY of the gold query (found with sqlglot) makes row
  order matter (DIFFERENCE: the official code checks ``'order by' in gold.lower()``, so an ORDER
  BY inside a subquery -- ``WHERE x = (SELECT ... ORDER BY ... LIMIT 1)`` -- also counts there).
* DISTINCT is kept (DIFFERENCE: the official default deletes every DISTINCT token from both
  queries unless run with ``--keep_distinct``, which also turns ``COUNT(DISTINCT x)`` into
  ``COUNT(x)``); ``keep_distinct=False`` does the same deletion (``env.reward.keep_distinct`` for
  the training reward, ``env.reward.eval_keep_distinct`` for evaluation reports). ``spider_official=True`` reproduces the official defaults for comparable
  evaluation numbers: DISTINCT removal, its ``'> ='`` -> ``'>='`` fix-ups, substring ORDER BY
  detection and exact float comparison.
* LIMIT with ties: results are compared, not intent, so ``ORDER BY score DESC LIMIT 1`` with a
  tie may legitimately return another row than gold and then does not match (official: same).
* A prediction that fails does not match. A gold query that fails raises ``GoldQueryError`` (a
  dataset bug); a database that cannot be read, or is rewritten between the two queries, raises
  ``DatabaseUnavailableError``: an infrastructure fault, never a 0 for the prediction.

Cached gold results are keyed by the database file's identity, so a replaced file is re-queried.
"""

from __future__ import annotations

import functools

import logging
import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mcp_tools.sandbox import QueryResult, SandboxError
from skyrl_tool_agent.rewards.gold_cache import GoldResultCache
from skyrl_tool_agent.rewards.limits import DEFAULT_TIMEOUT_S, database_fault, database_identity, run_bounded
from skyrl_tool_agent.rewards.sqlnorm import has_top_level_order_by, remove_distinct_tokens

logger = logging.getLogger(__name__)

__all__ = [
    "DatabaseUnavailableError",
    "ExecutionComparison",
    "GoldQueryError",
    "compare_execution",
    "execution_match",
    "gold_order_matters",
    "results_match",
]

#: Significant digits kept when comparing non-integral floats.
FLOAT_SIGNIFICANT_DIGITS = 10
#: Upper bound on search nodes when matching columns (only reached by pathological results with
#: many columns holding identical value bags); beyond it the results count as different.
MAX_COLUMN_SEARCH_NODES = 20_000

Rows = Sequence[Sequence[Any]]


class GoldQueryError(RuntimeError):
    """The gold side of a comparison failed: the episode cannot be scored (not the policy's fault).

    Raised as is when the gold SQL fails on a readable database (a dataset bug, reported loudly).
    """


class DatabaseUnavailableError(GoldQueryError):
    """The database cannot be opened or read, or changed while being scored: an infrastructure
    fault. Callers retry the episode or exclude it and count it; it is never scored 0."""


class _NaN:
    """Stand-in for float NaN so that NaN == NaN inside a result comparison."""

    def __repr__(self) -> str:
        return "NaN"


_NAN = _NaN()


def _canon_value(value: Any, float_tolerant: bool) -> Any:
    """Canonical, hashable form of one cell (see the module docstring)."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, int):  # a bool too: True == 1
        return int(value)
    if isinstance(value, float):
        if math.isnan(value):
            return _NAN
        if math.isinf(value):
            return value
        if value.is_integer():
            return int(value)
        if float_tolerant:
            rounded = float(f"{value:.{FLOAT_SIGNIFICANT_DIGITS}g}")
            return int(rounded) if rounded.is_integer() else rounded
        return value
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    return value


def _rows_of(result: QueryResult | Rows) -> list[tuple[Any, ...]]:
    rows = result.rows if isinstance(result, QueryResult) else result
    return [tuple(row) for row in rows]


def results_match(
    pred: QueryResult | Rows,
    gold: QueryResult | Rows,
    order_matters: bool,
    *,
    float_tolerant: bool = True,
) -> bool:
    """Whether ``pred`` denotes the same result as ``gold`` (pure; module docstring)."""
    gold_rows = [tuple(_canon_value(v, float_tolerant) for v in r) for r in _rows_of(gold)]
    pred_rows = [tuple(_canon_value(v, float_tolerant) for v in r) for r in _rows_of(pred)]
    if not gold_rows and not pred_rows:
        return True
    if len(gold_rows) != len(pred_rows):
        return False
    n_cols = len(gold_rows[0])
    if any(len(r) != n_cols for r in gold_rows) or any(len(r) != n_cols for r in pred_rows):
        return False
    if not order_matters and Counter(map(_unordered_row, gold_rows)) != Counter(
        map(_unordered_row, pred_rows)
    ):
        return False  # quick rejection, as the official quick_rej (rows compared as bags of cells)

    def signature(rows: list[tuple[Any, ...]], col: int) -> Any:
        values = tuple(r[col] for r in rows)
        return values if order_matters else frozenset(Counter(values).items())

    gold_sigs = [signature(gold_rows, c) for c in range(n_cols)]
    pred_sigs = [signature(pred_rows, c) for c in range(n_cols)]
    # Pred columns with identical value sequences are interchangeable: try one per class.
    pred_class = {}
    class_of = [pred_class.setdefault(tuple(r[c] for r in pred_rows), c) for c in range(n_cols)]
    candidates = [[j for j in range(n_cols) if pred_sigs[j] == gold_sigs[i]] for i in range(n_cols)]
    if any(not c for c in candidates):
        return False

    def projection_equal(assigned: list[int]) -> bool:
        k = len(assigned)
        g = [r[:k] for r in gold_rows]
        p = [tuple(r[j] for j in assigned) for r in pred_rows]
        return g == p if order_matters else Counter(g) == Counter(p)

    budget = [MAX_COLUMN_SEARCH_NODES]

    def search(assigned: list[int], used: set[int]) -> bool:
        if len(assigned) == n_cols:
            return projection_equal(assigned)
        budget[0] -= 1
        if budget[0] < 0:
            return False
        options: list[int] = []
        for j in candidates[len(assigned)]:
            if j not in used and all(class_of[j] != class_of[o] for o in options):
                options.append(j)
        for j in options:
            assigned.append(j)
            used.add(j)
            # Prune with the projected rows only where there is a choice; forced steps are
            # checked once, at the end (keeps wide, long results linear).
            if (len(options) == 1 or projection_equal(assigned)) and search(assigned, used):
                return True
            assigned.pop()
            used.discard(j)
        return False

    found = search([], set())
    if not found and budget[0] < 0:
        logger.warning("column matching gave up after %d nodes (%d columns)", MAX_COLUMN_SEARCH_NODES, n_cols)
    return found


def _unordered_row(row: tuple[Any, ...]) -> frozenset[tuple[Any, int]]:
    return frozenset(Counter(row).items())


@dataclass(frozen=True)
class ExecutionComparison:
    """Outcome of ``compare_execution``: the verdict and, if the prediction failed, why."""

    match: bool
    pred_error: str | None = None
    pred_error_kind: str | None = None  # a SandboxError kind, or "unparseable"


@functools.lru_cache(maxsize=8192)  # pure in its arguments; parsing the gold every episode is costly
def gold_order_matters(gold_sql: str, *, spider_official: bool = False) -> bool:
    """Whether row order matters: the gold query has a top-level ORDER BY.

    With ``spider_official`` (or when sqlglot cannot parse the gold) the official evaluator's
    substring test ``'order by' in gold.lower()`` is used.
    """
    if not spider_official:
        top_level = has_top_level_order_by(gold_sql)
        if top_level is not None:
            return top_level
    return "order by" in gold_sql.lower()


def _official_postprocess(sql: str) -> str:
    return sql.replace("> =", ">=").replace("< =", "<=").replace("! =", "!=")


#: Largest gold result scored, in rendered characters (a number counts 8): a dataset whose gold
#: returns more is refused (GoldQueryError) instead of filling the trainer's memory.
MAX_GOLD_CHARS = 32_000_000
#: Characters a prediction's result may have beyond twice gold's before fetching stops (it then
#: cannot match: an equal result renders to the same size).
PRED_CHARS_SLACK = 65_536


def result_chars(result: QueryResult) -> int:
    """Rendered size of a result as `fetch_capped` counts it."""
    return sum(len(v) if isinstance(v, str) else 2 * len(v) if isinstance(v, bytes) else 8
               for row in result.rows for v in row)


def compare_execution(
    pred_sql: str,
    gold_sql: str,
    db_path: str | Path,
    *,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    cache: GoldResultCache | None = None,
    spider_official: bool = False,
    keep_distinct: bool | None = None,
) -> ExecutionComparison:
    """Run both queries in the sandbox and compare their results (module docstring).
    `keep_distinct` False deletes every DISTINCT from both; None: the mode's (deleted only with
    `spider_official`). A failing prediction is a non-match whose error is in the result.
    """
    if spider_official:
        pred_sql, gold_sql = _official_postprocess(pred_sql), _official_postprocess(gold_sql)
    keep = (not spider_official) if keep_distinct is None else keep_distinct
    if not keep:
        gold_stripped = remove_distinct_tokens(gold_sql)
        if gold_stripped is None:
            raise GoldQueryError(f"gold SQL does not tokenize: {gold_sql!r}")
        gold_sql = gold_stripped
        pred_stripped = remove_distinct_tokens(pred_sql)
        if pred_stripped is None:
            return ExecutionComparison(False, "prediction does not tokenize", "unparseable")
        pred_sql = pred_stripped

    identity = database_identity(db_path)

    def run_gold() -> QueryResult:
        try:
            result = run_bounded(db_path, gold_sql, timeout_s=timeout_s, max_rows=None, max_chars=MAX_GOLD_CHARS)
        except SandboxError as exc:
            _raise_if_database_fault(db_path, exc, probe=True, timeout_s=timeout_s)
            raise GoldQueryError(
                f"gold SQL failed on {db_path} ({exc.kind}: {exc}); fix the dataset: {gold_sql!r}"
            ) from exc
        if result.truncated:
            raise GoldQueryError(f"gold result on {db_path} is larger than {MAX_GOLD_CHARS:,} characters; "
                                 f"fix the dataset: {gold_sql[:200]!r}")
        return result

    if cache is not None:
        gold = cache.get_or_run(db_path, gold_sql, run_gold, identity=identity)
    else:
        gold = run_gold()
    pred: QueryResult | None = None
    failure: SandboxError | None = None
    try:
        # Fetch no more than can match: one row more than gold, gold's width, twice gold's characters
        # (63 wide columns once took the trainer to 1.25 GB).
        pred = run_bounded(db_path, pred_sql, timeout_s=timeout_s, max_rows=gold.row_count + 1,
                           max_chars=2 * result_chars(gold) + PRED_CHARS_SLACK,
                           expect_columns=len(gold.columns) if gold.row_count else None)
    except SandboxError as exc:
        _raise_if_database_fault(db_path, exc, probe=False, timeout_s=timeout_s)
        failure = exc
    if identity is None or database_identity(db_path) != identity:
        # Gold and prediction may have read different files: neither verdict can be trusted.
        raise DatabaseUnavailableError(f"database {db_path} was replaced or rewritten while being scored")
    if failure is not None:
        return ExecutionComparison(False, str(failure), failure.kind)
    assert pred is not None
    if pred.truncated:
        return ExecutionComparison(False, None, None)
    order_matters = gold_order_matters(gold_sql, spider_official=spider_official)
    match = results_match(pred, gold, order_matters, float_tolerant=not spider_official)
    return ExecutionComparison(match)


def _raise_if_database_fault(db_path: str | Path, exc: SandboxError, *, probe: bool, timeout_s: float) -> None:
    """Raise DatabaseUnavailableError if `exc` is the database's fault (`limits.database_fault`;
    `probe` when the gold failed: it ran on this file before, or the dataset is broken)."""
    fault = database_fault(exc, db_path if probe else None, timeout_s)
    if fault is not None:
        raise DatabaseUnavailableError(f"database {db_path} cannot be read ({exc.kind}): {fault}") from exc


def execution_match(
    pred_sql: str,
    gold_sql: str,
    db_path: str | Path,
    *,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    cache: GoldResultCache | None = None,
    spider_official: bool = False,
    keep_distinct: bool | None = None,
) -> bool:
    """True when ``pred_sql`` returns the same result as ``gold_sql`` on ``db_path`` (`compare_execution`)."""
    return compare_execution(
        pred_sql, gold_sql, db_path, timeout_s=timeout_s, cache=cache, spider_official=spider_official,
        keep_distinct=keep_distinct,
    ).match
