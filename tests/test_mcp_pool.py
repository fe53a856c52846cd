"""The MCP client pool against real SQLite server processes: routing, errors, crashes, hangs, shutdown."""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from skyrl_tool_agent.config import MCPServerConfig
from skyrl_tool_agent.mcp.pool import (
    BackgroundMCPPool,
    MCPClientPool,
    MCPConfigError,
    MCPPoolClosed,
    MCPPoolError,
    MCPServerUnavailable,
    MCPToolNotFound,
    ToolResult,
)

REPO_ROOT = Path(__file__).resolve().parents[1]
SLOW_SQL = "WITH RECURSIVE r(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM r LIMIT 300000) SELECT count(*) FROM r"


def make_db(path: Path, rows: int) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA synchronous = OFF")
    conn.execute("CREATE TABLE item(id INTEGER PRIMARY KEY, label TEXT)")
    conn.executemany("INSERT INTO item VALUES (?, ?)", [(i, f"item {i}") for i in range(1, rows + 1)])
    conn.commit()
    conn.close()
    return path


@pytest.fixture(scope="module")
def dbs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("pool")
    return make_db(root / "a.sqlite", 5), make_db(root / "b.sqlite", 7)


def spec(db: Path, name: str = "sqlite", **kwargs) -> MCPServerConfig:
    args = ["-m", "mcp_tools.sqlite_server", "--db", str(db), "--timeout-s", "2"]
    return MCPServerConfig(name=name, command=sys.executable, args=args, cwd=str(REPO_ROOT), **kwargs)


def children() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)}


def assert_no_new_children(before: set[int]) -> None:
    deadline = time.monotonic() + 5
    while (extra := children() - before) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not extra, f"leftover child processes: {extra}"


async def call_until_served(pool: MCPClientPool, arguments: dict, within_s: float = 20.0) -> ToolResult:
    """Retry on MCPServerUnavailable (what callers do) until the respawned server answers."""
    deadline = time.monotonic() + within_s
    while True:
        try:
            return await pool.call_tool("execute_sql", arguments)
        except MCPServerUnavailable:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.1)


@pytest.mark.anyio
async def test_routing_results_and_tool_errors(dbs: tuple[Path, Path]) -> None:
    before = children()
    async with MCPClientPool([spec(dbs[0])], call_timeout_s=5) as pool:
        tools = pool.tools
        assert {t.name for t in tools} == {"list_tables", "describe_table", "sample_rows", "get_schema", "execute_sql"}
        assert all(t.server == "sqlite" and t.input_schema["type"] == "object" for t in tools)

        result = await pool.call_tool("execute_sql", {"sql": "SELECT count(*) AS n FROM item"})
        assert result == ToolResult(text="n\n5", is_error=False)
        denied = await pool.call_tool("execute_sql", {"sql": "DROP TABLE item"})
        assert denied.is_error and denied.text == "denied: schema changes are not allowed (DROP)"
        bad_args = await pool.call_tool("execute_sql", {"sql": "SELECT '\ud800'"})
        assert bad_args.is_error and "UTF-8" in bad_args.text
        assert (await pool.call_tool("execute_sql", "SELECT 1")).is_error  # type: ignore[arg-type]
        with pytest.raises(MCPToolNotFound, match="execute_sql"):
            await pool.call_tool("drop_database", {})
        # The session survived all of that.
        assert (await pool.call_tool("list_tables", {})).text == "item"
    assert_no_new_children(before)
    with pytest.raises(MCPPoolClosed):
        await pool.call_tool("list_tables", {})


@pytest.mark.anyio
async def test_duplicate_tool_names_are_an_error_unless_prefixed(dbs: tuple[Path, Path]) -> None:
    before = children()
    with pytest.raises(MCPConfigError, match="tool_prefix"):
        await MCPClientPool([spec(dbs[0], "a"), spec(dbs[1], "b")]).start()
    assert_no_new_children(before)
    async with MCPClientPool([spec(dbs[0], "a"), spec(dbs[1], "b", tool_prefix="b_")]) as pool:
        names = {t.name: t.server for t in pool.tools}
        assert names["execute_sql"] == "a" and names["b_execute_sql"] == "b" and len(names) == 10
        query = {"sql": "SELECT count(*) FROM item"}
        assert (await pool.call_tool("execute_sql", query)).text.endswith("\n5")
        assert (await pool.call_tool("b_execute_sql", query)).text.endswith("\n7")
    assert_no_new_children(before)


@pytest.mark.anyio
async def test_concurrent_calls_over_two_sessions(dbs: tuple[Path, Path]) -> None:
    before = children()
    async with MCPClientPool([spec(dbs[0])], sessions_per_server=2) as pool:
        pids = pool.server_pids()["sqlite"]
        assert len(set(pids)) == 2 and None not in pids
        results = await asyncio.gather(
            *(
                pool.call_tool("execute_sql", {"sql": f"SELECT label FROM item WHERE id = {i % 5 + 1}"})
                for i in range(200)
            )
        )
        assert [r.text for r in results] == [f"label\nitem {i % 5 + 1}" for i in range(200)]
    assert_no_new_children(before)


@pytest.mark.anyio
async def test_sigkill_with_calls_in_flight(dbs: tuple[Path, Path]) -> None:
    """50 calls in flight when the server is killed: each ends cleanly in time; the pool respawns."""
    before = children()
    timeout_s = 5.0
    async with MCPClientPool([spec(dbs[0])], call_timeout_s=timeout_s) as pool:
        (old_pid,) = pool.server_pids()["sqlite"]

        async def one() -> tuple[str, float]:
            start = time.monotonic()
            try:
                result = await pool.call_tool("execute_sql", {"sql": SLOW_SQL})
                outcome = "tool_error" if result.is_error else "ok"
            except MCPServerUnavailable:
                outcome = "unavailable"
            return outcome, time.monotonic() - start

        tasks = [asyncio.create_task(one()) for _ in range(50)]
        await asyncio.sleep(0.3)
        os.kill(old_pid, signal.SIGKILL)
        outcomes = await asyncio.gather(*tasks)
        assert all(elapsed < timeout_s + 0.5 for _, elapsed in outcomes)
        kinds = [kind for kind, _ in outcomes]
        assert set(kinds) <= {"ok", "unavailable"} and kinds.count("unavailable") >= 1

        result = await call_until_served(pool, {"sql": "SELECT count(*) FROM item"})
        assert result.text.endswith("\n5")
        (new_pid,) = pool.server_pids()["sqlite"]
        assert new_pid not in (None, old_pid) and not psutil.pid_exists(old_pid)
    assert_no_new_children(before)


@pytest.mark.anyio
async def test_hung_server_times_out_and_is_replaced(dbs: tuple[Path, Path]) -> None:
    before = children()
    async with MCPClientPool([spec(dbs[0])], call_timeout_s=5, ping_timeout_s=0.5) as pool:
        (old_pid,) = pool.server_pids()["sqlite"]
        os.kill(old_pid, signal.SIGSTOP)
        start = time.monotonic()
        with pytest.raises(MCPServerUnavailable, match="no answer"):
            await pool.call_tool("list_tables", {}, timeout_s=0.5)
        assert time.monotonic() - start < 1.0
        # The failed ping gets the stopped process killed and replaced (a call that lands on the
        # hung session before that fails as unavailable, so retry like a caller would).
        result = await call_until_served(pool, {"sql": "SELECT count(*) FROM item"})
        assert result.text.endswith("\n5")
        assert pool.server_pids()["sqlite"][0] != old_pid and not psutil.pid_exists(old_pid)
    assert_no_new_children(before)


@pytest.mark.anyio
async def test_server_that_fails_to_start_is_a_config_error() -> None:
    before = children()
    crashing = MCPServerConfig(name="crash", command=sys.executable, args=["-c", "import sys; sys.exit(3)"])
    with pytest.raises(MCPConfigError, match="crash"):
        await MCPClientPool([crashing], startup_timeout_s=5).start()
    silent = MCPServerConfig(name="silent", command=sys.executable, args=["-c", "import time; time.sleep(60)"])
    start = time.monotonic()
    with pytest.raises(MCPConfigError, match="silent"):
        await MCPClientPool([silent], startup_timeout_s=0.5).start()
    assert time.monotonic() - start < 8
    assert_no_new_children(before)


def test_background_pool_from_threads_and_other_loops(dbs: tuple[Path, Path]) -> None:
    before = children()
    with BackgroundMCPPool([spec(dbs[0])], call_timeout_s=5) as pool:
        assert "execute_sql" in {t.name for t in pool.list_tools()}

        def blocking(sql: str) -> str:  # a sync caller's blocking call, from a thread not the pool's
            return pool.run(pool.pool.call_tool("execute_sql", {"sql": sql})).text

        assert blocking("SELECT 40 + 2 AS x") == "x\n42"

        async def on_another_loop() -> list[str]:
            results = await asyncio.gather(
                *(asyncio.wrap_future(pool.submit(pool.pool.call_tool("execute_sql", {"sql": f"SELECT {i} AS v"})))
                  for i in range(20))
            )
            return [r.text for r in results]

        assert asyncio.run(on_another_loop()) == [f"v\n{i}" for i in range(20)]

        errors: list[BaseException] = []

        def worker(k: int) -> None:
            try:
                for i in range(10):
                    value = k * 100 + i
                    assert blocking(f"SELECT {value} AS v") == f"v\n{value}"
                assert asyncio.run(on_another_loop())[-1] == "v\n19"
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

        threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors
    pool.close()  # idempotent
    assert_no_new_children(before)
    with pytest.raises(MCPPoolClosed):
        pool.run(pool.pool.call_tool("list_tables", {}))
    assert issubclass(MCPServerUnavailable, MCPPoolError) and issubclass(MCPPoolClosed, MCPPoolError)


@pytest.mark.anyio
async def test_hung_server_leaves_rotation_at_its_first_timeout(dbs: tuple[Path, Path]) -> None:
    """Issue 17 #9: after one timeout, retries go to the healthy server, not to the hung one that
    still looks ready while its ping is pending (a 25 s SIGSTOP lost episodes that way)."""
    before = children()
    # The ping window (ping_timeout_s) must outlast the calls made inside it; generous call timeouts
    # for the healthy server (a loaded 2-core machine can be slow), a short one for the stopped one.
    async with MCPClientPool([spec(dbs[0])], sessions_per_server=2, call_timeout_s=30, ping_timeout_s=60,
                             startup_timeout_s=300) as pool:
        hung, healthy = pool.server_pids()["sqlite"]
        os.kill(hung, signal.SIGSTOP)
        try:
            with pytest.raises(MCPServerUnavailable, match="no answer"):  # round-robin starts at slot 0
                await pool.call_tool("list_tables", {}, timeout_s=0.5)
            started = time.monotonic()
            for _ in range(10):  # inside the ping window: none may go to the stopped server
                assert (await pool.call_tool("list_tables", {}, timeout_s=30)).text == "item"
            assert time.monotonic() - started < 60, "calls outlasted the ping window; the test proves nothing"
            assert pool.server_pids()["sqlite"] == [hung, healthy]
        finally:
            os.kill(hung, signal.SIGCONT)
        results = await asyncio.gather(*(pool.call_tool("list_tables", {}, timeout_s=60) for _ in range(4)))
        assert [r.text for r in results] == ["item"] * 4
    assert_no_new_children(before)


@pytest.mark.anyio
async def test_server_that_recovers_returns_to_rotation(dbs: tuple[Path, Path]) -> None:
    """Out of rotation until healthy: a call made meanwhile waits (it is not sent to the stopped
    server), and a server that answers the ping again is kept, not replaced."""
    before = children()
    async with MCPClientPool([spec(dbs[0])], call_timeout_s=30, ping_timeout_s=60, startup_timeout_s=300) as pool:
        (pid,) = pool.server_pids()["sqlite"]
        os.kill(pid, signal.SIGSTOP)
        try:
            with pytest.raises(MCPServerUnavailable, match="no answer"):
                await pool.call_tool("list_tables", {}, timeout_s=0.5)
            waiting = asyncio.create_task(pool.call_tool("execute_sql", {"sql": "SELECT count(*) FROM item"}, timeout_s=90))
            await asyncio.sleep(0.5)
            assert not waiting.done()
        finally:
            os.kill(pid, signal.SIGCONT)
        assert (await waiting).text.endswith("\n5")
        assert pool.server_pids()["sqlite"] == [pid]
    assert_no_new_children(before)
