"""Execution match on a real SQLite file, against what the official Spider evaluator would say.

The official verdicts come from reading taoyds/test-suite-sql-eval `exec_eval.py`
(`eval_exec_match` + `result_eq`); `official_result_eq` below transcribes `result_eq` (with the
full permutation set, which its pruning never changes the answer of) and is used as an oracle.
Deliberate differences (floats, DISTINCT, subquery ORDER BY) are tested in both modes.
"""

from __future__ import annotations

import hashlib
import itertools
import random
import sqlite3
import time
from collections import Counter
from pathlib import Path

import pytest

from mcp_tools.sandbox import QueryResult, run_query
from skyrl_tool_agent.rewards.execution import (
    GoldQueryError,
    GoldResultCache,
    compare_execution,
    execution_match,
    gold_order_matters,
    results_match,
)

SINGERS = [
    # id, name, country, age, score
    (1, "Alice", "France", 30, 9.5),
    (2, "Bob", "USA", 25, 7.0),
    (3, "Chloe", "France", 41, 9.5),  # ties Alice on score
    (4, "Dan", None, 35, 6.25),
    (5, "Eve", "", 28, 8.0),
    (6, "Finn", "USA", 25, 5.5),
]


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("exec") / "music.sqlite"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE singer (id INTEGER PRIMARY KEY, name TEXT, country TEXT, age INTEGER, score REAL)")
    conn.executemany("INSERT INTO singer VALUES (?, ?, ?, ?, ?)", SINGERS)
    conn.execute("CREATE TABLE concert (id INTEGER PRIMARY KEY, singer_id INTEGER, year INTEGER)")
    conn.executemany(
        "INSERT INTO concert VALUES (?, ?, ?)",
        [(1, 1, 2014), (2, 1, 2015), (3, 2, 2015), (4, 3, 2016), (5, 3, 2016), (6, 6, 2014)],
    )
    conn.commit()
    conn.close()
    return path


def official_result_eq(result1: list[tuple], result2: list[tuple], order_matters: bool) -> bool:
    """The official `result_eq` (gold=result1, pred=result2) with all column permutations."""
    if len(result1) == 0 and len(result2) == 0:
        return True
    if len(result1) != len(result2):
        return False
    num_cols = len(result1[0])
    if len(result2[0]) != num_cols:
        return False
    for perm in itertools.permutations(range(num_cols)):
        result2_perm = [tuple(row[i] for i in perm) for row in result2]
        if order_matters:
            if result1 == result2_perm:
                return True
        elif set(result1) == set(result2_perm) and Counter(result1) == Counter(result2_perm):
            return True
    return False


def rows(db: Path, sql: str) -> list[tuple]:
    return run_query(db, sql, max_rows=None).rows


def check(db: Path, pred: str, gold: str, expected: bool) -> None:
    """`execution_match(pred, gold)` is `expected` (the official verdict unless a test says otherwise)."""
    assert execution_match(pred, gold, db) is expected, (pred, gold)


# ----------------------------------------------------------------------------- Spider cases


def test_reordered_columns_match(db: Path) -> None:
    gold = "SELECT name, age, country FROM singer"
    pred = "SELECT country, name, age FROM singer"
    assert official_result_eq(rows(db, gold), rows(db, pred), order_matters=False)
    check(db, pred, gold, True)


def test_gold_order_by_makes_order_matter(db: Path) -> None:
    gold = "SELECT name FROM singer ORDER BY age"
    pred = "SELECT name FROM singer ORDER BY age DESC"
    assert not official_result_eq(rows(db, gold), rows(db, pred), order_matters=True)
    check(db, pred, gold, False)
    check(db, "SELECT name FROM singer ORDER BY age ASC", gold, True)


def test_no_order_by_in_gold_ignores_row_order(db: Path) -> None:
    gold = "SELECT name FROM singer"
    pred = "SELECT name FROM singer ORDER BY name DESC"
    assert rows(db, gold) != rows(db, pred)  # the orders really differ
    assert official_result_eq(rows(db, gold), rows(db, pred), order_matters=False)
    check(db, pred, gold, True)


def test_multiset_semantics_for_duplicates(db: Path) -> None:
    # [1, 1, 2] vs [1, 2, 2]: same set, different bags
    gold = "SELECT 1 UNION ALL SELECT 1 UNION ALL SELECT 2"
    pred = "SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 2"
    assert not official_result_eq(rows(db, gold), rows(db, pred), order_matters=False)
    check(db, pred, gold, False)
    # [1, 2] vs [1, 1, 2]
    check(db, "SELECT 1 UNION ALL SELECT 2", "SELECT 1 UNION ALL SELECT 1 UNION ALL SELECT 2", False)
    # on table data: duplicates of age 25 count
    check(db, "SELECT DISTINCT age FROM singer", "SELECT age FROM singer", False)
    check(db, "SELECT age FROM singer WHERE id IN (2, 6, 1)", "SELECT age FROM singer WHERE age <= 30", False)


def test_nulls_are_compared_safely(db: Path) -> None:
    gold = "SELECT name, country FROM singer WHERE country IS NULL"
    check(db, "SELECT name, country FROM singer WHERE id = 4", gold, True)
    check(db, "SELECT name, '' FROM singer WHERE id = 4", gold, False)  # NULL is not ''
    check(db, "SELECT name, 0 FROM singer WHERE id = 4", gold, False)  # NULL is not 0
    check(db, "SELECT country FROM singer", "SELECT country FROM singer ORDER BY id DESC", False)
    check(db, "SELECT country FROM singer ORDER BY id DESC", "SELECT country FROM singer", True)


def test_floats_are_compared_with_tolerance(db: Path) -> None:
    check(db, "SELECT 0.1 + 0.2", "SELECT 0.3", True)
    check(db, "SELECT sum(score) / count(*) FROM singer", "SELECT avg(score) FROM singer", True)
    check(db, "SELECT 0.30001", "SELECT 0.3", False)
    check(db, "SELECT count(*) * 1.0 FROM singer", "SELECT count(*) FROM singer", True)  # 6.0 == 6, as Python
    check(db, "SELECT '6'", "SELECT count(*) FROM singer", False)  # text is not a number
    # The official evaluator compares exactly: 0.1 + 0.2 != 0.3 there (documented difference).
    assert not official_result_eq(rows(db, "SELECT 0.3"), rows(db, "SELECT 0.1 + 0.2"), order_matters=False)
    assert not execution_match("SELECT 0.1 + 0.2", "SELECT 0.3", db, spider_official=True)


def test_limit_with_ties_compares_results_not_intent(db: Path) -> None:
    gold = "SELECT name FROM singer ORDER BY score DESC LIMIT 1"
    (gold_name,) = rows(db, gold)[0]
    assert gold_name in ("Alice", "Chloe")
    # all tied rows: a different bag of rows
    check(db, "SELECT name FROM singer WHERE score = (SELECT max(score) FROM singer)", gold, False)
    # the other tied row: a different result
    other = f"SELECT name FROM singer ORDER BY score DESC, name = '{gold_name}' LIMIT 1"
    assert rows(db, other)[0][0] != gold_name
    check(db, other, gold, False)
    check(db, f"SELECT name FROM singer ORDER BY score DESC, name <> '{gold_name}' LIMIT 1", gold, True)


def test_pred_syntax_error_is_false(db: Path) -> None:
    outcome = compare_execution("SELEC name FROM singer", "SELECT name FROM singer", db)
    assert outcome.match is False and outcome.pred_error_kind == "syntax"
    check(db, "SELECT nme FROM singer", "SELECT name FROM singer", False)
    check(db, "", "SELECT name FROM singer", False)


def test_pred_timeout_is_false_and_prompt(db: Path) -> None:
    """The scoring timeout is CPU seconds (`rewards.limits.run_bounded`): the query's CPU is
    bounded by it, whatever else the machine runs, and the call's wall time by the documented
    wall limit. The fastest of three tries is bounded: the worker's other threads add CPU too."""
    from skyrl_tool_agent.rewards.limits import CPU_CLOCK_WALL_FACTOR, WALL_CLOCK_GRACE_S

    endless = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c"
    timeout_s = 0.5
    used = []
    for _ in range(3):
        # the same comparison with a query that ends at once: the CPU around the query
        cpu = time.process_time()
        compare_execution("SELECT count(*) FROM singer", "SELECT count(*) FROM singer", db, timeout_s=timeout_s)
        around = time.process_time() - cpu
        cpu, start = time.process_time(), time.monotonic()
        outcome = compare_execution(endless, "SELECT count(*) FROM singer", db, timeout_s=timeout_s)
        used.append(time.process_time() - cpu)
        assert outcome.match is False and outcome.pred_error_kind == "timeout"
        assert time.monotonic() - start < CPU_CLOCK_WALL_FACTOR * timeout_s + WALL_CLOCK_GRACE_S
        if used[-1] < timeout_s + 2 * around + 0.25:
            return
    raise AssertionError(f"every try used more CPU than the timeout allows: {used} (around the query: {around:.3f} s)")


@pytest.mark.parametrize(
    "pred",
    [
        "DELETE FROM singer",
        "UPDATE singer SET age = 0",
        "INSERT INTO singer (name) VALUES ('x')",
        "DROP TABLE singer",
        "SELECT name FROM singer; DELETE FROM singer",
        "ATTACH DATABASE ':memory:' AS other",
    ],
)
def test_pred_write_attempt_is_false_and_db_unchanged(db: Path, pred: str) -> None:
    before = hashlib.sha256(db.read_bytes()).hexdigest()
    assert execution_match(pred, "SELECT name FROM singer", db) is False
    assert hashlib.sha256(db.read_bytes()).hexdigest() == before
    conn = sqlite3.connect(db)
    try:
        assert conn.execute("SELECT count(*), sum(age) FROM singer").fetchone() == (6, 184)
    finally:
        conn.close()


def test_column_count_and_emptiness(db: Path) -> None:
    check(db, "SELECT name, age FROM singer", "SELECT name FROM singer", False)
    check(db, "SELECT name FROM singer WHERE age > 100", "SELECT age, id FROM singer WHERE age < 0", True)
    check(db, "SELECT name FROM singer WHERE age > 100", "SELECT name FROM singer", False)


def test_join_reformulation_matches(db: Path) -> None:
    gold = (
        "SELECT T1.name, count(*) FROM singer AS T1 JOIN concert AS T2 ON T1.id = T2.singer_id "
        "GROUP BY T1.id"
    )
    pred = (
        "SELECT (SELECT count(*) FROM concert WHERE concert.singer_id = singer.id) AS n, name FROM singer "
        "WHERE id IN (SELECT singer_id FROM concert)"
    )
    check(db, pred, gold, True)


# ------------------------------------------------------------ deliberate differences / modes


def test_only_top_level_order_by_counts(db: Path) -> None:
    gold = "SELECT name FROM singer WHERE id IN (SELECT id FROM singer ORDER BY age LIMIT 3)"
    pred = "SELECT name FROM singer WHERE age < 30 ORDER BY name DESC"
    assert sorted(rows(db, gold)) == sorted(rows(db, pred)) and rows(db, gold) != rows(db, pred)
    assert gold_order_matters(gold) is False
    assert gold_order_matters(gold, spider_official=True) is True  # official: 'order by' substring
    assert execution_match(pred, gold, db) is True
    assert execution_match(pred, gold, db, spider_official=True) is False
    assert gold_order_matters("SELECT a FROM t UNION SELECT b FROM u ORDER BY 1") is True
    assert gold_order_matters("not sql at all ORDER BY") is True  # falls back to the substring test


def test_distinct_kept_by_default_removed_in_official_mode(db: Path) -> None:
    gold = "SELECT DISTINCT country FROM singer WHERE country = 'France'"
    pred = "SELECT country FROM singer WHERE country = 'France'"
    assert execution_match(pred, gold, db) is False
    assert execution_match(pred, gold, db, spider_official=True) is True
    # official mode also turns COUNT(DISTINCT x) into COUNT(x), as `remove_distinct` does
    assert execution_match("SELECT count(age) FROM singer", "SELECT count(DISTINCT age) FROM singer", db) is False
    assert execution_match(
        "SELECT count(age) FROM singer", "SELECT count(DISTINCT age) FROM singer", db, spider_official=True
    )
    assert execution_match("SELECT name FROM singer WHERE age > = 30", "SELECT name FROM singer WHERE age >= 30",
                           db, spider_official=True)


def test_keep_distinct_alone_picks_the_distinct_semantics(db: Path) -> None:
    """keep_distinct overrides only DISTINCT, in either mode; the cases below differ between the two."""
    gold = "SELECT DISTINCT country FROM singer WHERE country = 'France'"
    pred = "SELECT country FROM singer WHERE country = 'France'"
    assert execution_match(pred, gold, db, keep_distinct=False) is True
    assert execution_match(pred, gold, db, spider_official=True, keep_distinct=True) is False
    # the other way round: DISTINCT in the prediction is what makes it right; stripped, it returns 6 rows, not 4
    gold, pred = "SELECT country FROM singer GROUP BY country", "SELECT DISTINCT country FROM singer"
    assert execution_match(pred, gold, db, keep_distinct=True) is True
    assert execution_match(pred, gold, db, keep_distinct=False) is False
    # the rest of official mode stays: exact floats even with DISTINCT kept
    assert not execution_match("SELECT 0.1 + 0.2", "SELECT 0.3", db, spider_official=True, keep_distinct=True)


def test_gold_error_raises(db: Path, tmp_path: Path) -> None:
    with pytest.raises(GoldQueryError, match="no such column"):
        execution_match("SELECT 1", "SELECT nope FROM singer", db)
    with pytest.raises(GoldQueryError, match="not_found"):
        execution_match("SELECT 1", "SELECT 1", tmp_path / "missing.sqlite")


def test_cache_serves_gold_and_counts(db: Path) -> None:
    cache = GoldResultCache(maxsize=8)
    gold = "SELECT name FROM singer WHERE country = 'USA'"
    verdicts = [
        execution_match(p, gold, db, cache=cache)
        for p in ("SELECT name FROM singer WHERE id IN (2, 6)", "SELECT name FROM singer", gold)
    ]
    assert verdicts == [True, False, True]
    assert (cache.misses, cache.hits, len(cache)) == (1, 2, 1)
    assert cache.get(db, gold) == run_query(db, gold, max_rows=None)


# ------------------------------------------------------------------ results_match (pure)


def test_results_match_accepts_query_results_and_rows() -> None:
    gold = QueryResult(columns=["a", "b"], rows=[(1, "x"), (2, "y")], truncated=False, row_count=2)
    assert results_match([("y", 2), ("x", 1)], gold, order_matters=False)
    assert not results_match([("y", 2), ("x", 1)], gold, order_matters=True)
    assert results_match([["x", 1], ["y", 2]], gold, order_matters=True)
    assert results_match([(float("nan"),)], [(float("nan"),)], order_matters=False)
    assert results_match([(True,)], [(1,)], order_matters=False)
    assert not results_match([(b"\x01",)], [("\x01",)], order_matters=False)


def test_results_match_needs_one_consistent_permutation() -> None:
    # a column permutation (0, 2, 1) of a Latin square: match
    gold = [(1, 2, 3), (2, 3, 1), (3, 1, 2)]
    pred = [(1, 3, 2), (2, 1, 3), (3, 2, 1)]
    assert official_result_eq(gold, pred, order_matters=False) is True
    assert results_match(pred, gold, order_matters=False)
    # every column bag and every row bag agree, yet no single column permutation works
    gold = [(2, 1, 1), (2, 1, 2), (1, 2, 1)]
    pred = [(2, 1, 1), (2, 1, 1), (1, 2, 2)]
    assert official_result_eq(gold, pred, order_matters=False) is False
    assert not results_match(pred, gold, order_matters=False)


def test_results_match_agrees_with_official_on_random_tables() -> None:
    rng = random.Random(1234)
    disagreements = []
    positives = 0
    for _ in range(3000):
        n_cols = rng.randint(1, 4)
        n_rows = rng.randint(0, 5)
        domain = [None, 0, 1, 2, "a"][: rng.randint(2, 5)]
        gold = [tuple(rng.choice(domain) for _ in range(n_cols)) for _ in range(n_rows)]
        if rng.random() < 0.5:  # a permuted/shuffled copy, maybe perturbed: many true cases
            perm = rng.sample(range(n_cols), n_cols)
            pred = [tuple(r[i] for i in perm) for r in gold]
            if rng.random() < 0.5:
                rng.shuffle(pred)
            if pred and rng.random() < 0.3:
                i, j = rng.randrange(len(pred)), rng.randrange(n_cols)
                row = list(pred[i])
                row[j] = rng.choice(domain)
                pred[i] = tuple(row)
        else:
            width = rng.choice([n_cols, n_cols, n_cols + 1])
            pred = [tuple(rng.choice(domain) for _ in range(width)) for _ in range(rng.choice([n_rows, n_rows + 1]))]
        order_matters = rng.random() < 0.3
        expected = official_result_eq(gold, pred, order_matters)
        positives += expected
        if results_match(pred, gold, order_matters) != expected:
            disagreements.append((gold, pred, order_matters, expected))
    assert disagreements == []
    assert positives > 800  # the sample exercises both verdicts


def test_results_match_many_identical_columns_is_fast() -> None:
    gold = [tuple([i] * 12) for i in range(50)]
    pred = list(reversed(gold))
    start = time.monotonic()
    assert results_match(pred, gold, order_matters=False)
    assert not results_match(pred[:-1] + [tuple([99] * 12)], gold, order_matters=False)
    assert time.monotonic() - start < 1.0


# ------------------------------------------------------------------ Spider (when present)


@pytest.mark.spider
def test_spider_dev_gold_matches_itself(spider_root: Path) -> None:
    import json

    from skyrl_tool_agent.data.tasks import db_path_for

    examples = json.loads((spider_root / "dev.json").read_text(encoding="utf-8"))
    cache = GoldResultCache()
    checked = 0
    for ex in examples[::3]:
        db_path = db_path_for(spider_root / "database", ex["db_id"])
        if not db_path.is_file():
            continue  # wta_1 is absent from this copy (see PROVENANCE.md)
        assert execution_match(ex["query"], ex["query"], db_path, cache=cache), ex["query"]
        checked += 1
    assert checked > 300
    assert cache.misses == len(cache) and cache.hits + cache.misses == checked
