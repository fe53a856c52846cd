"""Curriculum: which difficulty to train on at each point of training, and which tasks to favour.

`CurriculumSampler` holds no RNG of its own (the loader owns it, so one saved RNG state covers
everything). Its modes (linear, uniform, adaptive) are `grpo.curriculum.mode`'s, described once in
`config.grpo.CurriculumConfig`, whose `adaptive_*` knobs are the sampler's `high`, `low`,
`min_attempts`, `min_weight` and `ema_alpha`. A task's pass rate is its cumulative
successes/attempts, or with `ema_alpha` an exponential moving average of the per-update rates.
Uniform without a fixed mix weighs the buckets by their sizes (`set_availability`, from the loader).

If a bucket has no tasks, the mix is renormalised over the other buckets (logged once per set of
empty buckets).
"""

from __future__ import annotations

import logging
import random
from collections.abc import Collection, Mapping
from typing import Any, Literal, get_args

from skyrl_tool_agent.data.tasks import Difficulty

logger = logging.getLogger(__name__)

DIFFICULTIES: tuple[str, ...] = get_args(Difficulty)  # ("easy", "medium", "hard"): the sampling order
CurriculumMode = Literal["linear", "uniform", "adaptive"]

DEFAULT_START_MIX: dict[str, float] = {"easy": 0.3, "medium": 0.5, "hard": 0.2}
DEFAULT_END_MIX: dict[str, float] = {"easy": 0.1, "medium": 0.4, "hard": 0.5}


def _normalised_mix(mix: Mapping[str, float]) -> dict[str, float]:
    """A difficulty -> weight mapping scaled to sum 1 (missing buckets get 0)."""
    total = float(sum(mix.values()))
    return {d: float(mix.get(d, 0.0)) / total for d in DIFFICULTIES}


class CurriculumSampler:
    """Difficulty mix over training progress, and per-task weights from fed-back pass rates. Its
    settings are `grpo.curriculum`'s, validated there (`config.grpo.CurriculumConfig`)."""

    def __init__(
        self,
        mode: CurriculumMode = "linear",
        *,
        start_mix: Mapping[str, float] | None = None,
        end_mix: Mapping[str, float] | None = None,
        fixed_mix: Mapping[str, float] | None = None,
        high: float = 0.9,
        low: float = 0.1,
        min_attempts: int = 4,
        min_weight: float = 0.1,
        ema_alpha: float | None = None,
    ) -> None:
        self.mode: CurriculumMode = mode
        self.start_mix = _normalised_mix(start_mix or DEFAULT_START_MIX)
        self.end_mix = _normalised_mix(end_mix or DEFAULT_END_MIX)
        self.fixed_mix = _normalised_mix(fixed_mix) if fixed_mix is not None else None
        self.high = high
        self.low = low
        self.min_attempts = min_attempts
        self.min_weight = min_weight
        self.ema_alpha = ema_alpha
        self._availability: dict[str, int] | None = None
        # task_id -> [successes, attempts, rate]; rate is cumulative or the EMA (see module doc).
        self._stats: dict[str, list[float]] = {}
        self._logged_empty: set[frozenset[str]] = set()

    # ------------------------------------------------------------------ difficulty mix
    def set_availability(self, counts: Mapping[str, int]) -> None:
        """Tell the sampler how many tasks each bucket holds (used by uniform mode)."""
        self._availability = {d: int(counts.get(d, 0)) for d in DIFFICULTIES}

    def base_mix(self, progress: float) -> dict[str, float]:
        """The mix before removing empty buckets; `progress` is clamped to [0, 1]."""
        if self.mode == "uniform":
            if self.fixed_mix is not None:
                return dict(self.fixed_mix)
            if self._availability and sum(self._availability.values()) > 0:
                return _normalised_mix(self._availability)
            return {d: 1.0 / len(DIFFICULTIES) for d in DIFFICULTIES}
        p = min(1.0, max(0.0, float(progress)))
        return {d: (1.0 - p) * self.start_mix[d] + p * self.end_mix[d] for d in DIFFICULTIES}

    def mix_at(self, progress: float, available: Collection[str] | None = None) -> dict[str, float]:
        """Difficulty -> probability at `progress` in [0, 1], renormalised over `available` buckets."""
        mix = self.base_mix(progress)
        if available is None:
            return mix
        avail = [d for d in DIFFICULTIES if d in available]
        if not avail:
            raise ValueError("no difficulty bucket has tasks")
        missing = frozenset(DIFFICULTIES) - frozenset(avail)
        if missing and missing not in self._logged_empty:
            self._logged_empty.add(missing)
            logger.warning("no tasks of difficulty %s: renormalising the mix over %s", sorted(missing), avail)
        total = sum(mix[d] for d in avail)
        if total <= 0:  # the schedule gives zero weight to every bucket that has tasks
            return {d: (1.0 / len(avail) if d in avail else 0.0) for d in DIFFICULTIES}
        return {d: (mix[d] / total if d in avail else 0.0) for d in DIFFICULTIES}

    def sample_difficulty(
        self, rng: random.Random, progress: float, available: Collection[str] | None = None
    ) -> str:
        """Draw a difficulty from `mix_at(progress, available)` using exactly one `rng.random()`."""
        mix = self.mix_at(progress, available)
        u = rng.random()
        cumulative = 0.0
        last = None
        for d in DIFFICULTIES:
            if mix[d] <= 0:
                continue
            cumulative += mix[d]
            last = d
            if u < cumulative:
                return d
        assert last is not None  # mix_at guarantees some positive weight
        return last  # float round-off: cumulative summed to just under 1

    # ------------------------------------------------------------------ per-task pass rates
    def update(self, task_id: str, successes: int, attempts: int) -> None:
        """Record `successes` out of `attempts` new episodes of `task_id` (all modes keep the table)."""
        if attempts <= 0:
            return
        if not 0 <= successes <= attempts:
            raise ValueError(f"{task_id}: need 0 <= successes <= attempts, got {successes}/{attempts}")
        rate = successes / attempts
        entry = self._stats.get(task_id)
        if entry is None:
            self._stats[task_id] = [float(successes), float(attempts), rate]
            return
        entry[0] += successes
        entry[1] += attempts
        if self.ema_alpha is None:
            entry[2] = entry[0] / entry[1]
        else:
            entry[2] = (1.0 - self.ema_alpha) * entry[2] + self.ema_alpha * rate

    def weight(self, task_id: str) -> float:
        """Relative sampling weight within its bucket: `min_weight` for saturated tasks, else 1."""
        if self.mode != "adaptive":
            return 1.0
        entry = self._stats.get(task_id)
        if entry is None or entry[1] < self.min_attempts:
            return 1.0
        rate = entry[2]
        return self.min_weight if (rate > self.high or rate < self.low) else 1.0

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        """JSON-serialisable pass-rate table (the schedule itself is configuration, not state)."""
        return {
            "mode": self.mode,
            "stats": {tid: list(v) for tid, v in self._stats.items()},
            "availability": dict(self._availability) if self._availability is not None else None,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore the pass-rate table (and availability) saved by `state_dict()`."""
        if state.get("mode", self.mode) != self.mode:
            raise ValueError(f"saved curriculum mode {state['mode']!r} differs from {self.mode!r}")
        self._stats = {tid: [float(x) for x in v] for tid, v in state.get("stats", {}).items()}
        availability = state.get("availability")
        self._availability = dict(availability) if availability is not None else None
