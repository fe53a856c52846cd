"""Issue 17 #8: a database that cannot be read is an infrastructure error, never a wrong answer.

Real SQLite files deleted, overwritten, corrupted, emptied or replaced under a warm gold cache; a
real collector with real MCP servers; `summarize` and one real GRPO step on real trajectories.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch

from skyrl_tool_agent.config import Config, EnvConfig
from skyrl_tool_agent.env.pools import EnvRuntime
from skyrl_tool_agent.mcp.pool import BackgroundMCPPool
from skyrl_tool_agent.eval.metrics import summarize
from skyrl_tool_agent.rewards import DatabaseUnavailableError, GoldQueryError, GoldResultCache, score_answer
from skyrl_tool_agent.rollout.agents import OracleAgent
from skyrl_tool_agent.rollout.collector import CollectorSettings, TrajectoryCollector
from skyrl_tool_agent.rollout.trajectory import EpisodeResult, Trajectory
from tests.fixtures.tiny_db import SHOP_TASKS, make_shop_db

GOLD = SHOP_TASKS[0].gold_sql  # customers in Paris: 2


@contextmanager
def started_runtime(db_root: Path) -> Iterator[EnvRuntime]:
    """A runtime over `db_root` whose servers may take minutes to start: this suite also runs on
    loaded 2-core machines, where a niced server process needs tens of seconds to come up."""
    config = EnvConfig(call_timeout_s=60)
    with BackgroundMCPPool(config.resolved_servers(db_root), call_timeout_s=60, startup_timeout_s=300) as pool:
        runtime = EnvRuntime(config, db_root, pool=pool)
        try:
            yield runtime
        finally:
            runtime.close()


@pytest.fixture
def shop(tmp_path: Path) -> Path:
    return make_shop_db(tmp_path / "dbs")


def warm(db: Path) -> GoldResultCache:
    """A gold cache that already holds GOLD's result, as after the first episode of a group."""
    cache = GoldResultCache()
    assert score_answer(GOLD, GOLD, db, format_ok=True, cache=cache).solved
    return cache


def test_deleted_database_is_an_infra_error(shop: Path) -> None:
    cache = warm(shop)
    shop.unlink()
    with pytest.raises(DatabaseUnavailableError, match="not_found"):
        score_answer(GOLD, GOLD, shop, format_ok=True, cache=cache)


def test_database_overwritten_with_garbage_is_an_infra_error(shop: Path) -> None:
    cache = warm(shop)
    shop.write_bytes(b"not a database at all " * 500)
    with pytest.raises(DatabaseUnavailableError, match="SQLITE_NOTADB"):
        score_answer(GOLD, GOLD, shop, format_ok=True, cache=cache)


def test_database_truncated_to_zero_bytes_is_an_infra_error(shop: Path) -> None:
    """SQLite opens an empty file as a new, empty database: the query fails with "no such table"."""
    cache = warm(shop)
    shop.write_bytes(b"")
    with pytest.raises(DatabaseUnavailableError, match="no tables"):
        score_answer(GOLD, GOLD, shop, format_ok=True, cache=cache)


def test_corrupt_table_pages_are_an_infra_error(shop: Path) -> None:
    cache = warm(shop)
    page_size = sqlite3.connect(shop).execute("PRAGMA page_size").fetchone()[0]
    with shop.open("r+b") as f:  # every page after the schema page: the tables' b-trees
        f.seek(page_size)
        f.write(b"\xff" * (shop.stat().st_size - page_size))
    with pytest.raises(DatabaseUnavailableError, match="SQLITE_CORRUPT"):
        score_answer(GOLD, GOLD, shop, format_ok=True, cache=cache)


def test_replaced_database_is_scored_against_its_new_content(shop: Path, tmp_path: Path) -> None:
    """A warm gold result of the old file must not be compared with the new file's answer."""
    cache = warm(shop)
    other = make_shop_db(tmp_path / "other")
    with sqlite3.connect(other) as conn:
        conn.execute("INSERT INTO customer VALUES (5, 'Eve', 'Paris')")
    os.replace(other, shop)
    assert score_answer(GOLD, GOLD, shop, format_ok=True, cache=cache).solved
    stale = "SELECT 2"  # the old answer is wrong now
    assert score_answer(stale, GOLD, shop, format_ok=True, cache=cache).solved is False
    assert cache.misses == 2  # re-queried once for the new file


def test_failures_of_the_query_itself_are_still_scored_zero(shop: Path) -> None:
    cache = warm(shop)
    # An error message may quote any text ("no such table: file is not a database"): only SQLite's
    # result code makes a failure the database's fault.
    for pred in ('SELECT * FROM "file is not a database"', "SELECT * FROM nowhere", "SELEC 1"):
        breakdown = score_answer(pred, GOLD, shop, format_ok=True, cache=cache)
        assert not breakdown.solved and breakdown.pred_error, pred
    with pytest.raises(GoldQueryError, match="no such column") as caught:
        score_answer(GOLD, "SELECT nope FROM customer", shop, format_ok=True)
    assert not isinstance(caught.value, DatabaseUnavailableError)


def test_collector_retries_then_reports_an_unreadable_database(tmp_path: Path) -> None:
    """Deleted mid-run: the MCP server still serves its open connection, scoring cannot read the
    file. The episodes are retried, then reported as infrastructure errors and left out of EX."""
    db = make_shop_db(tmp_path / "dbs")
    with started_runtime(tmp_path / "dbs") as runtime:
        collector = TrajectoryCollector(runtime, OracleAgent(), settings=CollectorSettings(max_episode_retries=1))
        before = asyncio.run(collector.collect([SHOP_TASKS[0]]))
        assert before[0].result.solved
        db.unlink()
        after = asyncio.run(collector.collect([SHOP_TASKS[0], SHOP_TASKS[2]]))
    for traj in after:
        assert traj.result.done_reason == "error" and traj.result.retries == 1, traj.result
        assert "cannot be read" in (traj.result.error or "") and not traj.result.solved
    summary = summarize(before + after)
    assert summary["execution_accuracy"] == 1.0 and summary["scored"] == 1.0
    assert summary["infra_errors"] == 2.0 and summary["infra_error_rate"] == pytest.approx(2 / 3)


def _result(task: str, **fields) -> Trajectory:
    return Trajectory(task, 0, [], EpisodeResult(task, "shop", **fields))


def test_summarize_leaves_infra_errors_out_of_the_rates() -> None:
    episodes = [
        _result("a", reward=1.0, solved=True, final_sql="SELECT 1", components={"syntax": 1.0}, turns=2),
        _result("b", reward=0.2, final_sql="SELECT 2", components={"syntax": 1.0}, turns=4),
        _result("c", done_reason="error", error="database cannot be read"),
        _result("d", done_reason="error", error="MCP server unavailable"),
    ]
    s = summarize(episodes)
    assert (s["n"], s["scored"], s["infra_errors"], s["infra_error_rate"]) == (4.0, 2.0, 2.0, 0.5)
    assert s["execution_accuracy"] == 0.5 and s["reward_mean"] == pytest.approx(0.6)
    assert s["answered_rate"] == 1.0 and s["valid_sql_rate"] == 1.0 and s["mean_turns"] == 3.0
    only_infra = summarize(episodes[2:])
    assert only_infra["execution_accuracy"] is None and only_infra["scored"] == 0.0 and only_infra["infra_error_rate"] == 1.0


def test_grpo_step_does_not_train_on_groups_with_infra_errors(tmp_path: Path) -> None:
    """A group of one solved episode and one infrastructure error: the error's placeholder reward 0
    would give the solved episode a positive advantage. No update may come from that group."""
    from skyrl_tool_agent.env.chat_format import render_conversation
    from skyrl_tool_agent.grpo.trainer import GRPOTrainer
    from skyrl_tool_agent.data.loader import build_loader
    from skyrl_tool_agent.policy.embedded import new_tiny_qwen2, train_tokenizer
    from tests.fixtures.tiny_policy import oracle_messages, tiny_policy

    make_shop_db(tmp_path / "dbs")
    with started_runtime(tmp_path / "dbs") as runtime:
        conversations = oracle_messages(runtime, SHOP_TASKS)
        tokenizer = train_tokenizer((render_conversation(c, add_generation_prompt=False) for c in conversations), 400)
        model = new_tiny_qwen2(tokenizer, hidden_size=32, layers=1, heads=2, kv_heads=1, intermediate_size=64)
        model.save_pretrained(tmp_path / "model")
        tokenizer.save_pretrained(tmp_path / "model")
        policy = tiny_policy(tmp_path / "model", mode="lora")
        config = Config(
            model={"device": "cpu", "lora": {"r": 4, "alpha": 8, "dropout": 0.0}},
            training={"tasks_per_step": 1, "max_steps": 2, "learning_rate": 0.05, "warmup_steps": 0,
                      "wandb": {"mode": "disabled"}},
            grpo={"group_size": 2, "filter_uniform_groups": False, "kl_coef": 0.0, "max_turns": 4,
                  "max_new_tokens_per_turn": 40, "max_total_tokens": 1200},
        )

        class OracleTrainer(GRPOTrainer):
            """Real oracle episodes (token ids recorded); the second of each group failed on
            infrastructure after its retries, exactly as the collector reports one."""

            def collect(self, tasks, group_size, params):  # type: ignore[override]
                collector = TrajectoryCollector(self.runtime, OracleAgent(), tokenizer=self.policy.tokenizer,
                                                settings=self.collector_settings)
                out = asyncio.run(collector.collect(tasks, group_size))
                for i in range(1, len(out), group_size):
                    failed = EpisodeResult(out[i].task_id, out[i].result.db_id, done_reason="error",
                                           error="database cannot be read", retries=1)
                    out[i] = Trajectory(out[i].task_id, out[i].group_index, [], failed)
                return out

        trainer = OracleTrainer(config, policy, runtime, build_loader(config, SHOP_TASKS), [], output_dir=tmp_path / "out")
        weights = {n: p.detach().clone() for n, p in policy.model.named_parameters() if p.requires_grad}
        out = trainer.train_step()
    assert [t.result.done_reason for t in out.trajectories] == ["answer", "error"]
    assert out.trajectories[0].result.solved and out.trajectories[0].token_ids
    assert out.metrics["train/trajectories_used"] == 0 and out.metrics["train/infra_errors"] == 1
    assert out.metrics["train/execution_accuracy"] == 1.0
    assert all(torch.equal(p, weights[n]) for n, p in policy.model.named_parameters() if p.requires_grad)
    (task_id,) = {t.task_id for t in out.trajectories}
    assert trainer.loader.sampler.state_dict()["stats"][task_id] == [1.0, 1.0, 1.0]  # one attempt, solved (not 1 of 2)
