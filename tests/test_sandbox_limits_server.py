"""Hostile single-operation inputs through a real server process (issue 17, items 1-6).

Bombs of every kind run concurrently with a stream of cheap calls, through the official MCP
client: every call must be answered within timeout + 0.5 s, cheap calls must keep their answers,
the server's RSS must stay under its cap, no temp file may appear and the database files must not
change. A raw JSON-RPC test checks that requests the client library cannot even send (lone
surrogates) and huge echoed inputs are answered, briefly.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

import anyio
import psutil
import pytest
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

from tests.fixtures.raw_server import raw_exchange
from tests.hostile_sql import make_hostile_db, tree_state

logger = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parents[1]
SERVER = [sys.executable, "-m", "mcp_tools.sqlite_server"]
TIMEOUT_S = 2.0
#: Every answer must come within this (issue 17: the timeout + 0.5 s).
ANSWER_S = TIMEOUT_S + 0.5
MEMORY_MB = 48
#: How far the server's peak RSS may pass its idle footprint + the cap: the cap covers the whole
#: process (process_memory), read every 10 ms. Measured: +48 MiB over idle (+93 MiB before the
#: RSS watch, when the cap was SQLite's heap alone).
CAP_TOLERANCE_MB = 32
CHEAP = "SELECT count(*) FROM singer"
CHEAP_ANSWER = ("count(*)\n41", False)

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(600)]

# Endless rows carrying a 30,000-character value built once (each row only copies it): they fill
# 48 MB in ~0.1 s of CPU. (Joined to an endless CTE instead, SQLite would materialize that first.)
_FAT = "WITH RECURSIVE r(i, x) AS (SELECT 1, hex(zeroblob(15000)) UNION ALL SELECT i + 1, x FROM r)"
#: (name, sql, what the answer must say: one of these substrings).
BOMBS: list[tuple[str, str, tuple[str, ...]]] = [
    ("printf", "SELECT length(printf('%.*c', 2147483647, 'x'))", ("too large: printf()",)),
    ("printf_3_rows", "SELECT length(printf('%.*c', 2147483647, name)) FROM singer LIMIT 3", ("too large: printf()",)),
    ("format_literal", "SELECT length(format('%.2147483647c', 'x'))", ("too large: printf()",)),
    ("trim", "SELECT length(trim(replace(hex(zeroblob(16000)), '0', 'a'), (SELECT group_concat(char(i + 256), '') "
     "FROM (WITH RECURSIVE r(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM r LIMIT 2700) SELECT i FROM r)) || 'a'))",
     ("too large: trim()",)),
    ("json_group_array", f"{_FAT} SELECT length(json_group_array(x || i)) FROM r", ("memory limit (48 MB)", "timeout")),
    ("sort", f"{_FAT} SELECT i FROM r ORDER BY x, i DESC", ("memory limit (48 MB)", "timeout")),
    ("window", f"{_FAT} SELECT x, count(*) OVER () FROM r", ("memory limit (48 MB)", "timeout")),
    # One row of 2,000 values of 32 kB: 64 MB in ~10 ms of CPU.
    ("wide_values", "SELECT " + ", ".join(["x"] * 2000) + " FROM (SELECT hex(zeroblob(16000)) AS x)",
     ("memory limit (48 MB)", "timeout")),
    ("fan_out_cte", "WITH RECURSIVE r(i) AS (SELECT 1 UNION SELECT i * 2 FROM r UNION SELECT i * 2 + 1 FROM r) "
     "SELECT count(*) FROM r", ("memory limit (48 MB)", "timeout")),
    ("big_sort", "SELECT i FROM (WITH RECURSIVE r(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM r LIMIT 3000000) "
     "SELECT i FROM r) ORDER BY random()", ("memory limit (48 MB)", "timeout")),
    ("runaway", "WITH RECURSIVE r(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM r) SELECT count(*) FROM r", ("timeout",)),
    ("sqlite_stmt", "SELECT sql FROM sqlite_stmt", ("denied: table sqlite_stmt",)),
    ("dbstat", "SELECT count(*) FROM dbstat", ("denied: table dbstat",)),
]
#: Bombs that fill memory fast: run alone too, to hit the cap (not the timeout) on a busy machine.
MEMORY_BOMBS = ("json_group_array", "sort", "window", "wide_values")
WIDE = "SELECT " + ", ".join(["x"] * 2000) + " FROM (SELECT printf('%.8000c', 'x') AS x)"


@pytest.fixture(scope="module")
def db_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Spider layout: <root>/demo/demo.sqlite and <root>/second/second.sqlite."""
    root = tmp_path_factory.mktemp("limits_root")
    make_hostile_db(root / "demo").rename(root / "demo" / "demo.sqlite")
    make_hostile_db(root / "second").rename(root / "second" / "second.sqlite")
    return root


class ServerWatch:
    """Samples a server process from a thread: peak RSS and any temp file it holds open."""

    def __init__(self, proc: psutil.Process, temp_dir: Path, interval_s: float = 0.02, files_every: int = 5) -> None:
        self.proc, self.temp_dir, self.interval_s, self.files_every = proc, str(temp_dir), interval_s, files_every
        self.peak_rss = 0
        self.temp_files: dict[str, int] = {}  # path -> largest size seen
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self, files: bool) -> None:
        self.peak_rss = max(self.peak_rss, self.proc.memory_info().rss)
        self.samples += 1
        if not files:
            return
        fd_dir = f"/proc/{self.proc.pid}/fd"
        for fd in os.listdir(fd_dir):
            try:
                target = os.readlink(f"{fd_dir}/{fd}")
                if target.startswith(self.temp_dir) or "etilqs_" in target:
                    size = os.stat(f"{fd_dir}/{fd}").st_size  # follows the link: works for deleted files
                    self.temp_files[target] = max(size, self.temp_files.get(target, 0))
            except OSError:
                continue

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                # Open files less often than RSS: the sampler shares the machine with the server.
                self._sample(files=self.samples % self.files_every == 0)
            except psutil.Error:
                return

    def __enter__(self) -> ServerWatch:
        self._sample(files=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._sample(files=True)


def server_process(db_root: Path) -> psutil.Process:
    (proc,) = [
        p for p in psutil.Process().children(recursive=True)
        if "mcp_tools.sqlite_server" in (cmd := " ".join(p.cmdline())) and str(db_root) in cmd
    ]
    return proc


async def timed_call(session: ClientSession, sql: str, db_id: str = "demo") -> tuple[float, str, bool, Any]:
    start = time.monotonic()
    result = await session.call_tool("execute_sql", {"db_id": db_id, "sql": sql})
    return time.monotonic() - start, result.content[0].text, bool(result.is_error), result.structured_content


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs /proc")
async def test_bombs_beside_cheap_calls(db_root: Path, tmp_path: Path) -> None:
    before = tree_state(db_root)
    temp_dir = tmp_path / "sqlite_tmp"
    temp_dir.mkdir()
    env = {**os.environ, "TMPDIR": str(temp_dir), "SQLITE_TMPDIR": str(temp_dir)}
    args = ["--db-root", str(db_root), "--timeout-s", str(TIMEOUT_S), "--memory-limit-mb", str(MEMORY_MB)]
    params = StdioServerParameters(command=SERVER[0], args=[*SERVER[1:], *args], cwd=str(REPO_ROOT), env=env)
    bomb_answers: dict[str, tuple[float, str, bool, Any]] = {}
    cheap: list[tuple[float, str, bool]] = []
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        proc = server_process(db_root)
        for db_id in ("demo", "second"):  # warm: connections open, first queries done
            assert (await timed_call(session, CHEAP, db_id))[1:3] == CHEAP_ANSWER
        idle_rss = proc.memory_info().rss
        bombs_done = anyio.Event()

        async def bomb(name: str, sql: str, delay_s: float) -> None:
            await anyio.sleep(delay_s)
            bomb_answers[name] = await timed_call(session, sql)

        async def cheap_calls() -> None:
            while not bombs_done.is_set() or len(cheap) < 20:
                elapsed, text, err, _ = await timed_call(session, CHEAP, ("demo", "second")[len(cheap) % 2])
                cheap.append((elapsed, text, err))
                await anyio.sleep(0.02)

        with ServerWatch(proc, temp_dir) as watch:
            async with anyio.create_task_group() as tg:
                tg.start_soon(cheap_calls)
                async with anyio.create_task_group() as bombs:
                    # Started 0.25 s apart: up to nine run at once, but their deadlines do not all
                    # fall in one instant (a burst of answers that an event loop getting a few % of
                    # a core, as on a busy shared box, delivers one by one).
                    for i, (name, sql, _) in enumerate([*BOMBS, ("wide_row", WIDE, ())]):
                        bombs.start_soon(bomb, name, sql, 0.25 * i)
                bombs_done.set()
            # Then the memory bombs and the wide row one at a time: beside a dozen others a bomb may
            # time out before it fills the heap, and the wide row (16 MB of values) may not fit.
            alone = {name: await timed_call(session, sql) for name, sql, _ in BOMBS if name in MEMORY_BOMBS}
            alone["wide_row"] = await timed_call(session, WIDE)
        assert proc.is_running()
        assert (await timed_call(session, CHEAP))[1:3] == CHEAP_ANSWER

    # Every check is made and reported together (a run of this test takes minutes on a busy box).
    problems: list[str] = []
    report = {name: (round(a[0], 2), a[1][:90]) for name, a in bomb_answers.items()}
    if slow := {name: r for name, r in report.items() if r[0] >= ANSWER_S}:
        problems.append(f"bombs answered late: {slow}")
    for name, _, expected in BOMBS:
        _, text, err, _ = bomb_answers[name]
        if not (err and any(e in text for e in expected)):
            problems.append(f"{name}: unexpected answer {text[:200]!r}")
    capped = "query exceeded the server's memory limit (48 MB)"
    for name in MEMORY_BOMBS:
        elapsed, text, err, _ = alone[name]
        if elapsed >= ANSWER_S or not (err and (capped in text or text.startswith("timeout"))):
            problems.append(f"{name} alone: {elapsed:.2f} s, {text[:200]!r}")
    # The cap is real. (On an idle machine each of these hits it within ~0.1 s of CPU; at a few % of
    # a core some may time out first. test_sandbox_limits checks each kind with a long timeout.)
    if not any(capped in alone[name][1] for name in MEMORY_BOMBS):
        problems.append(f"no memory bomb reached the cap: {alone}")

    def check_wide_row(answer: tuple[float, str, bool, Any], where: str, may_fail: bool) -> None:
        elapsed, text, err, structured = answer
        if err:  # beside memory bombs its 16 MB of values may not fit in the heap, or not in time
            if not (may_fail and (capped in text or text.startswith("timeout"))):
                problems.append(f"wide row {where} failed: {elapsed:.2f} s, {text[:200]!r}")
        elif not (
            structured is not None
            and len(text) <= 8000 + 200
            and "first 100 of 2000 columns" in text.splitlines()[-1]
            and len(structured["columns"]) == 100
            and structured["omitted_columns"] == 1900
            and len(json.dumps(structured)) < 4 * 8000
        ):
            size = structured and len(json.dumps(structured))
            problems.append(f"wide row {where} not capped: {len(text)} chars of text, {size} of JSON")

    check_wide_row(bomb_answers["wide_row"], "beside the bombs", may_fail=True)
    check_wide_row(alone["wide_row"], "alone", may_fail=False)
    if alone["wide_row"][0] >= ANSWER_S:
        problems.append(f"wide row alone answered late: {alone['wide_row'][0]:.2f} s")

    if len(cheap) < 20 or any(c[1:] != CHEAP_ANSWER for c in cheap):
        problems.append(f"cheap calls failed: {[c for c in cheap if c[1:] != CHEAP_ANSWER][:5]}")
    if max(c[0] for c in cheap) >= ANSWER_S:
        problems.append(f"cheap calls answered late (s): {sorted(round(c[0], 2) for c in cheap)[-5:]}")

    rss_cap = idle_rss + (MEMORY_MB + CAP_TOLERANCE_MB) * 2**20
    if watch.samples <= 10 or watch.peak_rss >= rss_cap:
        problems.append(f"peak RSS {watch.peak_rss >> 20} MiB ({watch.samples} samples), cap {rss_cap >> 20} MiB")
    if watch.temp_files or list(temp_dir.iterdir()):
        problems.append(f"temp files: {watch.temp_files}, {list(temp_dir.iterdir())}")
    if tree_state(db_root) != before:
        problems.append("database files changed")
    logger.info(
        "bombs: %s; alone: %s; cheap: %d calls, slowest %s s; RSS idle %d MiB, peak %d MiB", report,
        {name: (round(a[0], 2), a[1][:60]) for name, a in alone.items()}, len(cheap),
        sorted(round(c[0], 2) for c in cheap)[-3:], idle_rss >> 20, watch.peak_rss >> 20,
    )
    assert not problems, "\n".join(problems)


# ----------------------------------------------------------------------------- raw JSON-RPC


def _tools_call(request_id: Any, name: str, arguments: dict[str, Any]) -> bytes:
    return json.dumps(
        {"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": {"name": name, "arguments": arguments}}
    ).encode() + b"\n"


async def test_every_request_is_answered_and_echoes_are_clipped(db_root: Path) -> None:
    """Lone surrogates (the official client cannot even send them) and megabyte inputs, raw."""
    big = "t" * 1_000_000
    requests: dict[Any, bytes] = {
        2: _tools_call(2, "execute_sql", {"db_id": "demo", "sql": "SELECT '\ud800'"}),
        3: _tools_call(3, "execute_sql", {"db_id": "de\ud800mo", "sql": "SELECT 1"}),
        4: _tools_call(4, "describe_table", {"db_id": "demo", "table": "sing\udcffer"}),
        5: _tools_call(5, "execute_\ud800sql", {"db_id": "demo", "sql": "SELECT 1"}),
        6: json.dumps({"jsonrpc": "2.0", "id": 6, "method": "tools/c\ud800all", "params": {}}).encode() + b"\n",
        "\ufffd": _tools_call("\ud800", "execute_sql", {"db_id": "demo", "sql": "SELECT 1"}),
        8: b'{"jsonrpc": "2.0", "id": 8, "method": 42}\n',  # valid JSON, not a valid request
        9: _tools_call(9, "describe_table", {"db_id": "demo", "table": big}),
        10: _tools_call(10, "execute_sql", {"db_id": big, "sql": "SELECT 1"}),
        11: _tools_call(11, "z" * 1_000_000, {"db_id": "demo"}),
        12: _tools_call(12, "execute_sql", {"db_id": "demo", "sql": "SELECT * FROM " + "q" * 20_000}),
        13: _tools_call(13, "execute_sql", {"db_id": "demo", "sql": "SELECT count(*) FROM concert"}),
    }
    answers, _ = await raw_exchange(["--db-root", str(db_root), "--timeout-s", str(TIMEOUT_S)],
                                    requests.values(), set(requests))

    def text(request_id: Any) -> str:
        result = answers[request_id]["result"]
        assert result["isError"], result
        return result["content"][0]["text"]

    assert text(2) == "SQL error: the query is not valid UTF-8 text"
    assert text(3).startswith("unknown db_id 'de\\ud800mo'.")
    assert text(4).startswith("unknown table 'sing\\udcffer'.")
    assert text(5).startswith("Unknown tool: execute_\ufffdsql")
    assert answers[6]["error"]["code"] == -32601  # method not found
    assert "result" in answers["\ufffd"] or "error" in answers["\ufffd"]
    assert answers[8]["error"]["code"] == -32600  # invalid request
    for request_id in (9, 10, 11, 12):
        assert len(text(request_id)) < 1000 and "characters, clipped]" in text(request_id), text(request_id)[:300]
    assert answers[13]["result"]["content"][0]["text"] == "count(*)\n10"
