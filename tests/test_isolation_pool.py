"""A writable third-party server (mcp-server-sqlite, its own venv: tests/fixtures/third_party.py)
isolated without a process per episode, nothing left behind when a run dies, and a misbehaving
server as one line. Real server processes, real SQLite files, real signals."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from skyrl_tool_agent.config import MCPServerConfig, load_config
from skyrl_tool_agent.env.pools import EnvDataError, EnvRuntime
from skyrl_tool_agent.mcp.copies import point_at
from skyrl_tool_agent.mcp.reaper import OWNER_FILE, sweep_dead_runs
from tests.fixtures.config_files import REPO
from tests.fixtures.third_party import mcp_server_sqlite
from tests.fixtures.tiny_db import make_shop_db

MISBEHAVING = REPO / "tests" / "fixtures" / "misbehaving_server.py"
PARIS = "SELECT count(*) AS n FROM customer WHERE city = 'Paris'"


def _runtime(db_root: Path, database: Path, *, pool_size: int, written: str | None = None,
             cwd: str | None = None) -> EnvRuntime:
    written = written or str(database)
    server = {"name": "shop", "command": str(mcp_server_sqlite()), "args": ["--db-path", written],
              "writable_paths": [str(database)], "cwd": cwd}
    config = load_config(overrides=[f"env.mcp_servers={json.dumps([server])}", "env.offered_tools=null",
                                    "env.schema_in_prompt=false", f"env.isolation_pool_size={pool_size}"]).env
    return EnvRuntime(config, db_root)


def _paris(tools) -> str:
    ((text, is_error),) = tools.call_sync([("read_query", {"query": PARIS})])
    assert not is_error, text
    return text


def _move_to_paris(tools, customer_id: int) -> None:
    ((text, is_error),) = tools.call_sync(
        [("write_query", {"query": f"UPDATE customer SET city = 'Paris' WHERE customer_id = {customer_id}"})])
    assert not is_error, text


def _server_processes(runtime: EnvRuntime) -> int:
    exe = str(mcp_server_sqlite())
    return sum(1 for p in psutil.Process().children(recursive=True) if exe in " ".join(p.cmdline()))


@pytest.fixture(scope="module")
def server_exe() -> Path:
    return mcp_server_sqlite()


@pytest.mark.parametrize("pool_size", [1, 2])
def test_interleaved_episodes_never_see_each_others_writes_on_shared_processes(tmp_path, server_exe, pool_size):
    """Three episodes interleave writes and reads on `pool_size` warm processes (the knob): each sees
    the original, then only its own writes; the original never changes. Calls one at a time need
    one process; two at once start a second where the pool size allows (1: every switch of episode
    saves one's copy and restores the other's)."""
    db_root = tmp_path / "dbs"
    database = make_shop_db(db_root)
    before = database.read_bytes()
    runtime = _runtime(db_root, database, pool_size=pool_size)
    try:
        a, b, c = runtime.servers.episode_tools(), runtime.servers.episode_tools(), runtime.servers.episode_tools()
        assert "'n': 2" in _paris(a)
        _move_to_paris(a, 2)  # a: 3 in Paris
        assert "'n': 2" in _paris(b)  # b: the original
        _move_to_paris(b, 4)
        _move_to_paris(b, 2)  # b: 4 in Paris
        assert "'n': 3" in _paris(a) and "'n': 4" in _paris(b)
        a.close()
        assert "'n': 2" in _paris(c)  # a new episode on a process a used: the original again
        assert "'n': 4" in _paris(b)
        assert _server_processes(runtime) == 1  # calls one at a time: one process serves them all

        async def together() -> list[tuple[str, bool]]:  # two calls at once: a second process, if allowed
            return await asyncio.gather(b.call("read_query", {"query": PARIS}), c.call("read_query", {"query": PARIS}))

        # Gathered on the servers' own loop, both calls reach the pool in one turn of it, so c's always
        # finds b's process busy. Gathered on another thread's loop, a loaded machine could finish b's
        # call before c's arrived, and no second process was ever needed (a CI failure, 2026-11-28).
        (b_text, _), (c_text, _) = b.shared.run(together(), timeout_s=120)
        assert "'n': 4" in b_text and "'n': 2" in c_text
        warm = runtime.servers.warm["shop"]
        deadline = time.monotonic() + 120  # the second process starts aside (the calls need not wait for it)
        while len(warm.running) < pool_size and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(warm.running) == pool_size and _server_processes(runtime) == pool_size
        if pool_size == 1:
            assert warm.counts["saved"] >= 2 and warm.counts["restored_saved"] >= 2, warm.counts
        b.close()
        c.close()
    finally:
        runtime.close()
    assert database.read_bytes() == before and runtime.data_faults == []


def test_a_writable_path_written_differently_on_the_command_line_is_still_the_copy(tmp_path):
    """`--mcp-writable shop=dbs/shop.sqlite` against `--db-path ./dbs/shop.sqlite` (or a/../ forms,
    or absolute): one path, so the server gets the copy."""
    base = tmp_path
    original = (tmp_path / "dbs" / "shop.sqlite")
    copy = Path("/copies/0/shop.sqlite")
    for written in ("./dbs/shop.sqlite", "dbs/../dbs/shop.sqlite", str(original), "dbs//shop.sqlite"):
        spec = MCPServerConfig(name="s", command="x", args=["--db-path", written, f"--db={written}"])
        pointed = point_at(spec, [("dbs/shop.sqlite", original, copy)], base)
        assert pointed.args == ["--db-path", str(copy), f"--db={copy}"], (written, pointed.args)
    directory = point_at(MCPServerConfig(name="s", command="x", args=["./data/sub/file.txt"]),
                         [("data", tmp_path / "data", Path("/c/data"))], base)
    assert directory.args == ["/c/data/sub/file.txt"]
    unrelated = MCPServerConfig(name="s", command="x", args=["--db-path", "./dbs/other.sqlite", "--verbose"])
    assert point_at(unrelated, [("dbs/shop.sqlite", original, copy)], base) == unrelated


def test_dot_slash_on_the_command_line_runs_on_the_copy(tmp_path, server_exe):
    db_root = tmp_path / "dbs"
    database = make_shop_db(db_root)
    before = database.read_bytes()
    runtime = _runtime(db_root, database, pool_size=1, written="./dbs/shop/shop.sqlite", cwd=str(tmp_path))
    try:
        tools = runtime.servers.episode_tools()
        _move_to_paris(tools, 2)
        assert "'n': 3" in _paris(tools)
        tools.close()
    finally:
        runtime.close()
    assert database.read_bytes() == before


# ----------------------------------------------------------------------------- a run that dies

TRAINER = textwrap.dedent("""
    import json, sys, threading, time
    import psutil
    from skyrl_tool_agent.config import MCPServerConfig, load_config
    from skyrl_tool_agent.env.pools import EnvRuntime
    exe, db_root, database, misbehaving = sys.argv[1:5]
    server = {"name": "shop", "command": exe, "args": ["--db-path", database], "writable_paths": [database]}
    linger = {"name": "linger", "command": "python", "args": [misbehaving, "linger"]}
    config = load_config(overrides=[f"env.mcp_servers={json.dumps([server, linger])}", "env.offered_tools=null",
                                    "env.schema_in_prompt=false", "env.isolation_pool_size=2",
                                    "env.call_timeout_s=600"]).env
    runtime = EnvRuntime(config, db_root)
    # (mcp-server-sqlite's read_query takes only text that starts with SELECT)
    forever = "SELECT count(*) FROM (WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT x FROM c)"
    for _ in range(2):  # two episodes, each busy in a query that never ends
        tools = runtime.servers.episode_tools()
        assert tools.call_sync([("ping", {})]) == [("pong", False)]
        threading.Thread(target=tools.call_sync, args=([("read_query", {"query": forever})],), daemon=True).start()
    deadline = time.monotonic() + 120
    while sum(exe in " ".join(p.cmdline()) for p in psutil.Process().children(recursive=True)) < 2:
        if time.monotonic() > deadline:
            sys.exit("the second server process never started")
        time.sleep(0.05)
    time.sleep(1.0)
    print("ready", flush=True)
    time.sleep(600)
""")


def _servers_of(pid: int) -> list[psutil.Process]:
    names = (str(mcp_server_sqlite()), str(MISBEHAVING))
    return [p for p in psutil.Process(pid).children(recursive=True) if any(n in " ".join(p.cmdline()) for n in names)]


def _start_trainer(tmp_path: Path) -> tuple[subprocess.Popen[str], Path, list[psutil.Process]]:
    db_root = tmp_path / "dbs"
    database = make_shop_db(db_root)
    temp = tmp_path / "tmp"
    temp.mkdir()
    env = {**os.environ, "TMPDIR": str(temp), "PYTHONPATH": str(REPO)}
    trainer = subprocess.Popen([sys.executable, "-c", TRAINER, str(mcp_server_sqlite()), str(db_root), str(database),
                                str(MISBEHAVING)],
                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env, cwd=tmp_path)
    if trainer.stdout.readline() != "ready\n":
        trainer.kill()
        trainer.wait()
        pytest.fail("the trainer did not start its servers")
    servers = _servers_of(trainer.pid)
    assert len(servers) >= 3  # two of mcp-server-sqlite, one that lingers
    return trainer, temp, servers


def _copies(temp: Path) -> list[Path]:
    return [p for p in temp.rglob("*") if p.is_file() and p.suffix == ".sqlite"]


def test_kill_9_of_the_trainer_leaves_no_server_and_no_copy(tmp_path, server_exe):
    """Two writable servers busy in a query that never ends, and a server that ignores its stdin's end
    and SIGTERM: 5 s after `kill -9` of the trainer none runs and no copy of the database is left."""
    trainer, temp, servers = _start_trainer(tmp_path)
    try:
        assert _copies(temp)
    finally:
        trainer.send_signal(signal.SIGKILL)
        trainer.wait()
        gone, alive = psutil.wait_procs(servers, timeout=5)
        for proc in alive:
            proc.kill()
    assert not alive, f"server processes alive 5 s after the trainer died: {[p.pid for p in alive]}"
    deadline = time.monotonic() + 5
    while _copies(temp) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _copies(temp), f"copies left: {_copies(temp)}"


def test_the_next_start_sweeps_what_a_dead_run_left(tmp_path):
    """A run whose watchdog died with it (its directory's owner is dead) is swept by any next start;
    a live run's directory is not."""
    root = tmp_path / "runs"
    dead = root / "run-1-dead"
    (dead / "slot-shop-x" / "0").mkdir(parents=True)
    (dead / "slot-shop-x" / "0" / "shop.sqlite").write_bytes(b"copy")
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    (dead / OWNER_FILE).write_text(json.dumps({"pid": gone.pid, "started": time.time()}))
    live = root / "run-2-live"
    live.mkdir()
    (live / OWNER_FILE).write_text(json.dumps({"pid": os.getpid(), "started": psutil.Process().create_time()}))
    assert sweep_dead_runs(root) == [dead]
    assert not dead.exists() and live.exists()


# ----------------------------------------------------------------------------- a misbehaving server

def _misbehaving_runtime(tmp_path: Path, mode: str) -> EnvRuntime:
    server = {"name": "bad", "command": "python", "args": [str(MISBEHAVING), mode]}
    config = load_config(overrides=[f"env.mcp_servers={json.dumps([server])}", "env.offered_tools=null",
                                    "env.schema_in_prompt=false"]).env
    return EnvRuntime(config, tmp_path)


@pytest.mark.parametrize("mode, expected", [
    ("exit", ["exited before answering initialize", "exit code 3", "No module named 'missing_dep'", "import missing_dep"]),
    ("garbage-exit", ["exited before answering initialize", "exit code 4", "20000 non-protocol line(s) on stdout", "progress 0: loading"]),
    ("refuse", ["the handshake failed", "not today", "'refused'"]),
])
def test_a_server_that_does_not_start_is_one_line_with_its_exit_code_and_output(tmp_path, caplog, capfd, mode,
                                                                                 expected):
    caplog.set_level(logging.INFO)
    with pytest.raises(EnvDataError) as raised:
        _misbehaving_runtime(tmp_path, mode)
    message = str(raised.value)
    assert "\n" not in message and "ExceptionGroup" not in message and "TaskGroup" not in message, message
    assert "bad[0]" in message and all(part in message for part in expected), message
    out, err = capfd.readouterr()
    log = caplog.text + out + err
    assert len(log) < 100_000 and "ExceptionGroup" not in log, log[-3000:]
    assert not any(record.exc_info for record in caplog.records)  # no traceback logged


def test_non_protocol_stdout_is_counted_not_logged_line_by_line(tmp_path, caplog, capfd):
    """20,000 lines of garbage before a server speaks: one warning (the first line), one count at
    the end, the server works."""
    caplog.set_level(logging.INFO)
    runtime = _misbehaving_runtime(tmp_path, "garbage-serve")
    try:
        tools = runtime.servers.episode_tools()
        assert tools.call_sync([("echo", {"text": "hi"})]) == [("hi", False)]
    finally:
        runtime.close()
    out, err = capfd.readouterr()
    log = caplog.text + out + err
    assert len(log) < 100_000, len(log)
    assert caplog.text.count("progress 0: loading") == 2  # the warning, the summary
    assert "printed 20000 non-protocol line(s) on stdout" in caplog.text and 'File "' not in log
    assert not any(record.exc_info for record in caplog.records)


# ----------------------------------------------------------------------------- the skyrl-gym route

GYM_EPISODE = textwrap.dedent("""
    import json, sys
    import skyrl_gym
    import skyrl_tool_agent  # registers mcp_tool_env
    from skyrl_tool_agent.env.chat_format import format_tool_call
    exe, db_root, database, declared = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4] == "1"
    server = {"name": "shop", "command": exe, "args": ["--db-path", database]}
    if declared:
        server["writable_paths"] = [database]
    config = {"db_root": db_root, "mcp_servers": [server], "offered_tools": None, "schema_in_prompt": False}
    extras = {"db_id": "shop", "reward_spec": {"ground_truth": "SELECT 1"}, "max_turns": 3}
    with skyrl_gym.make("mcp_tool_env", env_config=config, extras=extras) as env:
        env.init([{"role": "user", "content": "Move Bob to Paris."}])
        out = env.step(format_tool_call("write_query", {"query": "UPDATE customer SET city = 'Paris' WHERE customer_id = 2"}))
        assert "Error" not in out["observations"][0]["content"], out
    # no close of the runtime: SkyRL-train never closes it; the exit must
""")


@pytest.mark.parametrize("declared", [True, False], ids=["writable-declared", "undeclared"])
def test_the_gym_route_checks_the_originals_and_removes_its_copies_at_exit(tmp_path, server_exe, declared):
    db_root = tmp_path / "dbs"
    database = make_shop_db(db_root)
    before = database.read_bytes()
    temp = tmp_path / "tmp"
    temp.mkdir()
    done = subprocess.run([sys.executable, "-c", GYM_EPISODE, str(server_exe), str(db_root), str(database),
                           "1" if declared else "0"], capture_output=True, text=True, timeout=120, cwd=tmp_path,
                          env={**os.environ, "TMPDIR": str(temp), "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stderr[-3000:]
    deadline = time.monotonic() + 5  # the watchdog removes the run's directory once the process is gone
    while _copies(temp) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _copies(temp)
    if declared:
        assert database.read_bytes() == before
        assert "original data changed" not in done.stderr
    else:  # the end-of-run hash check ran at exit and named the file
        assert database.read_bytes() != before
        assert "original data changed during the run" in done.stderr and str(database) in done.stderr


def test_a_stateful_server_starts_per_episode_only_when_the_episode_calls_it(tmp_path):
    """Two servers declared stateful: an episode that calls one starts a process of that one only,
    and its end stops it."""
    calc = {"command": "python", "args": ["-m", "tests.fixtures.calc_server"], "stateful": True}
    servers = [{"name": "a", **calc}, {"name": "b", "tool_prefix": "b_", **calc}]
    config = load_config(overrides=[f"env.mcp_servers={json.dumps(servers)}", "env.offered_tools=null",
                                    "env.schema_in_prompt=false"]).env
    runtime = EnvRuntime(config, tmp_path)

    def calc_processes() -> int:
        return sum("tests.fixtures.calc_server" in " ".join(p.cmdline()) for p in psutil.Process().children(recursive=True))

    try:
        listing = calc_processes()  # one per server, listing its tools
        tools = runtime.servers.episode_tools()
        assert tools.call_sync([("add", {"a": 2, "b": 3})]) == [("5", False)]
        assert calc_processes() == listing + 1
        tools.close()
        assert calc_processes() == listing
    finally:
        runtime.close()


def test_files_a_server_writes_beside_a_writable_file_are_the_episodes_own(tmp_path):
    """One warm process, two episodes: a note one episode leaves beside the database is seen by
    that episode only, never by the other, a later one, or the original's directory."""
    db_root = tmp_path / "dbs"
    database = make_shop_db(db_root)
    server = {"name": "side", "command": "python", "args": ["-m", "tests.fixtures.sidecar_server", "--db-path",
                                                             str(database)], "writable_paths": [str(database)]}
    config = load_config(overrides=[f"env.mcp_servers={json.dumps([server])}", "env.offered_tools=null",
                                    "env.schema_in_prompt=false", "env.isolation_pool_size=1"]).env
    runtime = EnvRuntime(config, db_root)
    try:
        a, b = runtime.servers.episode_tools(), runtime.servers.episode_tools()
        assert a.call_sync([("leave_note", {"text": "from a"})]) == [("ok", False)]
        assert b.call_sync([("read_notes", {})]) == [("none", False)]
        assert a.call_sync([("read_notes", {})]) == [("from a\n", False)]
        a.close()
        c = runtime.servers.episode_tools()
        assert c.call_sync([("read_notes", {})]) == [("none", False)]
        b.close()
        c.close()
    finally:
        runtime.close()
    assert not (database.parent / "notes.txt").exists()
