"""The speedrun's CPU miniature: the real command at tiny shapes (a 0.2M-parameter Qwen2 built
from nothing, a few supervised steps on real oracle episodes, two GRPO steps through the real MCP
server, continued SFT, evaluations of a few dev tasks) and that its phases connect: the supervised
loss falls, both arms start from the built weights, GRPO steps run on the device's sampler, the
evaluations carry paired intervals and the error anatomy, and the whole run stays within its
budget. And the RL pool held out of the build: no gold query of it in the build's oracle episodes
(real episodes through the real server), on a pool whose queries repeat under other wordings."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from skyrl_tool_agent.commands.speedrun import main
from skyrl_tool_agent.jobs.speedrun_plan import CURVES_FILE, LOG_FILE, METRICS_FILE, RESULT_FILE, TABLE_FILE, arm_seconds

MINUTES = 3.0  # headroom: the build must run its 5 fixed steps before its time cap even on a loaded VM
TINY = ["--hidden-size", "64", "--layers", "2", "--heads", "2", "--kv-heads", "1", "--intermediate-size", "128",
        "--pool-tasks", "24", "--rl-pool-tasks", "8", "--validation-tasks", "2", "--build-evaluations", "1", "--build-steps", "5",
        "--sft-batch-size", "4", "--points", "1",
        "--set", "training.eval_num_tasks=4", "--set", "training.eval_samples=2", "--set", "grpo.group_size=4",
        "--set", "training.tasks_per_step=2", "--set", "grpo.max_turns=2", "--set", "grpo.max_new_tokens_per_turn=12",
        "--set", "env.collector.concurrency=16", "--set", "env.sessions_per_server=1",
        "--set", "training.probe_tasks=2", "--set", "training.probe_held_out_tasks=2", "--set", "training.probe_every=1", "--set", "training.max_steps=2"]


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[int, dict, Path]:
    base = tmp_path_factory.mktemp("speedrun")
    out = base / "out"
    rc = main(["--minutes", str(MINUTES), "--output-dir", str(out), "--work-dir", str(base / "work"), *TINY],
              from_process_start=False)
    return rc, json.loads((out / RESULT_FILE).read_text()), out


def test_every_phase_runs_within_the_budget_into_flat_files(run) -> None:
    rc, record, out = run
    assert rc == 0, record["phases"]
    assert [(name, p["status"]) for name, p in record["phases"].items()] == [
        (name, "ok") for name in ("setup", "build", "start", "grpo", "sft", "report")]
    assert record["elapsed_s"] <= 60 * MINUTES
    assert sorted(p.name for p in out.iterdir()) == sorted([RESULT_FILE, TABLE_FILE, CURVES_FILE, METRICS_FILE,
                                                            LOG_FILE])


def test_the_build_learns_and_both_arms_start_from_its_weights(run) -> None:
    _, record, _ = run
    build = record["build"]
    assert build["steps"] == 5 and build["loss_last"] < build["loss_first"]
    # --build-steps fixes the schedule (the time cap only guards): 1 evaluation on the way, then the last step
    assert build["fixed_steps"] and build["planned_steps"] == 5
    assert [e["step"] for e in build["validation_curve"]] == [3, 5]
    assert record["arms_start_from_build"] == {"grpo": True, "sft": True}


def test_grpo_steps_run_on_the_devices_sampler_and_are_logged(run) -> None:
    _, record, out = run
    grpo = record["grpo"]
    assert grpo["sampler"] == "engine"
    assert [s["step"] for s in grpo["steps"]] == [1, 2]
    for step in grpo["steps"]:
        assert step["rollout_s"] > 0 and step["generated_tokens"] > 0 and step["episodes"] == 8
        assert step["turns_per_episode"] >= 1 and step["tool_calls_per_episode"] is not None
        assert step["probe"] is not None  # the revisited training tasks, every step here
    assert grpo["throughput"]["generated_tokens_per_s_mean"] > 0
    rows = [json.loads(line) for line in (out / METRICS_FILE).read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2] and "probe/execution_accuracy" in rows[0]


def test_evaluations_carry_paired_intervals_and_the_table_shows_them(run) -> None:
    _, record, out = run
    start = record["start"]
    assert len(start["solved"]) == 4 and start["sampled"]["k"] == 2
    for arm in ("grpo", "sft"):
        point = record[arm]["curve"][-1]
        for key in ("delta", "sampled_delta"):
            d = point[key]
            assert d["n"] == 4 and d["low"] <= d["delta"] <= d["high"]
    assert record["sft"]["steps"] >= 1
    assert set(record["grpo_minus_sft"]) == {"greedy", "avg@k"}
    table = (out / TABLE_FILE).read_text()
    assert "| GRPO − SFT |" in table and "| continued SFT |" in table and "generated tokens/s" in table


def test_the_rl_pool_is_held_out_of_the_build_and_each_arm_has_its_anatomy(run) -> None:
    _, record, out = run
    build = record["phases"]["build"]
    assert build["rl_pool_tasks"] == 8 and build["build_pool_tasks"] <= 24 - 8
    assert record["build"]["rl_pool_examples"] >= 1  # what the SFT arm trains on
    assert record["start"]["error_anatomy"]["scored"] == 4
    for arm in ("grpo", "sft"):
        assert set(record[arm]["error_anatomy_delta"]) >= {"literal_only", "not_executable"}
    assert "Why the dev answers are wrong" in (out / TABLE_FILE).read_text()


def test_no_gold_query_of_the_rl_pool_is_in_the_builds_oracle_episodes() -> None:
    from collections import defaultdict

    from skyrl_tool_agent.config import Config
    from skyrl_tool_agent.env.chat_format import ANSWER_CLOSE, ANSWER_OPEN
    from skyrl_tool_agent.env.pools import EnvRuntime
    from skyrl_tool_agent.eval.splits import TaskSplits
    from skyrl_tool_agent.jobs.build_model import oracle_collector_settings
    from skyrl_tool_agent.jobs.speedrun_plan import hold_out_rl_pool
    from skyrl_tool_agent.warmstart.build import oracle_conversations

    config = Config()
    splits = TaskSplits.load(config)
    pool = splits.pool_and_validation()[0]
    build, rl = hold_out_rl_pool(pool, 256, seed=0)
    assert len(rl) == 256 and not {t.gold_sql for t in build} & {t.gold_sql for t in rl}  # the whole real pool
    # A small pool of queries each asked twice (the generated pool's paraphrases), and the build's
    # real oracle episodes of it: none holds an RL task's gold query.
    by_gold = defaultdict(list)
    for task in pool:
        by_gold[task.gold_sql].append(task)
    small = [t for tasks in [v for v in by_gold.values() if len(v) >= 2][:12] for t in tasks[:2]]
    build, rl = hold_out_rl_pool(small, 4, seed=0)
    runtime = EnvRuntime(config.env, splits.db_root)
    try:
        episodes = oracle_conversations(runtime, build, oracle_collector_settings(config))
    finally:
        runtime.close()
    text = "\n".join(m["content"] for messages in episodes for m in messages)

    def written(sql: str) -> bool:  # as the answer, or as an execute_sql argument (a whole JSON string)
        return f"{ANSWER_OPEN}{sql}{ANSWER_CLOSE}" in text or json.dumps(sql) in text

    assert len(episodes) == len(build) and all(written(t.gold_sql) for t in build)  # the answers are there
    assert not [t.gold_sql for t in rl if written(t.gold_sql)]


def test_the_arms_share_what_the_budget_leaves_after_the_evaluations() -> None:
    # 100 s left, evaluations of 5 s (x 1.2), 2 per arm, 4 s to set up the second arm, 6 s margin
    assert arm_seconds(100, 5, 2, 6, 4) == pytest.approx((100 - 24 - 4 - 6) / 2)


def test_a_shape_that_cannot_be_built_is_one_error_line(tmp_path: Path, capsys) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["--hidden-size", "65", "--heads", "2", "--output-dir", str(tmp_path)], from_process_start=False)
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["error: model shape: hidden size 65 is not a multiple of 2 heads"]
