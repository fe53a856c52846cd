"""Which sampled episodes a training step saves for people to read, and what each record holds."""

from __future__ import annotations

from skyrl_tool_agent.data.tasks import Task
from skyrl_tool_agent.grpo.rollout_log import rollout_records, spread_groups
from skyrl_tool_agent.rollout.trajectory import EpisodeResult, Trajectory


def test_spread_groups_takes_groups_spread_over_the_step():
    assert spread_groups(8, 2) == [0, 4] and spread_groups(8, 3) == [0, 2, 5]
    assert spread_groups(2, 10) == [0, 1]  # never more than the step has
    assert spread_groups(2, 0) == []


def test_records_pair_each_episode_with_its_task_and_advantage():
    tasks = [Task(task_id=f"t{i}", db_id="shop", question=f"q{i}?", gold_sql=f"SELECT {i}", difficulty="easy")
             for i in range(2)]
    trajectories = [
        Trajectory(task_id=f"t{i // 2}", group_index=i % 2,
                   messages=[{"role": "user", "content": f"q{i // 2}?"}, {"role": "assistant", "content": "x"}],
                   result=EpisodeResult(task_id=f"t{i // 2}", db_id="shop", reward=float(i), final_sql=f"SELECT {i}",
                                        components={"execution": 1.0, "format": 1.0}, solved=i == 3))
        for i in range(4)
    ]
    records = rollout_records(7, tasks, trajectories, [0.5, -0.5, 0.0, 0.0], [True, True, False, False], groups=1)
    assert [(r["task_id"], r["group"], r["group_member"]) for r in records] == [("t0", 0, 0), ("t0", 0, 1)]  # whole
    assert [r["advantage"] for r in records] == [0.5, -0.5] and [r["used_in_update"] for r in records] == [True, True]
    records = rollout_records(7, tasks, trajectories, [0.5, -0.5, 0.0, 0.0], [True, True, False, False], groups=2)
    assert [(r["task_id"], r["group_member"]) for r in records] == [("t0", 0), ("t0", 1), ("t1", 0), ("t1", 1)]
    third = records[2]
    assert third["step"] == 7 and third["question"] == "q1?" and third["gold_sql"] == "SELECT 1"
    assert third["final_sql"] == "SELECT 2" and third["reward"] == 2.0 and third["reward_terms"]["execution"] == 1.0
    assert third["messages"][-1] == {"role": "assistant", "content": "x"}
    assert rollout_records(1, [], [], [], [], groups=4) == []
