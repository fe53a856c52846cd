"""Bring your own MCP server (README, "Bring your own MCP server"): a public server this project did
not write (mcp-server-sqlite, run from its own environment: tests/fixtures/third_party.py) attached
with one flag, the SQL family mapped onto its tools, its text errors counted, its writes isolated
per episode and never seen by the reward; and every mismatch of config and servers one `error:`
line at load. Real server processes, real SQLite files, the real CLI."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fixtures.config_files import REPO
from tests.fixtures.third_party import mcp_server_sqlite
from tests.fixtures.tiny_db import SHOP_TASKS, make_shop_db

FAMILY_DIR = REPO / "tests" / "fixtures" / "byo_family"
#: mcp-server-sqlite's errors: "Database error: ..." / "Error: ..." as text, is_error false.
TEXT_ERRORS = "^(Database )?[Ee]rror:"
MAP_SQL = 'env.tool_map={execute_sql: {tool: read_query, args: {sql: query}}, describe_table: {tool: describe_table, args: {table: table_name}}}'


def _cli(*args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # nothing on PYTHONPATH, as a user runs it
    env.update(WANDB_MODE="disabled", WEAVE_DISABLED="true", TOKENIZERS_PARALLELISM="false", COLUMNS="200")
    return subprocess.run([sys.executable, "-m", "skyrl_tool_agent.commands.main", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture()
def shop(tmp_path: Path) -> tuple[Path, Path, Path]:
    """(db_root, the shop database, a task file of its three tasks)."""
    db_root = tmp_path / "dbs"
    database = make_shop_db(db_root)
    tasks = tmp_path / "shop_tasks.json"
    tasks.write_text(json.dumps([{"task_id": t.task_id, "db_id": t.db_id, "question": t.question,
                                  "gold_sql": t.gold_sql, "difficulty": t.difficulty} for t in SHOP_TASKS]))
    return db_root, database, tasks


def _data(db_root: Path, tasks: Path) -> list[str]:
    return ["--set", f"training.data.db_root={db_root}", "--set", f"training.data.dev_file={tasks}",
            "--set", f"training.data.train_file={tasks}", "--set", "training.data.train_pool=file"]


def _one_error_line(done: subprocess.CompletedProcess[str]) -> str:
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "), done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    return lines[0]


# ----------------------------------------------------------------------------- checked at load

def _own_sqlite(name: str, prefix: str = "") -> dict:
    return {"name": name, "command": "python", "args": ["-m", "mcp_tools.sqlite_server", "--db-root", "${db_root}"],
            "tool_prefix": prefix}


@pytest.mark.parametrize("case", ["offered", "schema", "duplicate", "verdict"])
def test_config_and_server_mismatches_are_one_line_at_load(shop, case):
    db_root, _, tasks = shop
    calc = {"name": "calc", "command": "python", "args": ["-m", "tests.fixtures.calc_server"]}
    extra, key, fix = {
        # a tool no server lists (was: ValueError traceback)
        "offered": (["--set", "env.offered_tools=[run_sql]"], "env.offered_tools", "env.tool_map.run_sql.tool"),
        # the schema in the prompt, with servers that have no get_schema (was: a traceback at the first episode)
        "schema": (["--set", f"env.mcp_servers={json.dumps([calc])}", "--set", "env.offered_tools=null"],
                   "env.schema_in_prompt", "env.schema_in_prompt=false"),
        # two servers listing one tool name (was: MCPConfigError traceback)
        "duplicate": (["--set", f"env.mcp_servers={json.dumps([_own_sqlite('a'), _own_sqlite('b')])}"],
                      "env.mcp_servers", "tool_prefix"),
        # the execution verdict for tasks without databases (was: every answer scored 0, exit 0)
        "verdict": (["--set", f"env.task_family={FAMILY_DIR / 'answers_without_db.py'}:FAMILY"],
                    "verdict_term 'execution'", "uses_databases=True"),
    }[case]
    line = _one_error_line(_cli("eval", "--policy", "oracle", *_data(db_root, tasks), *extra,
                                "--output-dir", str(db_root.parent / "out"), timeout=120))
    assert key in line and fix in line, line


def test_a_bad_mcp_server_flag_is_one_line(shop):
    db_root, _, tasks = shop
    line = _one_error_line(_cli("eval", "--policy", "oracle", *_data(db_root, tasks), "--mcp-server", "no-command=",
                                timeout=60))
    assert "--mcp-server" in line and "NAME=COMMAND ARGS" in line
    line = _one_error_line(_cli("eval", "--policy", "oracle", *_data(db_root, tasks),
                                "--mcp-server", "s=/nonexistent/server --db x", timeout=60))
    assert "env.mcp_servers" in line and "failed to start" in line and "/nonexistent/server" in line
