"""Sampled training episodes a person can read: which ones a step keeps, and as what record.

Every `training.rollouts_every` steps the trainer writes whole GRPO groups (the contrast the
advantages come from) to `rollouts.jsonl` and W&B: conversation, reward terms, advantage, final
beside gold SQL (TRL's `log_completions`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from skyrl_tool_agent.data.tasks import Task
from skyrl_tool_agent.rollout.trajectory import Trajectory


def spread_groups(num_groups: int, groups: int) -> list[int]:
    """`groups` of a step's `num_groups` group indices, evenly spread (the first always among them)."""
    groups = max(0, min(groups, num_groups))
    return sorted({i * num_groups // groups for i in range(groups)}) if groups else []


def rollout_records(step: int, tasks: Sequence[Task], trajectories: Sequence[Trajectory],
                    advantages: Sequence[float], kept: Sequence[bool], groups: int) -> list[dict[str, Any]]:
    """Records of every episode of `groups` of a step's groups (`trajectories` in group order,
    `group_size` per task); `group` is the group's index in the step, `group_member` the episode's."""
    if not tasks or not trajectories:
        return []
    group_size = len(trajectories) // len(tasks)
    records = []
    for i in (g * group_size + m for g in spread_groups(len(tasks), groups) for m in range(group_size)):
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
            "group": i // group_size,
            "group_member": tr.group_index,
            "turns": tr.result.turns,
            "tool_calls": tr.result.tool_calls,
            "done_reason": tr.result.done_reason,
            "messages": tr.messages,
        })
    return records


__all__ = ["rollout_records", "spread_groups"]
