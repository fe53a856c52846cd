"""Curriculum schedule, empty-bucket renormalisation and adaptive per-task down-weighting."""

from __future__ import annotations

import json
import logging
import math
import random
from collections import Counter

import pytest

from skyrl_tool_agent.data.batching import TaskBatcher
from skyrl_tool_agent.data.curriculum import CurriculumSampler
from skyrl_tool_agent.data.loader import TaskDataLoader
from skyrl_tool_agent.data.tasks import Task

N_DRAWS = 20_000


def make_tasks(counts: dict[str, int], prefix: str = "t") -> list[Task]:
    tasks = []
    for difficulty, n in counts.items():
        for i in range(n):
            tasks.append(
                Task(
                    task_id=f"{prefix}-{difficulty}-{i:05d}",
                    db_id="shop",
                    question=f"question {i}",
                    gold_sql="SELECT 1",
                    difficulty=difficulty,
                )
            )
    return tasks


def assert_mix_close(counts: Counter, n: int, expected: dict[str, float]) -> None:
    """Each observed share within 4 binomial standard deviations of the expected probability."""
    for difficulty, p in expected.items():
        observed = counts[difficulty] / n
        sigma = math.sqrt(p * (1 - p) / n)
        assert abs(observed - p) <= 4 * sigma + 1e-12, (difficulty, observed, p, sigma)


def test_linear_schedule_values() -> None:
    sampler = CurriculumSampler("linear")
    assert sampler.mix_at(0.0) == pytest.approx({"easy": 0.3, "medium": 0.5, "hard": 0.2})
    assert sampler.mix_at(0.5) == pytest.approx({"easy": 0.2, "medium": 0.45, "hard": 0.35})
    assert sampler.mix_at(1.0) == pytest.approx({"easy": 0.1, "medium": 0.4, "hard": 0.5})
    assert sampler.mix_at(7.0) == sampler.mix_at(1.0)  # clamped past the end of training


@pytest.mark.parametrize("progress", [0.0, 0.5, 1.0])
def test_sampled_mix_matches_schedule(progress: float) -> None:
    sampler = CurriculumSampler("linear")
    rng = random.Random(1234)
    counts = Counter(sampler.sample_difficulty(rng, progress) for _ in range(N_DRAWS))
    assert_mix_close(counts, N_DRAWS, sampler.mix_at(progress))


@pytest.mark.parametrize("where", ["start", "end"])
def test_loader_batches_follow_schedule(where: str) -> None:
    """Through the loader (streams + batcher): start of a very long run, and past the end of a short one."""
    tasks = make_tasks({"easy": 300, "medium": 300, "hard": 300})
    total_steps = 10**9 if where == "start" else 1
    loader = TaskDataLoader(
        tasks, CurriculumSampler("linear"), TaskBatcher(target_turns=10**6, max_batch=100),
        seed=5, total_steps=total_steps,
    )
    if where == "end":
        loader.next_batch()  # step 1 of 1: progress is 1 from here on
    drawn: Counter = Counter()
    while sum(drawn.values()) < N_DRAWS:
        drawn.update(t.difficulty for t in loader.next_batch())
    n = sum(drawn.values())
    assert_mix_close(drawn, n, loader.sampler.mix_at(0.0 if where == "start" else 1.0))


def test_uniform_mode_proportional_to_availability() -> None:
    tasks = make_tasks({"easy": 100, "medium": 300, "hard": 600})
    sampler = CurriculumSampler("uniform")
    loader = TaskDataLoader(tasks, sampler, TaskBatcher(target_turns=10**6, max_batch=100), seed=1)
    assert sampler.mix_at(0.0) == pytest.approx({"easy": 0.1, "medium": 0.3, "hard": 0.6})
    assert sampler.mix_at(0.0) == sampler.mix_at(1.0)
    drawn: Counter = Counter()
    while sum(drawn.values()) < N_DRAWS:
        drawn.update(t.difficulty for t in loader.next_batch())
    assert_mix_close(drawn, sum(drawn.values()), {"easy": 0.1, "medium": 0.3, "hard": 0.6})

    fixed = CurriculumSampler("uniform", fixed_mix={"easy": 1, "medium": 1, "hard": 2})
    assert fixed.mix_at(0.3) == pytest.approx({"easy": 0.25, "medium": 0.25, "hard": 0.5})


def test_empty_bucket_renormalised_and_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    sampler = CurriculumSampler("linear")
    with caplog.at_level(logging.WARNING, logger="skyrl_tool_agent.data.curriculum"):
        mix = sampler.mix_at(1.0, available=["easy", "medium"])
        sampler.mix_at(0.5, available=["easy", "medium"])
    assert mix == pytest.approx({"easy": 0.2, "medium": 0.8, "hard": 0.0})
    assert len([r for r in caplog.records if "renormalising" in r.message]) == 1


def test_loader_without_hard_tasks() -> None:
    """A source with no hard tasks: the mix is renormalised over the other buckets."""
    tasks = make_tasks({"easy": 50, "medium": 50})
    loader = TaskDataLoader(tasks, CurriculumSampler("linear"), TaskBatcher(target_turns=10**6, max_batch=50),
                            seed=3, total_steps=10**9)
    drawn: Counter = Counter()
    for _ in range(100):
        drawn.update(t.difficulty for t in loader.next_batch())
    assert drawn["hard"] == 0
    assert_mix_close(drawn, sum(drawn.values()), {"easy": 0.3 / 0.8, "medium": 0.5 / 0.8})
    assert loader.state_dict()["empty_buckets"] == ["hard"]


def test_pass_rate_counts_and_ema() -> None:
    counts = CurriculumSampler("adaptive", min_attempts=4)
    counts.update("a", 4, 4)
    counts.update("a", 0, 4)
    assert counts.state_dict()["stats"]["a"] == pytest.approx([4.0, 8.0, 0.5])  # successes, attempts, pass rate
    ema = CurriculumSampler("adaptive", ema_alpha=0.5)
    ema.update("a", 4, 4)
    ema.update("a", 0, 4)
    ema.update("a", 0, 4)
    assert ema.state_dict()["stats"]["a"][2] == pytest.approx(0.25)  # the pass rate: an EMA
    with pytest.raises(ValueError):
        counts.update("a", 5, 4)


def test_weights_need_min_attempts_and_only_apply_in_adaptive_mode() -> None:
    sampler = CurriculumSampler("adaptive", min_attempts=4, min_weight=0.1)
    sampler.update("solved", 2, 2)
    assert sampler.weight("solved") == 1.0  # 2 attempts < 4: not enough evidence yet
    sampler.update("solved", 2, 2)
    sampler.update("never", 0, 4)
    sampler.update("mid", 2, 4)
    assert sampler.weight("solved") == 0.1
    assert sampler.weight("never") == 0.1
    assert sampler.weight("mid") == 1.0
    assert sampler.weight("unseen") == 1.0
    linear = CurriculumSampler("linear")
    linear.update("solved", 8, 8)
    assert linear.weight("solved") == 1.0
    # the table survives a JSON round trip
    restored = CurriculumSampler("adaptive", min_attempts=4, min_weight=0.1)
    restored.load_state_dict(json.loads(json.dumps(sampler.state_dict())))
    assert [restored.weight(t) for t in ("solved", "never", "mid")] == [0.1, 0.1, 1.0]


def test_adaptive_downweights_saturated_tasks_in_training_loop() -> None:
    """Simulated trainer: a third of the tasks are always solved, a third never, a third half the time.
    After feedback the saturated ones are drawn far less often than the informative ones."""
    per_kind = 20
    tasks = [
        Task(task_id=f"{kind}-{i:02d}", db_id="shop", question="q", gold_sql="SELECT 1", difficulty="medium")
        for kind in ("always", "never", "mid")
        for i in range(per_kind)
    ]
    solve_prob = {"always": 1.0, "never": 0.0, "mid": 0.5}
    group = 4
    loader = TaskDataLoader(
        tasks, CurriculumSampler("adaptive", min_attempts=4, min_weight=0.1),
        TaskBatcher(target_turns=64, max_batch=16), seed=11, total_steps=1000, group_size=group,
    )
    policy_rng = random.Random(99)
    drawn: Counter = Counter()
    for step in range(600):
        batch = loader.next_batch()
        results = {}
        for task in batch:
            kind = task.task_id.split("-")[0]
            successes = sum(policy_rng.random() < solve_prob[kind] for _ in range(group))
            results[task.task_id] = (successes, group)
            if step >= 100:  # after warm-up: every task has been seen several times
                drawn[kind] += 1
        loader.record_results(results)
    # expected ratio is min_weight = 0.1 (mid tasks occasionally look saturated early, hence slack)
    assert drawn["always"] < 0.2 * drawn["mid"], drawn
    assert drawn["never"] < 0.2 * drawn["mid"], drawn
    assert drawn["always"] > 0 and drawn["never"] > 0  # down-weighted, not excluded
