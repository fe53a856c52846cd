"""Sampled training episodes a person can read: which ones a step keeps, and as what record.

TRL's `log_completions` and SkyRL's `dump_data_batch` habit: every `training.rollouts_every` steps
the trainer writes `training.rollouts_per_step` of the step's episodes to `rollouts.jsonl` (and a
W&B table when W&B is on): the whole conversation with tool calls and results, the reward and its
terms, the advantage the update used, and the final SQL beside the gold SQL.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from skyrl_tool_agent.data.tasks import Task
from skyrl_tool_agent.rollout.trajectory import Trajectory


def spread_indices(num_groups: int, group_size: int, k: int) -> list[int]:
    """`k` episode indices of a step laid out as `num_groups` groups of `group_size`: one from each
    group in turn (first members, then second members, ...), so a few records show many tasks."""
    order = [g * group_size + m for m in range(group_size) for g in range(num_groups)]
    return order[: max(0, k)]


def rollout_records(step: int, tasks: Sequence[Task], trajectories: Sequence[Trajectory],
                    advantages: Sequence[float], kept: Sequence[bool], k: int) -> list[dict[str, Any]]:
    """Records of `k` of a step's episodes (`trajectories` in group order, `group_size` per task)."""
    if not tasks or not trajectories:
        return []
    group_size = len(trajectories) // len(tasks)
    records = []
    for i in spread_indices(len(tasks), group_size, k):
        task, tr = tasks[i // group_size], trajectories[i]
        records.append({
            "step": step,
            "task_id": task.task_id,
            "db_id": task.db_id,
            "difficulty": task.difficulty,
            "question": task.question,
            "gold_sql": task.gold_sql,
            "final_sql": tr.result.final_sql,
            "solved": tr.result.solved,
            "reward": tr.result.reward,
            "reward_terms": dict(tr.result.components),
            "advantage": float(advantages[i]),
            "used_in_update": bool(kept[i]),
            "group_member": tr.group_index,
            "turns": tr.result.turns,
            "tool_calls": tr.result.tool_calls,
            "done_reason": tr.result.done_reason,
            "messages": tr.messages,
        })
    return records


__all__ = ["rollout_records", "spread_indices"]
