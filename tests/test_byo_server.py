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

from tests.fixtures.cli_in_process import cli_in_process
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


def _one_error_line(done: subprocess.CompletedProcess[str] | tuple[int, str, str]) -> str:
    """The one `error:` line a refused command (a launch, or `cli_in_process`) wrote, exit 2."""
    code, _, stderr = (done.returncode, done.stdout, done.stderr) if isinstance(done, subprocess.CompletedProcess) else done
    lines = stderr.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: "), stderr[-3000:]
    assert "Traceback" not in stderr
    return lines[0]


# ----------------------------------------------------------------------------- checked at load

def _own_sqlite(name: str, prefix: str = "") -> dict:
    return {"name": name, "command": "python", "args": ["-m", "mcp_tools.sqlite_server", "--db-root", "${db_root}"],
            "tool_prefix": prefix}


@pytest.mark.parametrize("case", ["offered", "schema", "duplicate", "verdict"])
def test_config_and_server_mismatches_are_one_line_at_load(shop, case, capsys):
    """Through the command's `main` in this process (`cli_in_process`); a launched refusal is
    test_a_bad_mcp_server_flag_is_one_line's first case."""
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
    line = _one_error_line(cli_in_process(["eval", "--policy", "oracle", *_data(db_root, tasks), *extra,
                                           "--output-dir", str(db_root.parent / "out")], capsys))
    assert key in line and fix in line, line


def test_a_bad_mcp_server_flag_is_one_line(shop, capsys):
    """The first case through a process of its own (what a user sees: exit 2, one line on stderr),
    the others through the command's `main` in this process: the same status and line."""
    db_root, _, tasks = shop
    line = _one_error_line(_cli("eval", "--policy", "oracle", *_data(db_root, tasks), "--mcp-server", "no-command=",
                                timeout=60))
    assert "--mcp-server" in line and "NAME=COMMAND ARGS" in line
    line = _one_error_line(cli_in_process(["eval", "--policy", "oracle", *_data(db_root, tasks),
                                           "--mcp-server", "s=/nonexistent/server --db x"], capsys))
    assert "env.mcp_servers" in line and "failed to start" in line and "/nonexistent/server" in line
    # a server that dies at once: its exit code and the end of its stderr, not an ExceptionGroup
    crash = REPO / "tests" / "fixtures" / "misbehaving_server.py"
    line = _one_error_line(cli_in_process(["eval", "--policy", "oracle", *_data(db_root, tasks),
                                           "--mcp-server", f"s=python {crash} exit"], capsys))
    assert "exited before answering initialize; exit code 3" in line and "No module named 'missing_dep'" in line


# ----------------------------------------------------------------------------- a third-party server

def _attach(database: Path, *, writable: bool = True) -> list[str]:
    """One flag (two with the writable path): the installed mcp-server-sqlite on the shop database."""
    flags = ["--mcp-server", f"shop={mcp_server_sqlite()} --db-path {database}"]
    return [*flags, "--mcp-writable", f"shop={database}"] if writable else flags


def test_the_oracle_scores_full_marks_on_a_third_party_server_mapped_onto_sql(shop):
    db_root, database, tasks = shop
    before = _sha256(database)
    out = db_root.parent / "eval"
    done = _cli("eval", "--policy", "oracle", *_data(db_root, tasks), *_attach(database),
                "--set", MAP_SQL, "--set", "env.schema_in_prompt=false", "--set", "env.offered_tools=null",
                "--set", "grpo.max_turns=4", "--output-dir", str(out), timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    # its tools, listed at start in the log
    assert "MCP server 'shop' (writes isolated: up to" in done.stdout
    assert "warm processes, each call on its episode's own copy): read_query, write_query" in done.stdout
    results = json.loads((out / "results.json").read_text())
    assert (results["n"], results["execution_accuracy"], results["infra_errors"]) == (3, 1.0, 0), results
    samples = [json.loads(line)["samples"][0] for line in (out / "results_trajectories.jsonl").read_text().splitlines()]
    for sample in samples:  # full format credit: every call existed, every argument was the tool's own
        assert sample["components"]["format"] == 1.0 and sample["format_errors"] == 0, sample
        assert sample["tool_errors"] == 0 and sample["reward"] == 1.0, sample
        system = sample["messages"][0]["content"]
        assert "test your query with read_query" in system and "execute_sql" not in system
        calls = " ".join(m["content"] for m in sample["messages"] if m["role"] == "assistant")
        assert '"read_query", "arguments": {"query"' in calls and '"table_name"' in calls and "db_id" not in calls
    assert _sha256(database) == before


def test_errors_a_server_reports_as_text_count_as_tool_errors(shop):
    from skyrl_tool_agent.config import load_config
    from skyrl_tool_agent.env.chat_format import format_answer, format_tool_call
    from skyrl_tool_agent.env.pools import EnvRuntime
    from skyrl_tool_agent.eval.evaluate import EvalOptions, run_evaluation
    from skyrl_tool_agent.rollout.agents import ScriptedAgent
    from skyrl_tool_agent.rollout.collector import CollectorSettings

    db_root, database, _ = shop
    server = {"name": "shop", "command": str(mcp_server_sqlite()), "args": ["--db-path", str(database)],
              "error_pattern": TEXT_ERRORS}
    config = load_config(overrides=[f"env.mcp_servers={json.dumps([server])}", "env.offered_tools=null",
                                    "env.schema_in_prompt=false", MAP_SQL]).env
    bad = format_tool_call("read_query", {"query": "SELECT nope FROM customer"})
    turns = [format_tool_call("read_query", {"query": SHOP_TASKS[0].gold_sql}), bad, format_answer(SHOP_TASKS[0].gold_sql)]
    runtime = EnvRuntime(config, db_root)
    try:
        run = run_evaluation(SHOP_TASKS[:1], runtime, ScriptedAgent(lambda r: turns), CollectorSettings(max_turns=4),
                             EvalOptions())
    finally:
        runtime.close()
    sample = run.records[0]["samples"][0]
    assert any("Database error: no such column: nope" in m["content"] for m in sample["messages"])
    assert (sample["tool_calls"], sample["tool_errors"]) == (2, 1), sample
    # the query it tested: the mapped tool's argument, and not the call the server answered with an error
    assert sample["last_query"] == SHOP_TASKS[0].gold_sql
    assert run.results["tool_error_rate"] == 0.5


@pytest.mark.parametrize("declared", [True, False], ids=["writable-declared", "undeclared"])
def test_writes_never_reach_the_next_episode_or_the_reward(shop, declared):
    """The family's agent (a module beside its file) rewrites the table so its wrong answer returns
    the gold result there. Declared writable: each episode writes its own copy (the next one reads
    the original, the reward scores the original: wrong). Undeclared: the original changes, which
    the run sees (hash) and reports: the episodes are unscored and named, never 1.0."""
    db_root, database, tasks = shop
    before = _sha256(database)
    out = db_root.parent / "eval"
    done = _cli("eval", "--policy", "oracle", *_data(db_root, tasks), *_attach(database, writable=declared),
                "--set", f"env.task_family={FAMILY_DIR / 'shop_family.py'}:FAMILY", "--set", "env.offered_tools=null",
                "--set", "env.schema_in_prompt=false", "--set", "grpo.max_turns=4", "--limit", "1",
                "--num-samples", "2", "--concurrency", "1", "--set", "env.collector.max_episode_retries=0",
                "--output-dir", str(out),
                timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads((out / "results.json").read_text())
    samples = json.loads((out / "results_trajectories.jsonl").read_text().splitlines()[0])["samples"]
    assert len(samples) == 2
    if declared:
        assert _sha256(database) == before
        for sample in samples:  # each episode first reads the original (2), then its own write (4)
            observed = [m["content"] for m in sample["messages"] if "paris" in m["content"] and m["role"] == "user"]
            assert "'paris': 2" in observed[0] and "'paris': 4" in observed[-1], observed
            assert sample["reward"] < 0.5 and sample["components"]["execution"] == 0.0, sample
        assert results["accuracy"] == 0.0 and results["infra_errors"] == 0
    else:
        assert _sha256(database) != before
        assert results["infra_errors"] == 2 and results["scored"] == 0, results
        assert all(s.get("reward", 0.0) < 1.0 for s in samples)
        log = done.stdout + done.stderr
        assert "original data changed during the run" in log and str(database) in log


def test_two_grpo_steps_on_a_third_party_server_leave_its_data_untouched(shop):
    db_root, database, tasks = shop
    before = _sha256(database)
    out = db_root.parent / "run"
    done = _cli("train", *_data(db_root, tasks), *_attach(database), "--set", MAP_SQL,
                "--set", "env.schema_in_prompt=false", "--set", f"env.mcp_servers.0.error_pattern={json.dumps(TEXT_ERRORS)}",
                "--max-steps", "2", "--output-dir", str(out), "--set", "training.time_budget_minutes=null",
                "--set", "training.tasks_per_step=1", "--set", "grpo.group_size=2", "--set", "training.eval_num_tasks=1",
                "--set", "training.eval_samples=1", "--set", "training.probe_tasks=0", "--set", "training.probe_held_out_tasks=0", timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2]
    assert _sha256(database) == before
