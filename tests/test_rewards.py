"""Structural rewards (partial credit, exact match, syntax), the episode score and the gold cache."""

from __future__ import annotations

import random
import sqlite3
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from mcp_tools.sandbox import QueryResult
from skyrl_tool_agent.config import RewardTermConfig
from skyrl_tool_agent.rewards import (
    GoldQueryError,
    GoldResultCache,
    RewardBreakdown,
    Rubric,
    exact_match,
    execution_match,
    literal_match,
    partial_credit,
    score_answer,
    sql_components,
    sql_is_valid,
)
from skyrl_tool_agent.rewards.partial import COMPONENTS

GOLD = (
    "SELECT T1.name FROM singer AS T1 JOIN concert AS T2 ON T1.id = T2.singer_id "
    "WHERE T2.year > 2014 AND T1.country = 'France' ORDER BY T1.age DESC LIMIT 3"
)


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("rewards") / "music.sqlite"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE singer (id INTEGER PRIMARY KEY, name TEXT, country TEXT, age INTEGER)")
    conn.executemany(
        "INSERT INTO singer VALUES (?, ?, ?, ?)",
        [(1, "Alice", "France", 30), (2, "Bob", "USA", 25), (3, "Chloe", "France", 41), (4, "Dan", "Peru", 35)],
    )
    conn.execute("CREATE TABLE concert (id INTEGER PRIMARY KEY, singer_id INTEGER, year INTEGER)")
    conn.executemany("INSERT INTO concert VALUES (?, ?, ?)", [(1, 1, 2015), (2, 3, 2016), (3, 2, 2013)])
    conn.commit()
    conn.close()
    return path


# ------------------------------------------------------------------------ syntax validity


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT 1",
        "select name from singer;",
        "SELECT a FROM t UNION SELECT b FROM u",
        "WITH x AS (SELECT 1 AS a) SELECT a FROM x",
        "SELECT `name` FROM [singer] WHERE \"country\" = 'France'",
    ],
)
def test_sql_is_valid_accepts_queries(sql: str) -> None:
    assert sql_is_valid(sql)


@pytest.mark.parametrize(
    "sql",
    ["", "   ;", "SELEC name FROM singer", "SELECT FROM WHERE", "DELETE FROM singer", "SELECT 1; SELECT 2",
     "hello world", "SELECT * FROM t ORDER BY", "x" * 30_000],
)
def test_sql_is_valid_rejects_non_queries(sql: str) -> None:
    assert not sql_is_valid(sql)


# ---------------------------------------------------------------------------- exact match


@pytest.mark.parametrize(
    "pred",
    [
        GOLD,
        GOLD.lower().replace("'france'", "'France'"),
        GOLD.replace("'France'", '"France"'),  # Spider's double-quoted strings
        "SELECT singer.name FROM Singer JOIN CONCERT ON singer.id = concert.singer_id "
        "WHERE concert.year > 2014 AND singer.country = 'France' ORDER BY singer.age DESC LIMIT 3;",
        "SELECT  a.name FROM singer AS a JOIN concert AS b ON a.id = b.singer_id\n"
        "WHERE b.year > 2014 AND a.country = 'France' ORDER BY a.age DESC LIMIT 3",
    ],
)
def test_exact_match_normalises_spelling(pred: str) -> None:
    assert exact_match(pred, GOLD)


def test_exact_match_normalisations_one_by_one() -> None:
    assert exact_match("SELECT name FROM singer", "SELECT T1.name FROM singer AS T1")
    assert exact_match('SELECT "Name" FROM Singer;', "select name from singer")
    assert exact_match("SELECT a FROM t WHERE a <> 1", "SELECT a FROM t WHERE a != 1")
    assert exact_match("SELECT count(*) FROM t", "SELECT COUNT(*) FROM t")


@pytest.mark.parametrize(
    "pred",
    [
        GOLD.replace("2014", "2015"),
        GOLD.replace("'France'", "'france'"),  # string literals keep their case
        GOLD.replace("DESC", "ASC"),
        GOLD.replace("SELECT", "SELECT DISTINCT"),
        GOLD.replace("LIMIT 3", ""),
        "SELECT name FROM singer",
        "not sql",
    ],
)
def test_exact_match_rejects_different_queries(pred: str) -> None:
    assert not exact_match(pred, GOLD)


def test_exact_match_keeps_self_join_aliases_apart() -> None:
    a = "SELECT T1.name FROM singer AS T1 JOIN singer AS T2 ON T1.id = T2.id"
    b = "SELECT T2.name FROM singer AS T1 JOIN singer AS T2 ON T1.id = T2.id"
    assert exact_match(a, a.lower()) and not exact_match(a, b)


# -------------------------------------------------------------------------- partial credit


def test_sql_components_of_gold() -> None:
    parts = sql_components(GOLD)
    assert set(parts) == set(COMPONENTS)
    assert parts["tables"] == {"singer", "concert"}
    assert parts["select"] == {"name"}
    assert parts["conditions"] == {"id = singer_id", "year > 2014", "'France' = country"}
    assert parts["order_by"] == {"age desc"} and parts["limit"] == {"limit 3"}
    assert parts["aggregates"] == set() and parts["distinct"] == set()
    agg = sql_components("SELECT country, count(*) FROM singer GROUP BY country HAVING count(*) > 1")
    assert agg["aggregates"] == {"count(*)"} and agg["group_by"] == {"country"}
    assert agg["having"] == {"count(*) > 1"}
    assert sql_components("SELECT a FROM t UNION ALL SELECT a FROM u")["set_ops"] == {"union all"}
    assert sql_components("not a query") == {}


def test_partial_credit_orders_near_misses() -> None:
    equivalent = (
        "select s.NAME from Singer s join concert c on c.singer_id = s.id "
        "where 2014 < c.year and s.country = \"France\" order by s.age desc limit 3"
    )
    close = "SELECT name FROM singer WHERE country = 'France' ORDER BY age DESC LIMIT 3"
    further = "SELECT name, age FROM singer WHERE age > 30"
    far = "SELECT count(*) FROM concert"
    scores = [partial_credit(p, GOLD) for p in (equivalent, close, further, far, "SELEC garbage")]
    assert scores[0] == 1.0
    assert scores[0] > scores[1] > scores[2] > scores[3] > scores[4] == 0.0
    assert partial_credit(GOLD, GOLD) == 1.0


def test_literal_match_is_the_f1_of_the_literals_as_written() -> None:
    gold = "SELECT count(*) FROM visits WHERE doctor = 'Dr. Jonas Baker' AND year > 1970"
    assert literal_match(gold, gold) == 1.0
    assert literal_match(gold.replace("Jonas", "Tara"), gold) == 0.5  # one of two constants
    assert literal_match(gold.replace("1970", "'1970'"), gold) == 0.5  # a string is not the number
    assert literal_match("SELECT count(*) FROM visits", gold) == 0.0  # the constants left out
    assert literal_match("SELECT name FROM t", "SELECT age FROM t") == 1.0  # no constant to state
    assert literal_match("SELEC garbage", gold) == 0.0 and literal_match(gold, "SELEC garbage") == 0.0


def test_partial_credit_is_bounded_and_total_on_garbage() -> None:
    rng = random.Random(7)
    pieces = ["SELECT", "name", "FROM", "singer", "WHERE", "=", "'x'", "(", ")", ",", "count(*)", "JOIN",
              "ON", "GROUP BY", "ORDER BY", "LIMIT", "1", "\"", "`", ";", "UNION", "\x00", "\ud800", "é"]
    for _ in range(300):
        sql = " ".join(rng.choice(pieces) for _ in range(rng.randint(0, 15)))
        value = partial_credit(sql, GOLD)
        assert 0.0 <= value <= 1.0
        assert isinstance(exact_match(sql, GOLD), bool) and isinstance(sql_is_valid(sql), bool)


# ---------------------------------------------------------------------------- score_answer
# (the rubric's rules and terms of your own: tests/test_reward_terms.py)


def test_score_perfect_episode_is_exactly_one(db: Path) -> None:
    result = score_answer(GOLD, GOLD, db, format_ok=True, rubric=Rubric.default())
    assert result.total == 1.0 and result.solved
    assert result.terms == {"execution": 1.0, "format": 1.0, "syntax": 1.0, "partial": 1.0}


def test_score_no_answer_is_zero(db: Path) -> None:
    for answer in (None, "", "   "):
        result = score_answer(answer, GOLD, db, format_ok=True)
        assert result == RewardBreakdown(0.0, {"execution": 0.0, "format": 0.0, "syntax": 0.0, "partial": 0.0})


def test_score_orders_outcomes(db: Path) -> None:
    rubric = Rubric.default()

    def total(answer: str, format_ok: bool = True) -> float:
        return score_answer(answer, GOLD, db, format_ok=format_ok, rubric=rubric).total

    perfect = total(GOLD)
    correct_other_spelling = total(
        "SELECT name FROM singer WHERE id IN (SELECT singer_id FROM concert WHERE year > 2014) "
        "AND country = 'France' ORDER BY age DESC LIMIT 3"
    )
    correct_malformed = total(GOLD, format_ok=False)
    close = total("SELECT name FROM singer WHERE country = 'France' ORDER BY age LIMIT 3")
    far = total("SELECT count(*) FROM concert")
    unparseable = total("SELEC nonsense FROM")
    malformed_garbage = total("SELEC nonsense FROM", format_ok=False)
    assert perfect == correct_other_spelling == 1.0
    assert 1.0 > correct_malformed > close > far > unparseable > malformed_garbage == 0.0
    assert close <= (0.1 + 0.05 + 0.2) / rubric.normaliser


def test_score_partial_only_counts_when_wrong(db: Path) -> None:
    rubric = Rubric.from_specs(RewardTermConfig(name=name, weight=weight) for name, weight in
                               (("execution", 1.0), ("format", 0.0), ("syntax", 0.0), ("partial", 0.5)))
    correct = score_answer("SELECT name FROM singer WHERE name = 'Chloe' OR name = 'Alice' ORDER BY age DESC",
                           GOLD, db, format_ok=True, rubric=rubric)
    assert correct.terms["execution"] == 1.0 and correct.terms["partial"] == 1.0 and correct.total == 1.0
    wrong = score_answer("SELECT name FROM singer WHERE country = 'France' ORDER BY age LIMIT 3",
                         GOLD, db, format_ok=True, rubric=rubric)
    assert wrong.terms["execution"] == 0.0 and wrong.total == pytest.approx(0.5 * wrong.terms["partial"])


def test_score_syntax_falls_back_to_sqlite(db: Path) -> None:
    # sqlglot does not treat a bare VALUES as a query, SQLite runs it (and it is even correct)
    assert not sql_is_valid("VALUES (4)")
    result = score_answer("VALUES (4)", "SELECT count(*) FROM singer", db, format_ok=True)
    assert (result.terms["execution"], result.terms["syntax"], result.total) == (1.0, 1.0, 1.0)
    failed = score_answer("SELECT nme FROM singer", "SELECT name FROM singer", db, format_ok=True)
    assert failed.terms["syntax"] == 1.0 and not failed.solved and "no such column" in (failed.pred_error or "")


def test_score_gold_failure_raises(db: Path) -> None:
    with pytest.raises(GoldQueryError):
        score_answer("SELECT 1", "SELECT missing FROM singer", db, format_ok=True)


# ------------------------------------------------------------------------------ gold cache


def _result(n: int) -> QueryResult:
    return QueryResult(columns=["n"], rows=[(n,)], truncated=False, row_count=1)


def test_cache_hits_over_a_grpo_group(db: Path) -> None:
    cache = GoldResultCache()
    group = ["SELECT name FROM singer", GOLD, "SELECT 1", GOLD, "SELEC x", GOLD, GOLD, "SELECT count(*) FROM singer"]
    verdicts = [execution_match(pred, GOLD, db, cache=cache) for pred in group]
    assert verdicts == [False, True, False, True, False, True, True, False]
    assert (cache.misses, cache.hits) == (1, 7)


def test_cache_is_a_bounded_lru(tmp_path: Path) -> None:
    cache = GoldResultCache(maxsize=3)
    for i in range(3):
        cache.put(tmp_path / "a.sqlite", f"SELECT {i}", _result(i))
    assert cache.get(tmp_path / "a.sqlite", "SELECT 0") == _result(0)  # 0 is now most recent
    cache.put(tmp_path / "a.sqlite", "SELECT 3", _result(3))  # evicts 1, the least recent
    assert len(cache) == 3
    assert cache.get(tmp_path / "a.sqlite", "SELECT 1") is None
    assert cache.get(tmp_path / "a.sqlite", "SELECT 0") is not None
    assert cache.get(tmp_path / "b.sqlite", "SELECT 0") is None  # keyed by database too
    # the same file spelled differently is the same key
    assert cache.get(tmp_path / "x" / ".." / "a.sqlite", "SELECT 3") == _result(3)
    with pytest.raises(ValueError):
        GoldResultCache(maxsize=0)


def test_cache_is_thread_safe() -> None:
    cache = GoldResultCache(maxsize=16)
    runs: list[int] = []
    lock = threading.Lock()

    def work(i: int) -> int:
        key = f"SELECT {i % 40}"

        def run() -> QueryResult:
            with lock:
                runs.append(i)
            return _result(i % 40)

        return cache.get_or_run("/db.sqlite", key, run).rows[0][0]

    with ThreadPoolExecutor(max_workers=8) as pool:
        values = list(pool.map(work, range(4000)))
    assert values == [i % 40 for i in range(4000)]
    assert cache.hits + cache.misses == 4000 and cache.misses == len(runs)
    assert len(cache) <= 16


# ------------------------------------------------------------------ limits of local scoring (issue 17 #7)

PRINTF_BOMB = "SELECT length(printf('%.*c', 2147483647, 'x'))"
# json_group_array grows one buffer (SQLite 3.40 checks the length limit only at the end); 40,000
# rows of 30 kB would take an uncapped process to 1.2 GB.
JSON_BALLOON = (
    "SELECT length(json_group_array(x)) FROM (WITH RECURSIVE r(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM r "
    "LIMIT 40000) SELECT hex(zeroblob(15000)) AS x FROM r)"
)


def test_printf_bomb_is_refused_at_once(db: Path) -> None:
    """One VM instruction of 2**31 appends (10-90 s): the progress handler never runs during it."""
    import time

    start = time.monotonic()
    breakdown = score_answer(PRINTF_BOMB, GOLD, db, format_ok=True, timeout_s=1.0)
    assert time.monotonic() - start < 5.0
    assert not breakdown.solved and "too large" in (breakdown.pred_error or "")
    # printf still answers like SQLite's own within the limits (the guard delegates to it).
    fine = "SELECT printf('%5.2f|%-4d|%c|%.3s|%*d|%q', 3.14159, 42, 'xyz', 'abcdef', 6, 7, 'it''s')"
    from skyrl_tool_agent.rewards import limits

    expected = sqlite3.connect(":memory:").execute(fine).fetchall()
    assert limits.run_bounded(db, fine, timeout_s=5.0, max_rows=None).rows == expected
    assert execution_match(fine, fine, db)


def test_a_stall_inside_sqlite_is_bounded_by_the_wall_clock(db: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Whatever one instruction does, the caller gets a timeout at timeout_s + the grace period."""
    import time

    from mcp_tools.sandbox import SandboxError, open_readonly
    from skyrl_tool_agent.rewards import limits

    def stalling_connection(path: Path):  # a real sandboxed connection plus one 4 s instruction
        conn = open_readonly(path)
        conn.create_function("stall", 0, lambda: time.sleep(4) or 1)
        return conn

    monkeypatch.setattr(limits, "open_readonly", stalling_connection)
    start = time.monotonic()
    with pytest.raises(SandboxError, match="timeout") as caught:
        limits.run_bounded(db, "SELECT stall()", timeout_s=0.2, max_rows=None)
    assert time.monotonic() - start < limits.CPU_CLOCK_WALL_FACTOR * 0.2 + limits.WALL_CLOCK_GRACE_S + 1.5
    assert caught.value.kind == "timeout"


def test_predictions_cannot_lift_the_limits(db: Path) -> None:
    for pred in ("PRAGMA hard_heap_limit=0", "PRAGMA temp_store=FILE", "PRAGMA query_only=OFF",
                 "ATTACH ':memory:' AS x", "SELECT load_extension('x')"):
        breakdown = score_answer(pred, GOLD, db, format_ok=True)
        assert not breakdown.solved and breakdown.pred_error, pred
    from skyrl_tool_agent.rewards import limits

    heap = sqlite3.connect(":memory:").execute("PRAGMA hard_heap_limit").fetchone()[0]
    assert 0 < heap <= limits.MEMORY_LIMIT_MB << 20


def test_memory_balloon_in_scoring_stays_under_the_heap_cap(db: Path, repo_root: Path) -> None:
    """In a child process (the cap is process-wide; its peak RSS is the measure): the trainer's
    process must not grow past the SQLite heap cap (256 MiB) plus its own objects."""
    import json
    import subprocess
    import sys

    script = (
        "import json, resource, sys, time\n"
        "from skyrl_tool_agent.rewards import score_answer\n"
        "before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
        "start = time.monotonic()\n"
        "r = score_answer(sys.argv[2], 'SELECT 1', sys.argv[1], format_ok=True, timeout_s=120)\n"
        "grew = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024\n"
        "print(json.dumps({'grew_mb': grew, 'error': r.pred_error, 's': time.monotonic() - start}))\n"
    )
    done = subprocess.run([sys.executable, "-c", script, str(db), JSON_BALLOON], check=False, capture_output=True,
                          text=True, cwd=repo_root, timeout=500)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout.splitlines()[-1])
    assert report["grew_mb"] < 400, report
    assert "too large" in (report["error"] or ""), report
