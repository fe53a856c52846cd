"""A task family beyond SQL, end to end: the shipped inventory example (its MCP server process,
tasks, verifier term) through the same env, collector and GRPO trainer as SQL."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest

from skyrl_tool_agent.config import load_config
from skyrl_tool_agent.config.errors import ConfigError, UserInputError
from skyrl_tool_agent.data.tasks import load_tasks
from skyrl_tool_agent.env.pools import EnvRuntime
from skyrl_tool_agent.examples.inventory import TASKS_FILE
from skyrl_tool_agent.examples.inventory.agent import ScriptedInventoryAgent
from skyrl_tool_agent.rewards.rubric import Rubric, Term
from skyrl_tool_agent.rewards.terms import BUILTIN_TERMS, Episode, reward_term
from skyrl_tool_agent.rollout.collector import CollectorSettings, TrajectoryCollector

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "configs" / "examples" / "inventory.yaml"
TASKS = load_tasks(TASKS_FILE)
VERIFIER = "skyrl_tool_agent.examples.inventory:inventory_match"


def _collect(runtime: EnvRuntime, *, wrong: bool) -> list:
    collector = TrajectoryCollector(runtime, ScriptedInventoryAgent(wrong=wrong), settings=CollectorSettings(max_turns=4))
    return asyncio.run(collector.collect(TASKS, 1))


@pytest.fixture(scope="module")
def runtime(tmp_path_factory):
    rt = EnvRuntime(load_config(config_file=EXAMPLE).env, tmp_path_factory.mktemp("no_databases"))
    yield rt
    rt.close()


def test_the_verifier_decides_through_the_real_env_and_server(runtime: EnvRuntime) -> None:
    assert {t.name for t in runtime.tools} == {"search_items", "get_item", "calculate"}
    right = _collect(runtime, wrong=False)
    assert len(right) == len(TASKS) >= 10
    for traj in right:  # a tool call that really ran, then the ground truth: solved, reward 1.0
        assert traj.messages[0]["content"].startswith("You answer questions about a warehouse")
        assert traj.result.tool_calls == 1 and traj.result.tool_errors == 0
        assert traj.result.solved and traj.result.reward == 1.0, traj.messages
    wrong = _collect(runtime, wrong=True)
    for traj in wrong:  # well formed but wrong: the verifier gives 0, only the format term is left
        assert not traj.result.solved and traj.result.components["inventory_match"] == 0.0
        assert traj.result.reward == pytest.approx(0.1 / 1.1)
    verifier_only = load_config(config_file=EXAMPLE, overrides=[
        f"env.reward.terms=[{{name: inventory_match, weight: 1.0, function: '{VERIFIER}'}}]"])
    alone = EnvRuntime(verifier_only.env, runtime.db_root)
    try:
        assert [t.result.reward for t in _collect(alone, wrong=True)] == [0.0] * len(TASKS)
    finally:
        alone.close()


def test_the_verdict_term_runs_once_and_decides_what_counts() -> None:
    calls = []

    def match(episode: Episode) -> float:
        calls.append(episode.answer)
        return 1.0 if episode.answer == episode.ground_truth else 0.0

    near = reward_term(only_when_wrong=True)(lambda episode: 0.5)
    terms = [Term("match", 1.0, match), Term("format", 0.1, BUILTIN_TERMS["format"]), Term("near", 0.5, near)]
    rubric = Rubric(terms, verdict_term="match")
    right = rubric.score(Episode("42", "42", None, format_ok=True))
    assert right.total == 1.0 and right.solved and right.terms["match"] == 1.0 and calls == ["42"]
    wrong = rubric.score(Episode("41", "42", None, format_ok=True))
    assert not wrong.solved and wrong.total == pytest.approx((0.1 + 0.5 * 0.5) / 1.1) and calls == ["42", "41"]
    with pytest.raises(ValueError, match=r"only_when_wrong terms \(near 1.5\) must not outweigh match \(1\)"):
        Rubric([*terms[:2], Term("near", 1.5, near)], verdict_term="match")


def test_bad_family_values_are_one_line_errors(runtime: EnvRuntime) -> None:
    with pytest.raises(ConfigError, match=r"unknown task family 'sqll': give one of sql, inventory") as info:
        load_config(config_file=EXAMPLE, overrides=["env.task_family=sqll"])
    assert "\n" not in str(info.value)
    for value, message in (("no_such_module:FAMILY", "cannot import no_such_module"),
                           ("skyrl_tool_agent.examples.inventory:TASKS_FILE", "is not a TaskFamily")):
        with pytest.raises(UserInputError, match=message):
            EnvRuntime(load_config(config_file=EXAMPLE, overrides=[f"env.task_family={value}"]).env, runtime.db_root)
    with pytest.raises(UserInputError, match="skyrl_sql is SQL's turn format; task family 'inventory' needs hermes"):
        EnvRuntime(load_config(config_file=EXAMPLE, overrides=["env.tool_call_format=skyrl_sql"]).env, runtime.db_root)
    # The family's verifier must be a term of the reward: else nothing would decide correctness.
    sql_terms = load_config(config_file=EXAMPLE, overrides=["env.reward.terms=[{name: format, weight: 1.0}]"])
    with pytest.raises(UserInputError, match="decides correctness by its term 'inventory_match'"):
        EnvRuntime(sql_terms.env, runtime.db_root)
    # The family's tasks trained as SQL (the knob left out): refused before anything runs.
    from skyrl_tool_agent.eval.splits import TaskSplits

    as_sql = load_config(config_file=EXAMPLE, overrides=["env.task_family=sql", f"training.data.train_file={TASKS_FILE}",
                                                         f"training.data.dev_file={TASKS_FILE}",
                                                         f"training.data.db_root={runtime.db_root}"])
    with pytest.raises(UserInputError, match=r"record 0 \(inventory-00\): no db_id, which task family 'sql' needs"):
        TaskSplits.load(as_sql)
    # The command line: one `error:` line, no traceback.
    done = subprocess.run([sys.executable, "-m", "skyrl_tool_agent.config", "show", "--config", str(EXAMPLE),
                           "--set", "env.task_family=sqll"], check=False, cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and done.stderr.startswith("error:") and len(done.stderr.strip().splitlines()) == 1, \
        done.stderr


def test_two_grpo_steps_on_the_example_family_log_its_terms(runtime: EnvRuntime, tmp_path: Path) -> None:
    from skyrl_tool_agent.jobs.train import run_training
    from tests.fixtures.tiny_policy import build_tiny_model_dir

    model_dir = build_tiny_model_dir(runtime, TASKS, tmp_path / "model", sft_steps=10, agent=ScriptedInventoryAgent())
    out = tmp_path / "run"
    sets = {
        "model.name_or_path": model_dir, "model.device": "cpu", "model.lora.r": 4, "model.lora.alpha": 8,
        "training.mode": "lora", "training.output_dir": out, "training.data.train_file": TASKS_FILE,
        "training.data.dev_file": TASKS_FILE, "training.data.db_root": runtime.db_root,
        "training.max_steps": 2, "training.tasks_per_step": 2, "training.checkpoint_every": 0,
        "training.eval_every": 0, "training.eval_num_tasks": 2, "training.eval_samples": 0, "training.probe_tasks": 0, "training.probe_held_out_tasks": 0,
        "training.wandb.mode": "disabled",
        "grpo.group_size": 2, "grpo.max_turns": 2, "grpo.max_new_tokens_per_turn": 32, "grpo.max_total_tokens": 900,
    }
    run_training(load_config(config_file=EXAMPLE, overrides=[f"{k}={v}" for k, v in sets.items()]))
    rows = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    trained = [r for r in rows if r["step"] >= 1]
    assert len(trained) == 2
    for row in trained:
        assert 0.0 <= row["reward/inventory_match"] <= 1.0 and "reward/format" in row
        assert "reward/execution" not in row
    rollouts = [json.loads(x) for x in (out / "rollouts.jsonl").read_text().splitlines()]
    assert rollouts and all(set(r["reward_terms"]) == {"inventory_match", "format"} for r in rollouts)
