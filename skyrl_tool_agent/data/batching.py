"""Packing tasks into training batches by an expected-turn budget, and a fixed stratified dev subset."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

from skyrl_tool_agent.data.curriculum import DIFFICULTIES
from skyrl_tool_agent.data.tasks import Task

#: Rough environment turns one episode of a task takes, by difficulty (tool calls + final answer).
DEFAULT_TURNS_PER_DIFFICULTY: dict[str, float] = {"easy": 3.0, "medium": 4.0, "hard": 5.0}


class TaskBatcher:
    """Greedy packer: a batch grows until the next task would push it past `target_turns` or it holds
    `max_batch` tasks. A batch always holds at least one task, even one that alone exceeds the budget.

    A task's cost is its expected turns per episode (`DEFAULT_TURNS_PER_DIFFICULTY`) times
    `group_size`, the episodes rolled out per task. Budgeting turns rather than tasks keeps rollout
    work per step roughly constant while the curriculum shifts toward longer, harder tasks.
    """

    def __init__(self, target_turns: float = 64, max_batch: int = 16) -> None:
        self.target_turns = float(target_turns)
        self.max_batch = max_batch

    def task_cost(self, task: Task, group_size: int = 1) -> float:
        """Expected environment turns for all `group_size` episodes of `task`."""
        return DEFAULT_TURNS_PER_DIFFICULTY[task.difficulty] * group_size

    def can_add(self, batch_len: int, batch_cost: float, task_cost: float) -> bool:
        """Whether a task of `task_cost` joins a batch of `batch_len` tasks costing `batch_cost`."""
        if batch_len == 0:
            return True
        return batch_len < self.max_batch and batch_cost + task_cost <= self.target_turns


def fixed_subset(tasks: Iterable[Task], n: int, seed: int = 0) -> list[Task]:
    """A deterministic `n`-task subset stratified by difficulty (e.g. a fixed dev set for eval curves).

    Each bucket gets a share proportional to its size (largest-remainder rounding), and every
    non-empty bucket at least one task when `n` allows. Within a bucket, tasks are chosen by a hash
    of (seed, task_id), so the result depends only on the set of tasks and the seed, not their
    order. Returned sorted by task_id. `n` >= the number of tasks returns them all.
    """
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    buckets: dict[str, list[Task]] = {d: [] for d in DIFFICULTIES}
    for task in tasks:
        buckets[task.difficulty].append(task)
    total = sum(len(b) for b in buckets.values())
    if n >= total:
        return sorted((t for b in buckets.values() for t in b), key=lambda t: t.task_id)
    if n == 0:
        return []
    quotas = {d: n * len(b) / total for d, b in buckets.items()}
    alloc = {d: int(q) for d, q in quotas.items()}
    by_remainder = sorted(DIFFICULTIES, key=lambda d: (-(quotas[d] - alloc[d]), DIFFICULTIES.index(d)))
    for d in by_remainder[: n - sum(alloc.values())]:
        alloc[d] += 1
    # Rare buckets (e.g. few hard tasks) would otherwise round to zero: take one from the largest.
    nonempty = [d for d in DIFFICULTIES if buckets[d]]
    if n >= len(nonempty):
        for d in nonempty:
            if alloc[d] == 0:
                donor = max(DIFFICULTIES, key=lambda x: alloc[x])
                alloc[donor] -= 1
                alloc[d] = 1
    chosen: list[Task] = []
    for d, bucket in buckets.items():
        ranked = sorted(bucket, key=lambda t: hashlib.sha256(f"{seed}:{t.task_id}".encode()).hexdigest())
        chosen.extend(ranked[: alloc[d]])
    return sorted(chosen, key=lambda t: t.task_id)
