"""Confidence intervals for accuracy differences measured on the same tasks.

Two evaluations of one task set are paired: a task's outcome before and after training are not
independent, so the interval of the difference resamples tasks (both outcomes of a task travel
together), as in paired-bootstrap significance testing for NLP (Koehn 2004; Berg-Kirkpatrick et
al. 2012). Pure numpy over per-task outcomes; no model involved.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np


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

    def to_dict(self) -> dict[str, float]:
        return asdict(self)

    def describe(self) -> str:
        """'+0.047 [+0.019, +0.075] (95% paired bootstrap, n=320)'."""
        return (f"{self.delta:+.3f} [{self.low:+.3f}, {self.high:+.3f}] "
                f"({100 * self.confidence:.0f}% paired bootstrap, n={self.n})")


def paired_bootstrap(before: Sequence[float], after: Sequence[float], *, resamples: int = 10_000,
                     confidence: float = 0.95, seed: int = 0) -> PairedDelta:
    """Percentile interval of mean(after) - mean(before), resampling task indices with replacement.
    `before[i]` and `after[i]` are the same task's outcomes (e.g. 1 = solved)."""
    if len(before) != len(after):
        raise ValueError(f"paired outcomes need equal lengths, got {len(before)} and {len(after)}")
    if not before:
        raise ValueError("no outcomes to compare")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    b = np.asarray(before, dtype=np.float64)
    a = np.asarray(after, dtype=np.float64)
    diff = a - b
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(diff), size=(resamples, len(diff)))
    means = diff[idx].mean(axis=1)
    tail = (1 - confidence) / 2
    low, high = np.quantile(means, [tail, 1 - tail])
    return PairedDelta(n=len(diff), before=float(b.mean()), after=float(a.mean()), delta=float(diff.mean()),
                       low=float(low), high=float(high), confidence=confidence)
