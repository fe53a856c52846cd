"""Which sampled episodes a training step saves for people to read, and what each record holds."""

from __future__ import annotations

from skyrl_tool_agent.data.tasks import Task
from skyrl_tool_agent.grpo.rollout_log import rollout_records, spread_indices
from skyrl_tool_agent.rollout.trajectory import EpisodeResult, Trajectory


def test_spread_indices_take_one_episode_per_group_in_turn():
    assert spread_indices(3, 4, 5) == [0, 4, 8, 1, 5]
    assert spread_indices(2, 2, 10) == [0, 2, 1, 3]  # never more than the step has
    assert spread_indices(2, 2, 0) == []


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
    records = rollout_records(7, tasks, trajectories, [0.5, -0.5, 0.0, 0.0], [True, True, False, False], k=3)
    assert [(r["task_id"], r["group_member"]) for r in records] == [("t0", 0), ("t1", 0), ("t0", 1)]
    assert [r["advantage"] for r in records] == [0.5, 0.0, -0.5]
    assert [r["used_in_update"] for r in records] == [True, False, True]
    second = records[1]
    assert second["step"] == 7 and second["question"] == "q1?" and second["gold_sql"] == "SELECT 1"
    assert second["final_sql"] == "SELECT 2" and second["reward"] == 2.0 and second["reward_terms"]["execution"] == 1.0
    assert second["messages"][-1] == {"role": "assistant", "content": "x"}
    assert rollout_records(1, [], [], [], [], k=4) == []
