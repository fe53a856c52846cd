"""Bring your own task family in one file (`--task-file`, examples/price_lookup.py): its plain
functions served as a real MCP stdio server, its tasks, its verdict; evaluated and trained 2 steps
through the real CLI, with nothing on PYTHONPATH."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from skyrl_tool_agent.config import load_config
from skyrl_tool_agent.env.chat_format import format_answer, format_tool_call
from skyrl_tool_agent.env.pools import EnvRuntime
from skyrl_tool_agent.eval.evaluate import EvalOptions, run_evaluation
from skyrl_tool_agent.eval.splits import load_eval_tasks
from skyrl_tool_agent.examples.one_file import task_file_overrides
from skyrl_tool_agent.rollout.agents import ScriptedAgent
from skyrl_tool_agent.rollout.collector import CollectorSettings
from tests.fixtures.cli_in_process import cli_in_process
from tests.fixtures.config_files import REPO

EXAMPLE = REPO / "examples" / "price_lookup.py"


def _cli(*args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(WANDB_MODE="disabled", WEAVE_DISABLED="true", TOKENIZERS_PARALLELISM="false", COLUMNS="200")
    return subprocess.run([sys.executable, "-m", "skyrl_tool_agent.commands.main", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)


def test_the_files_tools_are_a_real_mcp_server():
    config = load_config(overrides=task_file_overrides(EXAMPLE))
    selection = load_eval_tasks(config, "dev")
    assert [t.task_id for t in selection.tasks] == ["price-0", "price-1", "price-2"]

    def script(request):  # look the price up (the first time with a wrong item), then answer what the tool said
        item = request.task.question.split("does ")[1].split(" cost")[0]
        observation = request.messages[-1]["content"]
        if request.turn == 0:
            return [format_tool_call("get_price", {"item": "caviar"})]
        if request.turn == 1:
            return [format_tool_call("get_price", {"item": item})]
        return [format_answer(observation.splitlines()[1])]  # <tool_response>\n7.00\n</tool_response>

    runtime = EnvRuntime(config.env, selection.db_root)
    try:
        run = run_evaluation(selection.tasks, runtime, ScriptedAgent(script), CollectorSettings(max_turns=4),
                             EvalOptions(family="prices"))
    finally:
        runtime.close()
    assert run.results["accuracy"] == 1.0 and run.results["family"] == "prices"
    sample = run.records[0]["samples"][0]
    assert sample["tool_calls"] == 2 and sample["tool_errors"] == 1
    contents = [m["content"] for m in sample["messages"]]
    assert any("unknown item 'caviar'" in c for c in contents) and any("7.00" in c for c in contents), contents
    assert sample["components"]["correct"] == 1.0 and "format" in sample["components"]


def test_one_file_evaluates_and_trains_two_steps(tmp_path, capsys):
    """`eval` through the command's `main` in this process (`cli_in_process`: a launch would only
    import torch again), `train` through a process of its own with nothing on PYTHONPATH."""
    code, _, stderr = cli_in_process(["eval", "--task-file", str(EXAMPLE), "--policy", "oracle",
                                      "--output-dir", str(tmp_path / "eval")], capsys)
    assert code == 0, stderr[-3000:]
    results = json.loads((tmp_path / "eval" / "results.json").read_text())
    assert (results["family"], results["n"], results["accuracy"]) == ("prices", 3, 1.0)

    out = tmp_path / "run"
    trained = _cli("train", "--task-file", str(EXAMPLE), "--max-steps", "2", "--output-dir", str(out),
                   "--set", "training.time_budget_minutes=null", "--set", "training.tasks_per_step=2",
                   "--set", "grpo.group_size=2", "--set", "training.eval_num_tasks=3",
                   "--set", "training.eval_samples=0", "--set", "training.probe_tasks=0", "--set", "training.probe_held_out_tasks=0",
                   "--set", "grpo.max_new_tokens_per_turn=32",  # a price answer is a few tokens
                   "--set", "training.wandb.mode=disabled")  # else an offline W&B run (auto), its own process
    assert trained.returncode == 0, trained.stderr[-3000:]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2] and "reward/correct" in rows[1] and "reward/format" in rows[1]
    assert (out / "final" / "adapter_config.json").is_file() and (out / "report.html").is_file()
    assert "GRPO steps" in trained.stdout
    # the family's own words, in the end-of-run table and the step lines: no SQL words
    assert "accuracy change:" in trained.stdout and "execution" not in trained.stdout
    assert " EX " not in trained.stdout + trained.stderr
    card = (out / "final" / "README.md").read_text()  # the model card too
    assert "`prices` tasks" in card and "| accuracy |" in card and "SQL" not in card and "text-to-sql" not in card
