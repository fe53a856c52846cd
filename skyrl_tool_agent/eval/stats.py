"""Confidence intervals for accuracy differences measured on the same tasks.

Two evaluations of one task set are paired, so the interval resamples tasks (both outcomes of a
task travel together: Koehn 2004). An outcome of None (never scored) leaves its pair out, counted
in `unscored`, never taken as "unsolved".
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np

#: Every interval's coverage, and the bootstrap's resamples.
CONFIDENCE, RESAMPLES = 0.95, 10_000


@dataclass(frozen=True)
class PairedDelta:
    """Mean of `after - before` over tasks and its percentile bootstrap interval."""

    n: int
    before: float
    after: float
    delta: float
    low: float
    high: float
    confidence: float
    #: Pairs left out because one side was never scored (infrastructure error).
    unscored: int = 0

    def to_dict(self) -> dict[str, float]:
        return asdict(self)


class NothingScored(ValueError):
    """No task was scored on both sides: there is no difference to estimate."""


def paired_bootstrap(before: Sequence[float | None], after: Sequence[float | None], *, seed: int = 0) -> PairedDelta:
    """Percentile interval of mean(after) - mean(before), resampling task indices with replacement.
    `before[i]` and `after[i]` are the same task's outcomes (e.g. 1 = solved; None = never scored:
    the pair is left out). Raises `NothingScored` when no pair is scored on both sides."""
    if len(before) != len(after):
        raise ValueError(f"paired outcomes need equal lengths, got {len(before)} and {len(after)}")
    if not before:
        raise ValueError("no outcomes to compare")
    pairs = [(x, y) for x, y in zip(before, after) if x is not None and y is not None]
    if not pairs:
        raise NothingScored(f"none of the {len(before)} tasks was scored on both sides")
    b = np.asarray([x for x, _ in pairs], dtype=np.float64)
    a = np.asarray([y for _, y in pairs], dtype=np.float64)
    diff = a - b
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(diff), size=(RESAMPLES, len(diff)))
    means = diff[idx].mean(axis=1)
    tail = (1 - CONFIDENCE) / 2
    low, high = np.quantile(means, [tail, 1 - tail])
    return PairedDelta(n=len(diff), before=float(b.mean()), after=float(a.mean()), delta=float(diff.mean()),
                       low=float(low), high=float(high), confidence=CONFIDENCE, unscored=len(before) - len(pairs))


def paired_delta(before: list[float | None] | None, after: list[float | None] | None) -> dict[str, float] | None:
    """The paired-bootstrap interval of mean(after) - mean(before) over the tasks scored on both
    sides (`eval.stats`), or None when either side has no per-task outcomes or nothing was scored."""
    if not before or not after or len(before) != len(after):
        return None
    try:  # tasks unscored on either side (infrastructure errors) are left out of the interval
        return paired_bootstrap(before, after).to_dict()
    except NothingScored:
        return None
