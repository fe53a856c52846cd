"""The SQLite MCP server (mcp_tools.sqlite_server) as a real stdio process, through the official client."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import psutil
import pytest
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

from tests.hostile_sql import DENIED, MUST_FAIL, hostile_corpus, make_hostile_db, tree_state

REPO_ROOT = Path(__file__).resolve().parents[1]
SERVER = [sys.executable, "-m", "mcp_tools.sqlite_server"]
TOOLS = {"list_tables", "describe_table", "sample_rows", "get_schema", "execute_sql"}

pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def db_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Spider layout: <root>/demo/demo.sqlite (+ other.sqlite next to it, for ATTACH attempts)."""
    root = tmp_path_factory.mktemp("dbroot")
    db = make_hostile_db(root / "demo")
    db.rename(root / "demo" / "demo.sqlite")
    make_hostile_db(root / "second").rename(root / "second" / "second.sqlite")
    return root


@asynccontextmanager
async def server(*args: str) -> AsyncIterator[ClientSession]:
    """A started server and an initialized client session (opened inside the test, not a fixture)."""
    params = StdioServerParameters(command=SERVER[0], args=[*SERVER[1:], *args], cwd=str(REPO_ROOT))
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        yield session


def server_processes(db_root: Path) -> list[psutil.Process]:
    """This test's server processes (other tests' shared env runtimes may still be alive)."""
    return [
        p for p in psutil.Process().children(recursive=True)
        if "mcp_tools.sqlite_server" in (cmd := " ".join(p.cmdline())) and str(db_root) in cmd
    ]


async def call(session: ClientSession, tool: str, **arguments: Any) -> tuple[str, bool, dict | None]:
    result = await session.call_tool(tool, arguments)
    return result.content[0].text, bool(result.is_error), result.structured_content


async def test_tools_schema_and_exploration(db_root: Path) -> None:
    async with server("--db-root", str(db_root)) as session:
        tools = {t.name: t for t in (await session.list_tools()).tools}
        assert set(tools) == TOOLS
        for tool in tools.values():
            assert tool.description and len(tool.description) <= 80  # rendered into a small model's prompt
            assert "db_id" in tool.input_schema["required"]
        assert tools["execute_sql"].input_schema["required"] == ["db_id", "sql"]

        text, err, _ = await call(session, "list_tables", db_id="demo")
        assert (text, err) == ("singer, concert, singer_in_concert, older", False)

        text, err, _ = await call(session, "describe_table", db_id="demo", table="SINGER_IN_CONCERT")
        assert not err
        assert text.splitlines() == [
            "singer_in_concert: 40 rows",
            "concert_id INT PK FK->concert.concert_id",
            "singer_id INT PK FK->singer.singer_id",
        ]

        text, err, _ = await call(session, "get_schema", db_id="demo")
        assert not err
        assert text.splitlines()[0] == "singer(singer_id INTEGER PK, name TEXT, country TEXT, age INT)"
        assert len(text.splitlines()) == 4

        text, err, structured = await call(session, "sample_rows", db_id="demo", table="singer", n=500)
        assert not err and structured is not None
        assert structured["row_count"] == 20  # n is capped
        assert text.splitlines()[0] == "singer_id | name | country | age"
        assert text.splitlines()[1] == "1 | singer 1 | Peru | 21"


async def test_execute_sql_results_truncation_and_errors(db_root: Path) -> None:
    async with server("--db-root", str(db_root), "--max-rows", "5", "--timeout-s", "0.5") as session:
        text, err, structured = await call(
            session, "execute_sql", db_id="demo", sql="SELECT title, year FROM concert WHERE year < 2003 ORDER BY year"
        )
        assert not err
        assert text == "title | year\nconcert 1 | 2001\nconcert 2 | 2002"
        assert structured == {
            "columns": ["title", "year"],
            "rows": [["concert 1", 2001], ["concert 2", 2002]],
            "row_count": 2,
            "truncated": False,
        }

        text, err, structured = await call(session, "execute_sql", db_id="demo", sql="SELECT singer_id FROM singer")
        assert structured is not None and structured["truncated"] and structured["row_count"] == 5
        assert text.splitlines()[-1].startswith("... truncated")
        assert len(text.splitlines()) == 7

        text, err, _ = await call(session, "execute_sql", db_id="demo", sql="SELECT name FROM singer WHERE 0")
        assert (text, err) == ("name\n(no rows)", False)

        text, err, _ = await call(session, "execute_sql", db_id="demo", sql="DELETE FROM singer")
        assert (text, err) == ("denied: write operations are not allowed (DELETE)", True)

        text, err, _ = await call(session, "execute_sql", db_id="dmeo", sql="SELECT 1")
        assert err and text.startswith("unknown db_id 'dmeo'. Did you mean: demo?") and "second" in text

        text, err, _ = await call(session, "describe_table", db_id="demo", table="singers")
        assert err and "Did you mean: singer?" in text and "concert" in text

        text, err, _ = await call(session, "execute_sql", db_id="demo", sql="SELECT nme FROM singer")
        assert (text, err) == ("SQL error: no such column: nme", True)

        start = time.monotonic()
        endless = "WITH RECURSIVE r(i) AS (SELECT 1 UNION ALL SELECT i+1 FROM r) SELECT count(*) FROM r"
        text, err, _ = await call(session, "execute_sql", db_id="demo", sql=endless)
        assert err and text.startswith("timeout:") and time.monotonic() - start < 1.0

        result = await session.call_tool("execute_sql", {"db_id": "demo"})  # missing argument
        assert result.is_error and "sql" in result.content[0].text


async def test_single_database_mode(db_root: Path) -> None:
    async with server("--db", str(db_root / "demo" / "demo.sqlite")) as session:
        tools = {t.name: t for t in (await session.list_tools()).tools}
        assert tools["execute_sql"].input_schema["required"] == ["sql"]
        assert "db_id" not in tools["list_tables"].input_schema.get("required", [])
        text, err, _ = await call(session, "execute_sql", sql="SELECT count(*) FROM concert")
        assert (text, err) == ("count(*)\n10", False)
        text, err, _ = await call(session, "describe_table", db_id="anything", table="concert")
        assert not err and text.startswith("concert: 10 rows")


async def test_hostile_corpus_through_the_server(db_root: Path) -> None:
    """A few hundred corpus inputs over MCP: files unchanged, every answer in time, server alive."""
    before = tree_state(db_root)
    corpus = hostile_corpus(db_root / "demo")
    # Lone surrogates cannot be encoded as JSON text at all (see the raw JSON-RPC test).
    sendable = [(c, s) for c, s in corpus if not any(0xD800 <= ord(ch) <= 0xDFFF for ch in s)]
    runaway = [item for item in sendable if item[0] == "runaway"][:4]
    sample = sendable[::6] + runaway
    assert len(sample) >= 300
    async with server("--db-root", str(db_root), "--timeout-s", "0.5") as session:
        (proc,) = server_processes(db_root)
        for category, sql in sample:
            start = time.monotonic()
            text, err, _ = await call(session, "execute_sql", db_id="demo", sql=sql)
            assert time.monotonic() - start < 1.0, (category, sql[:200])
            if category in DENIED:
                assert err and text.startswith("denied"), (category, sql[:200], text)
            elif category in MUST_FAIL:
                assert err, (category, sql[:200])
        assert proc.is_running() and server_processes(db_root) == [proc]
        text, err, _ = await call(session, "execute_sql", db_id="demo", sql="SELECT count(*) FROM singer")
        assert (text, err) == ("count(*)\n41", False)
    assert tree_state(db_root) == before


async def _rpc(proc: asyncio.subprocess.Process, message: dict[str, Any] | bytes) -> None:
    assert proc.stdin is not None
    data = message if isinstance(message, bytes) else json.dumps(message).encode() + b"\n"
    proc.stdin.write(data)
    await proc.stdin.drain()


async def _response(proc: asyncio.subprocess.Process, request_id: int) -> dict[str, Any]:
    assert proc.stdout is not None
    while True:
        line = await asyncio.wait_for(proc.stdout.readline(), timeout=10)
        assert line, "server closed stdout"
        message = json.loads(line)
        if message.get("id") == request_id:
            return message


async def test_raw_garbage_on_the_wire_does_not_kill_the_server(db_root: Path) -> None:
    proc = await asyncio.create_subprocess_exec(
        *SERVER, "--db-root", str(db_root), cwd=REPO_ROOT, stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL, limit=2**20,
    )
    try:
        init = {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}
        await _rpc(proc, {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": init})
        assert "result" in await _response(proc, 1)
        await _rpc(proc, {"jsonrpc": "2.0", "method": "notifications/initialized"})
        call = {"name": "execute_sql", "arguments": {"db_id": "demo", "sql": "SELECT count(*) FROM concert"}}
        for garbage in (
            b"not json at all\n",
            b"\xff\xfe\xfd invalid utf-8\n",
            b'{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"execute_sql","arguments":'
            b'{"db_id":"demo","sql":"SELECT \'\xff\xfe\'"}}}\n',
            b'{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"execute_sql","arguments":'
            b'{"db_id":"demo","sql":"SELECT \'\\ud800\'"}}}\n',
            b'{"jsonrpc":"2.0","id":4,"method":"tools/call","params":{"name":"execute_sql","arguments":'
            b'{"db_id":"demo","sql":"SELECT 1\\u0000"}}}\n',
            b'{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"execute_sql","arguments":'
            b'{"db_id":["demo"],"sql":{"x":1}}}}\n',
            b"[" * 100_000 + b"\n",
            b"x" * (9 * 1024 * 1024) + b"\n",  # over the line limit: skipped
            b"\n\n   \n",
        ):
            await _rpc(proc, garbage)
        await _rpc(proc, {"jsonrpc": "2.0", "id": 6, "method": "tools/call", "params": call})
        answer = await _response(proc, 6)
        assert answer["result"]["content"][0]["text"] == "count(*)\n10"
        assert proc.returncode is None
    finally:
        if proc.stdin is not None:
            proc.stdin.close()
        try:
            await asyncio.wait_for(proc.wait(), timeout=5)
        except TimeoutError:
            proc.kill()
            await proc.wait()
    assert proc.returncode == 0


def test_piped_requests_are_all_answered_before_exit(db_root: Path) -> None:
    """stdin closed right after the requests: the server still answers them, then exits cleanly."""
    init = {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}}
    slow = "WITH RECURSIVE r(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM r LIMIT 200000) SELECT count(*) FROM r"
    lines = [
        {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": init},
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        *(
            {"jsonrpc": "2.0", "id": i, "method": "tools/call",
             "params": {"name": "execute_sql", "arguments": {"db_id": "demo", "sql": sql}}}
            for i, sql in ((2, slow), (3, "SELECT count(*) FROM concert"))
        ),
    ]
    payload = "".join(json.dumps(line) + "\n" for line in lines).encode()
    done = subprocess.run(
        [*SERVER, "--db-root", str(db_root)], input=payload, capture_output=True, cwd=REPO_ROOT, timeout=30
    )
    assert done.returncode == 0
    answers = {m["id"]: m for m in map(json.loads, done.stdout.decode().splitlines())}
    assert answers[2]["result"]["content"][0]["text"] == "count(*)\n200000"
    assert answers[3]["result"]["content"][0]["text"] == "count(*)\n10"


@pytest.mark.spider
async def test_real_spider_database(spider_root: Path) -> None:
    db_root = spider_root / "database"
    if not (db_root / "concert_singer" / "concert_singer.sqlite").is_file():
        pytest.skip("Spider concert_singer database not found")
    async with server("--db-root", str(db_root)) as session:
        text, err, _ = await call(session, "list_tables", db_id="concert_singer")
        assert not err and {"stadium", "singer", "concert", "singer_in_concert"} <= set(text.split(", "))
        text, err, _ = await call(session, "describe_table", db_id="concert_singer", table="singer_in_concert")
        assert not err and "FK->singer.Singer_ID" in text
        text, err, structured = await call(
            session, "execute_sql", db_id="concert_singer", sql="SELECT count(*) FROM singer"
        )
        assert not err and structured is not None and structured["rows"] == [[6]]
