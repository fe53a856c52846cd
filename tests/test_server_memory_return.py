"""A server's memory (issue 28), through a real server process: the RSS cap holds for the whole
process, and memory a large query freed goes back to the OS after the call.

A window-function query over a large CTE makes SQLite's sorter and temp b-tree grow the process
~1.5 x what SQLite's heap counts (malloc's overhead on many small records), so before the RSS
watch (`process_memory.memory_victim`) a server under a 128 MB cap peaked at +191 MiB (and +384
MiB under the default 256). glibc keeps the freed pages: before `process_memory.release_freed_memory`
the server stayed at its peak (71 -> 346 MiB, and -> 455 MiB for a query that hit the cap) for good.
Peaks are read from /proc/<pid>/status (VmHWM), reset before each query.
"""

from __future__ import annotations

import sys
from pathlib import Path

import anyio
import pytest

from tests.fixtures.live_server import reset_peak, sqlite_server, status_bytes
from tests.hostile_sql import make_hostile_db

MEMORY_MB = 256
#: RSS allowed above the pre-query level once the call answered. Measured: back within 1 MiB of
#: idle with the trim, +275 MiB (+384 MiB past the cap) without it.
RETURN_BOUND_MB = 64
#: How far the peak RSS may pass the cap over the idle footprint: the watch reads RSS every 10 ms,
#: and on a busy machine its thread may wait longer for a core. Measured: +1 MiB on 2 cores, one
#: of them busy with another job.
CAP_TOLERANCE_MB = 32
CHEAP = "SELECT count(*) FROM singer"
CHEAP_ANSWER = "count(*)\n41"
#: ~46 bytes of RSS per row (sorter and temp b-tree), ~0.4 s of CPU per million rows.
_WINDOW = ("WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c LIMIT {n}) "
           "SELECT x, sum(x) OVER (ORDER BY -x ROWS BETWEEN 1000 PRECEDING AND CURRENT ROW) FROM c")
LARGE_QUERIES = [("fits", _WINDOW.format(n=4_500_000), False), ("past_cap", _WINDOW.format(n=12_000_000), True)]
#: Queries past a 128 MB cap: the window (old code: +191 MiB, stopped by SQLite's heap cap), a
#: sort of 3 M random keys (old code: answered, +137 MiB: its heap fits the cap, its RSS does not).
OVER_128 = [("window", _WINDOW.format(n=12_000_000)),
            ("sort", "SELECT i FROM (WITH RECURSIVE r(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM r LIMIT 3000000) "
                     "SELECT i FROM r) ORDER BY random()")]
#: A query that needs CPU, not memory (~1 s), run beside the memory bomb: it must keep its answer.
BUSY = "WITH RECURSIVE r(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM r LIMIT 3000000) SELECT count(*) FROM r"

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.timeout(300),
    pytest.mark.skipif(sys.platform != "linux", reason="RSS from /proc; malloc_trim is glibc's"),
]


@pytest.fixture
def db_root(tmp_path: Path) -> Path:
    make_hostile_db(tmp_path / "demo").rename(tmp_path / "demo" / "demo.sqlite")
    return tmp_path


async def _sql(session, sql: str) -> tuple[str, bool]:
    result = await session.call_tool("execute_sql", {"db_id": "demo", "sql": sql})
    return result.content[0].text, bool(result.is_error)


@pytest.mark.parametrize(("name", "sql", "fails"), LARGE_QUERIES, ids=[q[0] for q in LARGE_QUERIES])
async def test_large_query_memory_is_returned(db_root: Path, name: str, sql: str, fails: bool) -> None:
    async with sqlite_server(db_root, "--timeout-s", "30", "--memory-limit-mb", str(MEMORY_MB)) as (session, proc):
        assert await _sql(session, CHEAP) == (CHEAP_ANSWER, False)
        before = status_bytes(proc.pid, "VmRSS")
        reset_peak(proc.pid)
        text, err = await _sql(session, sql)
        peak, after = status_bytes(proc.pid, "VmHWM"), status_bytes(proc.pid, "VmRSS")
        assert err == fails, text
        assert ("memory limit (256 MB)" in text) if fails else text.startswith("x | sum(x) OVER")
        # The query really grew the heap (else the check below proves nothing), within the cap.
        assert 128 << 20 < peak - before < (MEMORY_MB + CAP_TOLERANCE_MB) << 20, (before >> 20, peak >> 20)
        assert after - before < RETURN_BOUND_MB << 20, (
            f"{name}: RSS {before >> 20} MiB before, {peak >> 20} peak, {after >> 20} after the call")
        # No lost request: the next cheap call answers, correctly.
        assert await _sql(session, CHEAP) == (CHEAP_ANSWER, False)


@pytest.mark.parametrize(("name", "sql"), OVER_128, ids=[q[0] for q in OVER_128])
async def test_rss_cap_covers_the_whole_process(db_root: Path, name: str, sql: str) -> None:
    """--memory-limit-mb 128: the query that would grow the server's RSS past its idle footprint +
    128 MiB is stopped with the memory error, the peak RSS stays under that + CAP_TOLERANCE_MB, a
    query beside it that needs CPU and no memory keeps its answer, and the next call works."""
    cap = 128
    async with sqlite_server(db_root, "--timeout-s", "60", "--memory-limit-mb", str(cap)) as (session, proc):
        assert await _sql(session, CHEAP) == (CHEAP_ANSWER, False)
        idle = status_bytes(proc.pid, "VmRSS")
        reset_peak(proc.pid)
        answers: dict[str, tuple[str, bool]] = {}

        async def call(key: str, query: str) -> None:
            answers[key] = await _sql(session, query)

        async with anyio.create_task_group() as tg:
            tg.start_soon(call, "busy", BUSY)
            tg.start_soon(call, "large", sql)
        peak = status_bytes(proc.pid, "VmHWM")
        assert answers["large"] == (f"too large: query exceeded the server's memory limit ({cap} MB)", True)
        assert peak - idle < (cap + CAP_TOLERANCE_MB) << 20, f"{name}: idle {idle >> 20} MiB, peak {peak >> 20} MiB"
        assert answers["busy"] == ("count(*)\n3000000", False)
        assert status_bytes(proc.pid, "VmRSS") - idle < RETURN_BOUND_MB << 20
        assert await _sql(session, CHEAP) == (CHEAP_ANSWER, False)
