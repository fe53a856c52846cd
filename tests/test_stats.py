"""Paired-bootstrap intervals for accuracy changes on the same tasks (pure numpy, no model)."""

from __future__ import annotations

import random

import pytest

from skyrl_tool_agent.eval.stats import paired_bootstrap


def test_no_change_gives_a_zero_interval() -> None:
    outcomes = [1, 0, 1, 1, 0] * 20
    d = paired_bootstrap(outcomes, outcomes)
    assert (d.delta, d.low, d.high) == (0.0, 0.0, 0.0)
    assert d.before == d.after == 0.6 and d.n == 100


def test_every_task_fixed_gives_plus_one() -> None:
    d = paired_bootstrap([0] * 50, [1] * 50)
    assert d.delta == d.low == d.high == 1.0


def _pairs(n: int, seed: int) -> tuple[list[int], list[int]]:
    """Before: 40% solved; after: each task keeps its outcome, 10% of the unsolved become solved."""
    rng = random.Random(seed)
    before = [int(rng.random() < 0.4) for _ in range(n)]
    after = [1 if (b == 0 and rng.random() < 0.1) else b for b in before]
    return before, after


def test_interval_holds_the_delta_and_narrows_with_more_tasks() -> None:
    small = paired_bootstrap(*_pairs(80, 1))
    large = paired_bootstrap(*_pairs(2000, 1))
    for d in (small, large):
        assert d.low <= d.delta <= d.high
    assert large.high - large.low < small.high - small.low
    assert large.low > 0  # a consistent gain over 2,000 tasks is clearly above 0


def test_pairing_matters() -> None:
    """The same two accuracies with outcomes moving together (paired) give a far narrower interval
    than an unpaired comparison would: only the tasks that changed carry variance."""
    before = [1] * 40 + [0] * 60
    after = [1] * 40 + [1] * 6 + [0] * 54  # 6 tasks fixed, none broken
    d = paired_bootstrap(before, after)
    assert d.delta == pytest.approx(0.06)
    assert d.low > 0  # never negative: no task got worse
    broken = [0] * 6 + [1] * 34 + [1] * 12 + [0] * 48  # 6 broken, 12 fixed: same net +0.06
    assert paired_bootstrap(before, broken).low < 0 < paired_bootstrap(before, broken).high


def test_deterministic_for_a_seed() -> None:
    before, after = _pairs(200, 3)
    assert paired_bootstrap(before, after, seed=5) == paired_bootstrap(before, after, seed=5)


@pytest.mark.parametrize("before, after, message", [
    ([1, 0], [1], "equal lengths"),
    ([], [], "no outcomes"),
])
def test_bad_inputs(before, after, message) -> None:
    with pytest.raises(ValueError, match=message):
        paired_bootstrap(before, after)
