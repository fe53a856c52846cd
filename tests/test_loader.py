"""Streaming datasets, batching, fixed subsets, and exact resume of the TaskDataLoader."""

from __future__ import annotations

import json
import random
import zlib
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from skyrl_tool_agent.data.batching import TaskBatcher, fixed_subset
from skyrl_tool_agent.data.curriculum import CurriculumSampler
from skyrl_tool_agent.data.loader import TaskDataLoader
from skyrl_tool_agent.data.streaming import StreamingDataset, read_jsonl_tasks
from skyrl_tool_agent.data.tasks import Task, save_tasks

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
def test_streaming_100k_is_lazy_bounded_and_seeded() -> None:
    n, buffer_size = 100_000, 1_000
    produced = 0

    def source() -> Iterator[Task]:
        nonlocal produced
        for i in range(n):
            produced += 1
            yield make_task(i, DIFFS[i % 3])

    ds = StreamingDataset(source, seed=7, buffer_size=buffer_size)
    first = [ds.next_task().task_id for _ in range(5_000)]
    assert produced <= 5_000 + buffer_size  # read lazily, never materialised
    assert first != sorted(first)  # actually shuffled
    rest = [ds.next_task().task_id for _ in range(n - 5_000)]
    epoch0 = first + rest
    assert len(set(epoch0)) == n  # one epoch is a permutation of the source
    assert ds.peak_buffered <= buffer_size
    assert ds.epoch == 0 and ds.position == n
    epoch1_head = [ds.next_task().task_id for _ in range(200)]
    assert ds.epoch == 1
    assert epoch1_head != epoch0[:200]  # re-shuffled per epoch

    same = StreamingDataset(source, seed=7, buffer_size=buffer_size)
    other = StreamingDataset(source, seed=8, buffer_size=buffer_size)
    assert [same.next_task().task_id for _ in range(2_000)] == first[:2_000]
    assert [other.next_task().task_id for _ in range(2_000)] != first[:2_000]


@pytest.mark.parametrize("in_memory", [True, False])
def test_dataset_state_resumes_across_epochs(in_memory: bool) -> None:
    tasks = make_tasks(50)
    source = tasks if in_memory else (lambda: iter(tasks))
    ref = StreamingDataset(source, seed=3, buffer_size=8)
    for _ in range(70):  # into the second epoch
        ref.next_task()
    state = json.loads(json.dumps(ref.state_dict()))
    expected = [ref.next_task().task_id for _ in range(100)]  # crosses into the third epoch
    resumed = StreamingDataset(source, seed=3, buffer_size=8)
    resumed.load_state_dict(state)
    assert [resumed.next_task().task_id for _ in range(100)] == expected
    with pytest.raises(ValueError, match="seed"):
        StreamingDataset(source, seed=4, buffer_size=8).load_state_dict(state)


def test_jsonl_and_json_sources(tmp_path: Path) -> None:
    tasks = make_tasks(30)
    jsonl = tmp_path / "tasks.jsonl"
    jsonl.write_text("\n".join(t.model_dump_json() for t in tasks) + "\n\n", encoding="utf-8")
    assert list(read_jsonl_tasks(jsonl)) == tasks
    json_path = tmp_path / "tasks.json"
    save_tasks(tasks, json_path)
    from_jsonl = StreamingDataset(jsonl, seed=1, buffer_size=4)
    from_json = StreamingDataset(json_path, seed=1)
    assert not from_jsonl.in_memory and from_json.in_memory and len(from_json) == 30
    assert sorted(from_jsonl.next_task().task_id for _ in range(30)) == sorted(t.task_id for t in tasks)
    assert sorted(from_json.next_task().task_id for _ in range(30)) == sorted(t.task_id for t in tasks)

    bad = tmp_path / "bad.jsonl"
    bad.write_text(tasks[0].model_dump_json() + "\n{not json\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"bad\.jsonl:2"):
        list(read_jsonl_tasks(bad))
    with pytest.raises(TypeError, match="callable"):
        StreamingDataset(iter(tasks))  # a one-shot iterator cannot be re-read each epoch


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


def test_batcher_packing() -> None:
    rng = random.Random(0)
    tasks = [make_task(i, rng.choice(DIFFS)) for i in range(500)]
    batcher = TaskBatcher(target_turns=64, max_batch=16)
    assert [batcher.task_cost(make_task(0, d), 4) for d in DIFFS] == [12.0, 16.0, 20.0]
    for group in (1, 4):
        batches = list(batcher.pack(tasks, group_size=group))
        assert [t for b in batches for t in b] == tasks
        check_batches(batches, batcher, group)
    assert max(len(b) for b in batcher.pack(tasks, 1)) == 16  # group 1: max_batch binds
    assert max(len(b) for b in batcher.pack(tasks, 4)) <= 5  # group 4: the turn budget binds

    # a per-task estimate; a task costing more than the whole budget still goes alone
    custom = TaskBatcher(target_turns=10, max_batch=16, expected_turns=lambda t: 50.0 if t.task_id.endswith("3") else 2.0)
    small = list(custom.pack(tasks[:20], group_size=1))
    assert [len(b) for b in small if any(t.task_id.endswith("3") for t in b)] == [1, 1]
    check_batches(small, custom, 1)


def test_loader_batches_respect_budget() -> None:
    batcher = TaskBatcher(target_turns=64, max_batch=16)
    loader = TaskDataLoader(make_tasks(300), CurriculumSampler("linear"), batcher, seed=0, total_steps=50, group_size=4)
    batches = list(loader)
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
@pytest.mark.parametrize(
    ("mode", "streamed"), [("adaptive", False), ("adaptive", True), ("linear", True), ("uniform", False)]
)
def test_loader_exact_resume(mode: str, streamed: bool) -> None:
    """k batches, state through JSON, a fresh loader continues exactly like the uninterrupted one."""
    tasks = make_tasks(90)  # small pools: the continuation crosses epoch boundaries
    group, k, after = 4, 7, 25

    def build(seed: int = 42) -> TaskDataLoader:
        source = (lambda: iter(tasks)) if streamed else tasks
        return TaskDataLoader(
            source, CurriculumSampler(mode, min_attempts=4), TaskBatcher(target_turns=64, max_batch=16),
            seed=seed, total_steps=40, group_size=group, buffer_size=8,
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


def test_resume_with_pending_task_and_discovered_empty_bucket() -> None:
    """Save right when a drawn task was carried over to the next batch, from a stream lacking 'hard'."""
    tasks = [make_task(i, ("easy", "medium")[i % 2]) for i in range(40)]

    def build() -> TaskDataLoader:
        return TaskDataLoader(lambda: iter(tasks), CurriculumSampler("linear"), TaskBatcher(target_turns=10, max_batch=16),
                              seed=9, total_steps=20, group_size=1, buffer_size=4)

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
