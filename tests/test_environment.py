"""MCPToolEnvironment end to end: real MCP server processes, real SQLite, skyrl_gym.make."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import skyrl_gym
import skyrl_tool_agent  # noqa: F401 - registers mcp_tool_env
from skyrl_tool_agent.config import EnvConfig, MCPServerConfig
from skyrl_tool_agent.env.environment import MCPToolEnvironment
from skyrl_tool_agent.env.pools import EnvRuntime
from skyrl_tool_agent.rollout.agents import Agent, oracle_turn_texts
from tests.fixtures.tiny_db import SHOP_TASKS, make_shop_db

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def shop_root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("dbs")
    make_shop_db(root)
    return root


@pytest.fixture(scope="module")
def runtime(shop_root):
    rt = EnvRuntime(EnvConfig(), shop_root)
    yield rt
    rt.close()


def _extras(task, **more):
    return {"reward_spec": {"method": "rule", "ground_truth": task.gold_sql}, "db_id": task.db_id, **more}


def test_skyrl_gym_make_runs_oracle_episode_to_reward_one(shop_root):
    task = SHOP_TASKS[1]
    explore = EnvConfig.exploring().model_dump(include={"offered_tools", "schema_in_prompt", "bind_db_id"})
    env = skyrl_gym.make("mcp_tool_env", env_config={"db_root": str(shop_root), **explore},
                         extras=_extras(task, max_turns=6))
    messages, info = env.init([{"role": "user", "content": f"Database: shop\nQuestion: {task.question}"}])
    assert messages[0]["role"] == "system" and "<tools>" in messages[0]["content"]
    for name in ("list_tables", "describe_table", "execute_sql"):
        assert f'"name": "{name}"' in messages[0]["content"]  # the tools the server actually lists
    turns = oracle_turn_texts(task, info)
    assert len(turns) == 4 and '"db_id": "shop"' in turns[0]
    for i, turn in enumerate(turns):
        out = env.step(turn)
        if i < len(turns) - 1:
            assert not out["done"]
            assert out["observations"][0]["content"].startswith("<tool_response>")
    assert out["done"] and out["reward"] == pytest.approx(1.0)
    assert out["metadata"]["reward_components"]["execution"] == 1.0
    # the execute_sql observation showed the real result (10.5 + 20.0)
    assert any("30.5" in m["content"] for m in env.chat_history if m["role"] == "user")


def test_default_episode_has_schema_in_prompt_and_binds_db_id(runtime, shop_root):
    """CPU defaults: only execute_sql offered, db_id hidden and filled by the env, schema in the prompt."""
    task = SHOP_TASKS[1]
    env = MCPToolEnvironment(extras=_extras(task, max_turns=4), runtime=runtime)
    messages, info = env.init([{"role": "user", "content": f"Database: shop\nQuestion: {task.question}"}])
    system, user = messages[0]["content"], messages[1]["content"]
    assert '"name": "execute_sql"' in system and '"name": "list_tables"' not in system
    assert "db_id" not in system  # hidden from the schema the policy sees
    assert user.startswith("Schema:\n") and "customer(" in user and user.endswith(task.question)
    assert info["schema_in_prompt"] and "execute_sql" in info["db_id_bound"]
    out = env.step('<tool_call>{"name": "list_tables", "arguments": {}}</tool_call>')  # not offered
    assert out["observations"][0]["content"].startswith("Error:") and "list_tables" in out["observations"][0]["content"]
    out = env.step('<tool_call>{"name": "execute_sql", "arguments": {"db_id": "other", "sql": "SELECT 1"}}</tool_call>')
    assert "db_id" in out["observations"][0]["content"]  # an argument the policy may not pass
    turns = oracle_turn_texts(task, info)
    assert len(turns) == 2 and "db_id" not in turns[0]
    out = env.step(turns[0])
    assert "30.5" in out["observations"][0]["content"]  # ran on the episode's database
    out = env.step(turns[1])
    assert out["done"] and out["metadata"]["reward_components"]["execution"] == 1.0


def test_offered_tools_must_exist(shop_root):
    with pytest.raises(ValueError, match="offered_tools: no server lists \\['nope'\\]"):
        EnvRuntime(EnvConfig(offered_tools=["execute_sql", "nope"]), shop_root)


def test_wrong_answer_scores_below_one_and_malformed_turns_never_raise(runtime):
    task = SHOP_TASKS[0]
    env = MCPToolEnvironment(extras=_extras(task, max_turns=8), runtime=runtime)
    env.init([{"role": "user", "content": task.question}])
    bad_turns = [
        "<tool_call>{not json}</tool_call>",
        '<tool_call>{"name": "drop_everything", "arguments": {}}</tool_call>',
        '<tool_call>{"name": "execute_sql", "arguments": {"db_id": "shop"}}</tool_call>',
        "I think the answer is 2.",
        "<answer>SELECT 1</answer> and more text",
    ]
    for turn in bad_turns:
        out = env.step(turn)
        assert not out["done"]
        text = out["observations"][0]["content"]
        assert text.startswith("Error:"), text
    out = env.step('<tool_call>{"name": "execute_sql", "arguments": {"sql": "SELEC nope"}}</tool_call>')
    assert "error" in out["observations"][0]["content"].lower()
    assert env.tool_errors == 1
    out = env.step("<answer>SELECT count(*) FROM customer</answer>")
    assert out["done"]
    assert out["metadata"]["reward_components"]["execution"] == 0.0
    assert 0.0 <= out["reward"] < 1.0
    assert env.format_errors == 5


def test_episode_ends_at_max_turns_with_zero_execution_reward(runtime):
    task = SHOP_TASKS[0]
    env = MCPToolEnvironment(extras=_extras(task, max_turns=2), runtime=runtime)
    _, info = env.init([{"role": "user", "content": task.question}])
    assert not env.step(oracle_turn_texts(task, info)[0])["done"]
    out = env.step(oracle_turn_texts(task, info)[0])
    assert out["done"] and out["metadata"]["done_reason"] == "max_turns"
    assert out["metadata"]["reward_components"]["execution"] == 0.0


def test_env_works_with_any_mcp_server(shop_root):
    calc = MCPServerConfig(name="calc", command=sys.executable, args=[str(REPO / "tests/fixtures/calc_server.py")])
    config = EnvConfig.exploring(mcp_servers=[calc])
    rt = EnvRuntime(config, shop_root)
    try:
        assert {t.name for t in rt.tools} == {"add", "shout"}
        task = SHOP_TASKS[0]
        env = MCPToolEnvironment(extras=_extras(task, max_turns=4), runtime=rt)
        messages, _ = env.init([{"role": "user", "content": "add 2 and 40"}])
        assert '"name": "add"' in messages[0]["content"]
        out = env.step('<tool_call>{"name": "add", "arguments": {"a": 2, "b": 40}}</tool_call>\n'
                       '<tool_call>{"name": "shout", "arguments": {"text": "hi"}}</tool_call>')
        text = out["observations"][0]["content"]
        assert "42" in text and "HI" in text
        out = env.step('<tool_call>{"name": "shout", "arguments": {"text": ""}}</tool_call>')
        assert "must not be empty" in out["observations"][0]["content"]
        out = env.step(f"<answer>{task.gold_sql}</answer>")
        assert out["done"] and out["reward"] == pytest.approx(1.0)
    finally:
        rt.close()


def test_skyrl_sql_tag_style(shop_root):
    task = SHOP_TASKS[0]
    env = skyrl_gym.make("mcp_tool_env", env_config={"db_root": str(shop_root), "tool_call_format": "skyrl_sql"},
                         extras=_extras(task))
    env.init([{"role": "user", "content": task.question}])
    out = env.step(f"<think>count them</think><sql>{task.gold_sql}</sql>")
    assert "2" in out["observations"][0]["content"] and not out["done"]
    out = env.step(f"<think>done</think><solution>{task.gold_sql}</solution>")
    assert out["done"] and out["reward"] == pytest.approx(1.0)


def test_shaping_rewards_penalise_failed_turns_only_when_enabled(shop_root):
    task = SHOP_TASKS[0]
    rt = EnvRuntime(EnvConfig(shaping_rewards=True, shaping_penalty=0.05), shop_root)
    try:
        env = MCPToolEnvironment(extras=_extras(task, max_turns=5), runtime=rt)
        _, info = env.init([{"role": "user", "content": task.question}])
        assert env.step("no call here")["reward"] == pytest.approx(-0.05)
        bad_sql = '<tool_call>{"name": "execute_sql", "arguments": {"sql": "SELECT nope"}}</tool_call>'
        assert env.step(bad_sql)["reward"] == pytest.approx(-0.05)
        assert env.step(oracle_turn_texts(task, info)[0])["reward"] == 0.0
        assert env.step(f"<answer>{task.gold_sql}</answer>")["reward"] == pytest.approx(1.0 - 0.1 / 1.15)  # format lost
    finally:
        rt.close()


def test_sql_timeout_knob_reaches_the_tool_server(shop_root):
    """env.sql_timeout_s is passed to the default server as --timeout-s (the ${sql_timeout_s}
    placeholder): an endless query is cut at the configured limit, not the server's default 5 s."""
    import time

    rt = EnvRuntime(EnvConfig(sql_timeout_s=0.3), shop_root)
    try:
        env = MCPToolEnvironment(extras=_extras(SHOP_TASKS[0], max_turns=3), runtime=rt)
        env.init([{"role": "user", "content": SHOP_TASKS[0].question}])
        endless = "WITH RECURSIVE r(i) AS (SELECT 1 UNION ALL SELECT i+1 FROM r) SELECT count(*) FROM r"
        start = time.monotonic()
        out = env.step('<tool_call>{"name": "execute_sql", "arguments": {"sql": "%s"}}</tool_call>' % endless)
        assert "timeout" in out["observations"][0]["content"] and time.monotonic() - start < 2.0
    finally:
        rt.close()


def test_collector_reports_a_broken_gold_query_and_keeps_going(runtime):
    import asyncio

    from skyrl_tool_agent.data.tasks import Task
    from skyrl_tool_agent.rollout.agents import OracleAgent
    from skyrl_tool_agent.rollout.collector import TrajectoryCollector

    broken = Task(task_id="bad", db_id="shop", question="?", gold_sql="SELECT x FROM nowhere", difficulty="easy")
    no_db = Task(task_id="no-db", db_id="missing", question="?", gold_sql="SELECT 1", difficulty="easy")
    collector = TrajectoryCollector(runtime, OracleAgent())
    out = asyncio.run(collector.collect([SHOP_TASKS[0], broken, no_db, SHOP_TASKS[2]]))
    assert [t.result.solved for t in out] == [True, False, False, True]
    assert out[1].result.done_reason == "error" and "gold SQL failed" in out[1].result.error
    # schema_in_prompt cannot read a missing database: that episode fails, the others run
    assert out[2].result.done_reason == "error" and "cannot read the schema of database 'missing'" in out[2].result.error


class _CharTokenizer:
    """Token ids without a model, one per character: the collector only counts and appends them."""

    def __call__(self, text: str, add_special_tokens: bool = False) -> dict:
        return {"input_ids": [ord(c) for c in text]}

    def convert_tokens_to_ids(self, token: str) -> int:
        return 0


def test_an_episode_ended_by_the_token_budget_is_scored_through_the_envs_public_score(runtime, monkeypatch):
    """The collector ends an episode at its token budget and scores it by the env's public
    `score`, the one `step` uses (it read the private `_score` before)."""
    import asyncio

    from skyrl_tool_agent.rollout.agents import OracleAgent
    from skyrl_tool_agent.rollout.collector import CollectorSettings, TrajectoryCollector

    scored: list[int] = []
    original = MCPToolEnvironment.score

    def spy(env: MCPToolEnvironment):
        scored.append(env.turns)
        return original(env)

    monkeypatch.setattr(MCPToolEnvironment, "score", spy)
    collector = TrajectoryCollector(runtime, OracleAgent(), tokenizer=_CharTokenizer(),
                                    settings=CollectorSettings(max_total_tokens=1))  # no room for a first turn
    (episode,) = asyncio.run(collector.collect([SHOP_TASKS[0]]))
    assert episode.result.done_reason == "max_tokens" and scored == [0]
    assert episode.result.components["execution"] == 0.0 and not episode.result.solved


def test_the_collector_reads_no_private_member_of_the_env():
    import ast

    from skyrl_tool_agent.rollout import collector

    tree = ast.parse(Path(collector.__file__).read_text())
    private = sorted({node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)
                      and isinstance(node.value, ast.Name) and node.value.id == "env"
                      and node.attr.startswith("_") and not node.attr.startswith("__")})
    assert not private, f"the collector reads the env's private {private}"


def test_the_collector_builds_its_envs_from_the_task_not_from_a_skyrl_row(runtime, monkeypatch):
    """Our own loop hands the env the Task (`MCPToolEnvironment.for_task`); the row constructor is
    skyrl_gym.make's way in, and both build the same episode."""
    import asyncio

    from skyrl_tool_agent.rollout.agents import OracleAgent
    from skyrl_tool_agent.rollout.collector import TrajectoryCollector

    task = SHOP_TASKS[0]
    row = MCPToolEnvironment(extras={**_extras(task, max_turns=3), "reward_spec": {"ground_truth": task.gold_sql,
                                                                                   "keep_distinct": False}},
                             runtime=runtime)
    direct = MCPToolEnvironment.for_task(task, runtime, max_turns=3, keep_distinct=False)
    assert vars(direct) == vars(row)
    prompt = [{"role": "user", "content": task.question}]
    assert direct.init(prompt) == row.init(prompt)

    def no_rows(*_args, **_kwargs):
        raise AssertionError("the collector packed the task into a SkyRL row")

    monkeypatch.setattr(MCPToolEnvironment, "__init__", no_rows)
    (episode,) = asyncio.run(TrajectoryCollector(runtime, OracleAgent()).collect([task]))
    assert episode.result.solved


def test_one_default_episode_limit_for_a_row_the_collector_and_a_run(runtime):
    """A SkyRL row without max_turns, `CollectorSettings()` and a run of the default config end
    episodes alike (the env said 6 turns, the collector 6 turns and 2,048 tokens, the config 3
    and 1,536): every default is the config's knob, referenced."""
    from skyrl_tool_agent.config import Config
    from skyrl_tool_agent.env.environment import DEFAULT_MAX_TURNS
    from skyrl_tool_agent.rollout.collector import CollectorSettings

    config = Config()
    row = MCPToolEnvironment(extras=_extras(SHOP_TASKS[0]), runtime=runtime)
    assert row.max_turns == DEFAULT_MAX_TURNS == config.grpo.max_turns  # build-data --export's default too
    limits = ("max_turns", "max_new_tokens_per_turn", "max_total_tokens", "concurrency", "max_batch",
              "max_episode_retries")
    default, configured = CollectorSettings(), CollectorSettings.from_config(config)
    assert {k: getattr(default, k) for k in limits} == {k: getattr(configured, k) for k in limits}


def test_tool_prefix_runs_two_servers_that_list_the_same_tools(cfg_dir, shop_root):
    """The documented fix for duplicate tool names, from a config file through a real episode:
    a second sqlite server with tool_prefix 'b_' offers b_execute_sql next to execute_sql."""
    from skyrl_tool_agent.config import load_config

    path = cfg_dir / "env_config.yaml"
    text = path.read_text()
    first = text[text.index("  - name: sqlite"):text.index("call_timeout_s:")]
    second = first.replace("name: sqlite ", "name: sqlite_b").replace("tool_prefix: ''", "tool_prefix: b_")
    path.write_text(text.replace(first, first + second).replace("offered_tools: [execute_sql]",
                                                                 "offered_tools: [execute_sql, b_execute_sql]"))
    config = load_config(cfg_dir).env
    assert config.mcp_servers[1].tool_prefix == "b_"
    rt = EnvRuntime(config, shop_root)
    try:
        assert {t.name: t.server for t in rt.tools} == {"execute_sql": "sqlite", "b_execute_sql": "sqlite_b"}
        task = SHOP_TASKS[0]
        env = MCPToolEnvironment(extras=_extras(task, max_turns=3), runtime=rt)
        messages, _ = env.init([{"role": "user", "content": task.question}])
        assert '"name": "b_execute_sql"' in messages[0]["content"]
        out = env.step('<tool_call>{"name": "b_execute_sql", "arguments": {"sql": "SELECT count(*) FROM customer"}}'
                       '</tool_call>')
        assert out["observations"][0]["content"].strip() == "<tool_response>\ncount(*)\n4\n</tool_response>"
    finally:
        rt.close()


class FixedAnswerAgent(Agent):
    """Answers every episode with one SQL query at once (an agent, not a stand-in: the collector,
    env, MCP pool and scoring all run for real)."""

    def __init__(self, sql: str) -> None:
        self.sql = sql

    async def act(self, requests):
        from skyrl_tool_agent.env.chat_format import format_answer
        from skyrl_tool_agent.rollout.agents import AgentTurn

        return [AgentTurn(format_answer(self.sql)) for _ in requests]


@pytest.mark.parametrize("reward_keep", [True, False])
def test_distinct_semantics_of_training_reward_and_evaluation_reports(shop_root, reward_keep):
    """Gold has DISTINCT, the answer not (Paris twice): right only when DISTINCT is stripped. The
    training reward follows env.reward.keep_distinct; evaluation settings follow eval_keep_distinct
    (default: stripped, the official Spider behaviour), whatever the runtime's reward says."""
    import asyncio

    from skyrl_tool_agent.config import load_config
    from skyrl_tool_agent.data.tasks import Task
    from skyrl_tool_agent.rollout.collector import CollectorSettings, TrajectoryCollector
    from tests.fixtures.config_files import CONFIGS

    config = load_config(CONFIGS, [f"env.reward.keep_distinct={str(reward_keep).lower()}"])
    assert config.env.reward.eval_keep_distinct is False
    task = Task(task_id="d", db_id="shop", question="Which cities have customers?", difficulty="easy",
                gold_sql="SELECT DISTINCT city FROM customer WHERE city = 'Paris'")
    agent = FixedAnswerAgent("SELECT city FROM customer WHERE city = 'Paris'")
    rt = EnvRuntime(config.env, shop_root)
    try:
        def solved(settings: CollectorSettings) -> bool:
            (episode,) = asyncio.run(TrajectoryCollector(rt, agent, settings=settings).collect([task], 1))
            return episode.result.solved

        assert solved(CollectorSettings.from_config(config)) is (not reward_keep)
        assert solved(CollectorSettings.from_config(config, evaluation=True)) is True
        strict = config.model_copy(update={"env": config.env.model_copy(
            update={"reward": config.env.reward.model_copy(update={"eval_keep_distinct": True})})})
        assert solved(CollectorSettings.from_config(strict, evaluation=True)) is False
    finally:
        rt.close()
