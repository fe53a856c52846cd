"""Issue 28 #2: scoring inside the trainer holds the server's limits.

A short prediction must not take the trainer's memory to gigabytes (rows of another width are
refused before any is fetched; fetches stop at a size a match could have), and partial credit is
bounded in input size. Real SQLite files; the memory check runs in a fresh process.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
ROWS = 150
GOLD = "SELECT i FROM t"
#: 63 references to one 30,000-character value, on every one of gold's rows plus one: 285 MB of
#: Python strings when fetched (the finding: a 737-character answer added 1.25 GB).
WIDE = ("WITH w(x) AS (SELECT printf('%.30000c', 'x')) SELECT " + ", ".join(["x"] * 63) + " FROM w, t")
#: The same value once per row: one column, like gold, but 30,000 times gold's size per row.
TALL = "WITH w(x) AS (SELECT printf('%.30000c', 'x')) SELECT x FROM w, t"


@pytest.fixture
def db(tmp_path: Path) -> Path:
    path = tmp_path / "t.sqlite"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE t (i INTEGER)")
        conn.executemany("INSERT INTO t VALUES (?)", [(i,) for i in range(ROWS)])
    return path


def _peak_rss_growth_mb(db: Path, pred: str) -> tuple[float, dict]:
    script = f"""
import json, resource, sys
from skyrl_tool_agent.rewards.execution import compare_execution
compare_execution("SELECT 1", "SELECT 1", {str(db)!r})  # imports and the heap cap, before measuring
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
c = compare_execution({pred!r}, {GOLD!r}, {str(db)!r})
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({{"growth_mb": (after - before) / 1024, "match": c.match, "error": c.pred_error}}))
"""
    res = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    return out["growth_mb"], out


def test_a_wide_answer_is_refused_before_its_rows_are_fetched(db: Path) -> None:
    growth, out = _peak_rss_growth_mb(db, WIDE)
    assert out["match"] is False and out["error"] is None  # it ran: a wrong answer, not a failed one
    assert growth < 40, f"scoring the 63-column answer raised the trainer's peak RSS by {growth:.0f} MB"


def test_a_tall_answer_stops_at_the_size_a_match_could_have(db: Path) -> None:
    from mcp_tools.sandbox import run_query
    from skyrl_tool_agent.rewards.execution import PRED_CHARS_SLACK, compare_execution, result_chars

    comparison = compare_execution(TALL, GOLD, db)
    assert comparison.match is False and comparison.pred_error is None
    gold = run_query(db, GOLD, max_rows=None)
    assert result_chars(gold) == 8 * ROWS
    capped = run_query(db, TALL, max_rows=ROWS + 1, max_chars=2 * result_chars(gold) + PRED_CHARS_SLACK)
    assert capped.truncated and capped.row_count <= 3
    # A correct answer of another spelling still matches under the caps.
    assert compare_execution("SELECT i FROM t ORDER BY i DESC", GOLD, db).match


def test_partial_credit_is_bounded_in_input_size() -> None:
    from skyrl_tool_agent.rewards.partial import partial_credit
    from skyrl_tool_agent.rewards.sqlnorm import MAX_SQL_CHARS

    gold = "SELECT name FROM singer WHERE age > 20"
    huge = "SELECT " + ", ".join(f"a{i} + b{i}" for i in range(1000)) + " FROM singer WHERE age > 20"
    assert 12_000 < len(huge) < 20_000  # parsed by the old 20,000-character bound (0.2-4 s)
    start = time.process_time()
    assert partial_credit(huge, gold) == 0.0
    assert time.process_time() - start < 0.05
    assert MAX_SQL_CHARS <= 8_000
    assert partial_credit("SELECT name FROM singer WHERE age > 30", gold) > 0.5
