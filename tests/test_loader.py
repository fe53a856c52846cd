"""Seeded task streams, batching, fixed subsets, and exact resume of the TaskDataLoader."""

from __future__ import annotations

import json
import random
import zlib
from collections import Counter

import pytest

from skyrl_tool_agent.data.batching import TaskBatcher, fixed_subset
from skyrl_tool_agent.data.curriculum import CurriculumSampler
from skyrl_tool_agent.data.loader import StreamingDataset, TaskDataLoader
from skyrl_tool_agent.data.tasks import Task

DIFFS = ("easy", "medium", "hard")


def make_task(i: int, difficulty: str, prefix: str = "t") -> Task:
    return Task(task_id=f"{prefix}-{i:06d}", db_id="shop", question=f"q{i}", gold_sql="SELECT 1", difficulty=difficulty)


def make_tasks(n: int, prefix: str = "t") -> list[Task]:
    return [make_task(i, DIFFS[i % 3], prefix) for i in range(n)]


def fake_results(batch: list[Task], step: int, group: int) -> dict[str, tuple[int, int]]:
    """Deterministic per-task outcomes: some tasks always solved, some never, others vary."""
    out = {}
    for task in batch:
        h = zlib.crc32(task.task_id.encode())
        if h % 3 == 0:
            out[task.task_id] = (group, group)
        elif h % 3 == 1:
            out[task.task_id] = (0, group)
        else:
            out[task.task_id] = (zlib.crc32(f"{task.task_id}/{step}".encode()) % (group + 1), group)
    return out


def run(loader: TaskDataLoader, n_batches: int, group: int, feedback: bool) -> list[list[str]]:
    ids = []
    for _ in range(n_batches):
        step = loader.step
        batch = loader.next_batch()
        ids.append([t.task_id for t in batch])
        if feedback:
            loader.record_results(fake_results(batch, step, group))
    return ids


# ---------------------------------------------------------------------------------------- streaming
def test_dataset_state_resumes_across_epochs() -> None:
    tasks = make_tasks(50)
    ref = StreamingDataset(tasks, seed=3)
    epoch0 = [ref.next_task().task_id for _ in range(50)]
    assert sorted(epoch0) == [t.task_id for t in tasks] and epoch0 != sorted(epoch0)  # a shuffled permutation
    epoch1 = [ref.next_task().task_id for _ in range(20)]  # into the second epoch
    assert ref.epoch == 1 and epoch1 != epoch0[:20]  # re-shuffled per epoch
    assert [t.task_id for t in StreamingDataset(tasks, seed=4).iter_epoch(0)] != epoch0
    state = json.loads(json.dumps(ref.state_dict()))
    expected = [ref.next_task().task_id for _ in range(100)]  # crosses into the third epoch
    resumed = StreamingDataset(tasks, seed=3)
    resumed.load_state_dict(state)
    assert [resumed.next_task().task_id for _ in range(100)] == expected
    with pytest.raises(ValueError, match="seed"):
        StreamingDataset(tasks, seed=4).load_state_dict(state)


# ---------------------------------------------------------------------------------------- batching
def check_batches(batches: list[list[Task]], batcher: TaskBatcher, group: int) -> None:
    """Budget and size respected, and each batch closed only because the next task did not fit."""
    for i, batch in enumerate(batches):
        cost = sum(batcher.task_cost(t, group) for t in batch)
        assert 1 <= len(batch) <= batcher.max_batch
        assert cost <= batcher.target_turns or len(batch) == 1
        if i + 1 < len(batches):
            nxt = batcher.task_cost(batches[i + 1][0], group)
            assert len(batch) == batcher.max_batch or cost + nxt > batcher.target_turns


def test_batcher_costs() -> None:
    batcher = TaskBatcher(target_turns=64, max_batch=16)
    assert [batcher.task_cost(make_task(0, d), 4) for d in DIFFS] == [12.0, 16.0, 20.0]
    assert batcher.can_add(0, 0.0, 1000.0)  # a task costing more than the whole budget still goes alone
    assert not batcher.can_add(1, 60.0, 5.0) and not batcher.can_add(16, 0.0, 0.0)


def test_loader_batches_respect_budget() -> None:
    batcher = TaskBatcher(target_turns=64, max_batch=16)
    loader = TaskDataLoader(make_tasks(300), CurriculumSampler("linear"), batcher, seed=0, total_steps=50, group_size=4)
    batches = [loader.next_batch() for _ in range(50)]
    assert len(batches) == 50 and loader.step == 50
    check_batches(batches, batcher, 4)
    assert loader.position == sum(len(b) for b in batches)


def test_fixed_subset_deterministic_and_stratified() -> None:
    tasks = [make_task(i, d) for i, d in enumerate(["easy"] * 600 + ["medium"] * 300 + ["hard"] * 100)]
    subset = fixed_subset(tasks, 50, seed=0)
    assert Counter(t.difficulty for t in subset) == {"easy": 30, "medium": 15, "hard": 5}
    shuffled = tasks[:]
    random.Random(1).shuffle(shuffled)
    assert fixed_subset(shuffled, 50, seed=0) == subset  # independent of input order
    assert fixed_subset(tasks, 50, seed=1) != subset
    assert len(fixed_subset(tasks, 5_000, seed=0)) == 1_000
    rare = [make_task(i, d) for i, d in enumerate(["easy"] * 990 + ["medium"] * 9 + ["hard"] * 1)]
    assert Counter(t.difficulty for t in fixed_subset(rare, 10, seed=0)) == {"easy": 8, "medium": 1, "hard": 1}


# ---------------------------------------------------------------------------------------- exact resume
@pytest.mark.parametrize("mode", ["adaptive", "linear", "uniform"])
def test_loader_exact_resume(mode: str) -> None:
    """k batches, state through JSON, a fresh loader continues exactly like the uninterrupted one."""
    tasks = make_tasks(90)  # small pools: the continuation crosses epoch boundaries
    group, k, after = 4, 7, 25

    def build(seed: int = 42) -> TaskDataLoader:
        return TaskDataLoader(
            tasks, CurriculumSampler(mode, min_attempts=4), TaskBatcher(target_turns=64, max_batch=16),
            seed=seed, total_steps=40, group_size=group,
        )

    feedback = mode == "adaptive"
    ref = build()
    run(ref, k, group, feedback)
    state = json.loads(json.dumps(ref.state_dict()))
    expected = run(ref, after, group, feedback)

    resumed = build()
    resumed.load_state_dict(state)
    assert run(resumed, after, group, feedback) == expected
    assert resumed.state_dict() == ref.state_dict()

    # the comparison has teeth: a loader that is not restored, or differently seeded, diverges
    assert run(build(), after, group, feedback) != expected
    with pytest.raises(ValueError, match="seed"):
        build(seed=43).load_state_dict(state)


def test_resume_with_pending_task_and_empty_bucket() -> None:
    """Save right when a drawn task was carried over to the next batch, from tasks lacking 'hard'."""
    tasks = [make_task(i, ("easy", "medium")[i % 2]) for i in range(40)]

    def build() -> TaskDataLoader:
        return TaskDataLoader(tasks, CurriculumSampler("linear"), TaskBatcher(target_turns=10, max_batch=16),
                              seed=9, total_steps=20, group_size=1)

    ref = build()
    state = None
    for _ in range(20):
        ref.next_batch()
        snapshot = ref.state_dict()
        if snapshot["pending"] is not None and snapshot["empty_buckets"] == ["hard"]:
            state = json.loads(json.dumps(snapshot))
            break
    assert state is not None
    expected = run(ref, 10, 1, False)
    resumed = build()
    resumed.load_state_dict(state)
    assert run(resumed, 10, 1, False) == expected


def test_extra_draws_keep_the_step_use_its_mix_and_resume_exactly() -> None:
    """`draw_extra` (grpo.refill_rounds): tasks at the mix of the batch just returned, the step count
    unchanged, and a loader restored after extra draws continues exactly."""
    tasks = make_tasks(90)

    def build() -> TaskDataLoader:
        return TaskDataLoader(tasks, CurriculumSampler("linear", start_mix={"easy": 1.0, "medium": 0.0, "hard": 0.0},
                                                       end_mix={"easy": 0.0, "medium": 0.0, "hard": 1.0}),
                              TaskBatcher(target_turns=float("inf"), max_batch=4), seed=3, total_steps=2)

    ref = build()
    ref.next_batch()  # step 0's batch: progress 0, all easy
    extra = ref.draw_extra(5)
    assert ref.step == 1 and ref.position == 9
    assert {t.difficulty for t in extra} == {"easy"}  # step 0's mix, not step 1's (half hard)
    state = json.loads(json.dumps(ref.state_dict()))
    expected = [[t.task_id for t in ref.next_batch()], [t.task_id for t in ref.draw_extra(3)]]
    resumed = build()
    resumed.load_state_dict(state)
    assert [[t.task_id for t in resumed.next_batch()], [t.task_id for t in resumed.draw_extra(3)]] == expected
