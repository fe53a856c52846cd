"""Issue 28 #3 and #5: a query's time limit ends the query, and scoring limits count CPU time.

Real SQLite files; a real server process through the official MCP client. Each hostile query
here costs at most ~2.5 s of CPU on the old code and ~0.5 s now.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import psutil
import pytest
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

from mcp_tools.sandbox import SandboxError, open_readonly, run_query
from tests.hostile_sql import make_hostile_db

REPO_ROOT = Path(__file__).resolve().parents[1]

#: One row of 1,000 columns, 6,000 calls of instr() in all: no loop, so SQLite never runs its
#: progress handler (nor looks at the interrupt flag) between them. Each call is within the
#: per-call work bound (16,001 x 3,001); all of them take ~2.5 s of CPU.
STRAIGHT_LINE = ("WITH a(x, y) AS (SELECT hex(zeroblob(8000)) || 'b', substr(hex(zeroblob(2000)), 1, 3000) || 'b') "
                 "SELECT " + ", ".join(["+".join(["instr(x,y)"] * 6)] * 1000) + " FROM a")


@pytest.fixture(scope="module")
def db_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("deadline_root")
    make_hostile_db(root / "demo").rename(root / "demo" / "demo.sqlite")
    return root


def test_a_straight_line_query_stops_at_its_deadline(db_root: Path) -> None:
    """Called directly with a 0.3 s limit: old code ran the whole statement and returned its row."""
    conn = open_readonly(db_root / "demo" / "demo.sqlite")
    try:
        start = time.monotonic()
        with pytest.raises(SandboxError) as caught:
            run_query(conn, STRAIGHT_LINE, timeout_s=0.3)
        elapsed = time.monotonic() - start
        assert caught.value.kind == "timeout", caught.value
        assert elapsed < 0.3 + 0.5, elapsed
        assert run_query(conn, "SELECT instr('abc', 'c'), replace('aXa', 'X', 'b')").rows == [(3, "aba")]
    finally:
        conn.close()


@pytest.mark.anyio
@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc")
async def test_server_burns_no_cpu_after_answering_timeout(db_root: Path) -> None:
    """Through a real server (timeout 0.5 s): the answer is "timeout" and the worker thread stops
    with it. Measured: the server's CPU time in the 2 s after the answer (old code: ~1.9 s)."""
    args = ["-m", "mcp_tools.sqlite_server", "--db-root", str(db_root), "--timeout-s", "0.5"]
    params = StdioServerParameters(command=sys.executable, args=args, cwd=str(REPO_ROOT), env=dict(os.environ))
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        (proc,) = [p for p in psutil.Process().children(recursive=True)
                   if "mcp_tools.sqlite_server" in " ".join(p.cmdline()) and str(db_root) in " ".join(p.cmdline())]
        ok = await session.call_tool("execute_sql", {"db_id": "demo", "sql": "SELECT count(*) FROM singer"})
        assert not ok.is_error
        start = time.monotonic()
        result = await session.call_tool("execute_sql", {"db_id": "demo", "sql": STRAIGHT_LINE})
        answered = time.monotonic() - start
        cpu_at_answer = sum(proc.cpu_times()[:2])
        time.sleep(2.0)
        burned_after = sum(proc.cpu_times()[:2]) - cpu_at_answer
        print(f"answered in {answered:.2f} s; server CPU in the 2 s after the answer: {burned_after:.2f} s")
        assert result.is_error and result.content[0].text.startswith("timeout"), result.content[0].text
        assert answered < 0.5 + 2.0  # loaded 2-core CI machines deliver late; the CPU figure is the point
        assert burned_after < 0.3, f"the server burned {burned_after:.2f} CPU-s after answering timeout"


def test_scoring_deadline_counts_cpu_time_not_waiting(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A busy machine is time the query's thread does not run: modelled by a function that waits
    0.25 s per row (no CPU). Three rows take 0.75 s of wall time but almost no CPU: under a 0.5 s
    limit the scoring query finishes (old code: timeout, so a correct answer scored 0)."""
    from skyrl_tool_agent.rewards import limits

    db = make_hostile_db(tmp_path / "demo")

    def waiting_connection(path: Path):
        conn = open_readonly(path)
        conn.create_function("wait", 1, lambda v: time.sleep(0.25) or v)
        return conn

    monkeypatch.setattr(limits, "open_readonly", waiting_connection)
    sql = "SELECT wait(i) FROM (SELECT 1 AS i UNION ALL SELECT 2 UNION ALL SELECT 3)"
    assert limits.run_bounded(db, sql, timeout_s=0.5, max_rows=None).rows == [(1,), (2,), (3,)]
    # CPU that is really spent still ends the query at its limit.
    start = time.monotonic()
    with pytest.raises(SandboxError, match="timeout"):
        limits.run_bounded(db, "WITH RECURSIVE r(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM r) "
                               "SELECT count(*) FROM r", timeout_s=0.3, max_rows=None)
    assert time.monotonic() - start < 0.3 * getattr(limits, "CPU_CLOCK_WALL_FACTOR", 1.0) + 0.5
