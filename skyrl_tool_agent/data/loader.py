"""`TaskDataLoader`: curriculum-sampled, turn-budgeted task batches with exactly resumable state.

Per step the loader computes progress = step / total_steps, and for each task draws a difficulty
from the sampler's mix at that progress, then the next task of that difficulty's stream. Each
difficulty has its own `StreamingDataset` (the tasks of that bucket), so a rare bucket never forces
the others to be read ahead or dropped. In adaptive mode a drawn task is kept with probability
equal to its weight (rejection sampling), so within a bucket tasks are drawn in proportion to
their weights while the schedule's bucket mix stays exact.

Everything random comes from the loader's one `random.Random` and the streams' (seed, name,
epoch)-derived shuffles, so `state_dict()` (JSON-serialisable) restored into a fresh loader built
with the same arguments yields exactly the batches the uninterrupted loader would have.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from skyrl_tool_agent.config import Config
from skyrl_tool_agent.data.batching import TaskBatcher
from skyrl_tool_agent.data.curriculum import DIFFICULTIES, CurriculumSampler
from skyrl_tool_agent.data.tasks import Task

logger = logging.getLogger(__name__)

STATE_VERSION = 1


def rng_state_to_json(state: tuple[Any, ...]) -> list[Any]:
    """`random.Random.getstate()` as JSON-friendly lists."""
    version, internal, gauss_next = state
    return [version, list(internal), gauss_next]


def rng_state_from_json(state: list[Any]) -> tuple[Any, ...]:
    """Inverse of `rng_state_to_json`, ready for `random.Random.setstate()`."""
    version, internal, gauss_next = state
    return (version, tuple(internal), gauss_next)


def derived_rng(seed: int, *parts: object) -> random.Random:
    """A `random.Random` seeded from `seed` and `parts` (e.g. a name and an epoch).

    String seeds are hashed with SHA-512 by `random` (independent of PYTHONHASHSEED), so the result
    is reproducible across processes, and (seed=0, epoch=1) does not collide with (seed=1, epoch=0)
    as plain `seed + epoch` would.
    """
    return random.Random("/".join(str(p) for p in (seed, *parts)))


class StreamingDataset:
    """An endless, seeded stream of tasks over repeated epochs, with saveable (epoch, position).

    `next_task()` returns the next task, moving on to a freshly shuffled epoch when one is
    exhausted. `state_dict()` / `load_state_dict()` save and restore the place in the stream exactly.
    """

    def __init__(self, tasks: Sequence[Task], *, seed: int = 0, name: str = "") -> None:
        self.tasks = tasks
        self.seed = seed
        self.name = name
        self.epoch = 0
        self.position = 0  # tasks already returned from the current epoch
        self._iter: Iterator[Task] | None = None

    def filter(self, predicate: Callable[[Task], bool], name: str) -> StreamingDataset:
        """A new dataset over the tasks matching `predicate`, same seed, given `name`: the name
        enters the shuffle seed, so sibling filtered datasets shuffle independently."""
        full_name = f"{self.name}/{name}" if self.name else name
        return StreamingDataset([t for t in self.tasks if predicate(t)], seed=self.seed, name=full_name)

    def iter_epoch(self, epoch: int, start: int = 0) -> Iterator[Task]:
        """The tasks of `epoch` in their deterministic shuffled order, skipping the first `start`."""
        order = list(range(len(self.tasks)))
        derived_rng(self.seed, self.name, epoch).shuffle(order)
        return (self.tasks[i] for i in order[start:])

    def next_task(self) -> Task:
        """The next task, starting a new (re-shuffled) epoch when the current one is exhausted."""
        if not self.tasks:
            raise ValueError(f"dataset {self.name or '<unnamed>'!r} has no tasks")
        if self.position >= len(self.tasks):
            logger.debug("dataset %r: epoch %d done after %d tasks", self.name, self.epoch, self.position)
            self.epoch += 1
            self.position = 0
            self._iter = None
        if self._iter is None:
            self._iter = self.iter_epoch(self.epoch, start=self.position)
        self.position += 1
        return next(self._iter)

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        """JSON-serialisable place in the stream, plus the settings that determine the order."""
        return {"epoch": self.epoch, "position": self.position, "seed": self.seed, "name": self.name}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume at a saved place. Raises ValueError if the saved ordering settings differ."""
        for key in ("seed", "name"):
            if key in state and state[key] != getattr(self, key):
                raise ValueError(
                    f"dataset {self.name!r}: saved {key}={state[key]!r} differs from this dataset's "
                    f"{getattr(self, key)!r}; the order would not be reproduced"
                )
        self.epoch = int(state["epoch"])
        self.position = int(state["position"])
        self._iter = None  # re-created (and fast-forwarded) lazily by next_task()


class TaskDataLoader:
    """Yields batches of tasks by curriculum mix and turn budget; saveable and exactly resumable.

    Args:
        tasks: the tasks to draw from.
        sampler: the curriculum (mix schedule and, in adaptive mode, per-task weights).
        batcher: packs drawn tasks into batches by expected turns.
        seed: seeds the loader's RNG and the shuffles.
        total_steps: training steps (batches) over which progress goes 0 -> 1; later steps stay at 1.
        group_size: episodes per task (GRPO group), multiplies each task's expected turns.
    """

    def __init__(
        self,
        tasks: Sequence[Task],
        sampler: CurriculumSampler | None = None,
        batcher: TaskBatcher | None = None,
        *,
        seed: int = 0,
        total_steps: int = 1000,
        group_size: int = 1,
    ) -> None:
        self.sampler = sampler if sampler is not None else CurriculumSampler()
        self.batcher = batcher if batcher is not None else TaskBatcher()
        self.seed = seed
        self.total_steps = total_steps
        self.group_size = group_size
        base = StreamingDataset(tasks, seed=seed)
        self.streams: dict[str, StreamingDataset] = {
            d: base.filter(lambda t, d=d: t.difficulty == d, name=d) for d in DIFFICULTIES
        }
        counts = {d: len(s.tasks) for d, s in self.streams.items()}
        if sum(counts.values()) == 0:
            raise ValueError("the task source is empty")
        self._empty = {d for d, c in counts.items() if c == 0}
        self.sampler.set_availability(counts)
        self._rng = random.Random(seed)
        self.step = 0  # batches returned so far
        self.position = 0  # tasks returned so far
        self._pending: Task | None = None  # drawn but did not fit the previous batch

    @property
    def progress(self) -> float:
        """Training progress in [0, 1] for the next batch."""
        return min(1.0, self.step / self.total_steps)

    def _draw_task(self, progress: float) -> Task:
        """One task: a difficulty from the mix at `progress`, then a (weighted) task from it."""
        while True:
            available = [d for d in DIFFICULTIES if d not in self._empty]  # not empty: __init__ checked
            difficulty = self.sampler.sample_difficulty(self._rng, progress, available)
            task = self.streams[difficulty].next_task()
            # Rejection sampling: keep with probability `weight` (<= 1). Weight-1 tasks skip the RNG
            # call so non-adaptive runs use one draw per task.
            weight = self.sampler.weight(task.task_id)
            if weight >= 1.0 or self._rng.random() < weight:
                return task

    def next_batch(self) -> list[Task]:
        """The next batch (at least one task, at most `batcher.max_batch`, within the turn budget)."""
        batch: list[Task] = []
        cost = 0.0
        while len(batch) < self.batcher.max_batch:
            task = self._pending if self._pending is not None else self._draw_task(self.progress)
            self._pending = None
            task_cost = self.batcher.task_cost(task, self.group_size)
            if not self.batcher.can_add(len(batch), cost, task_cost):
                self._pending = task  # opens the next batch (it was drawn at this step's progress)
                break
            batch.append(task)
            cost += task_cost
        self.step += 1
        self.position += len(batch)
        return batch

    def draw_extra(self, count: int) -> list[Task]:
        """`count` more tasks at this step's curriculum progress, outside the batching: the tasks
        that replace a step's uninformative groups (`grpo.refill_rounds`). The step count is
        unchanged; the draws are part of the saved state like any other."""
        progress = min(1.0, max(0, self.step - 1) / self.total_steps)  # that of the batch just returned
        tasks = [self._draw_task(progress) for _ in range(count)]
        self.position += len(tasks)
        return tasks

    def record_results(self, results: Mapping[str, tuple[int, int]]) -> None:
        """Feed back per-task `(successes, attempts)` from a training step (drives adaptive weights)."""
        for task_id, (successes, attempts) in results.items():
            self.sampler.update(task_id, int(successes), int(attempts))

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume exactly; plain JSON types only."""
        return {
            "version": STATE_VERSION,
            "config": {"seed": self.seed, "total_steps": self.total_steps, "group_size": self.group_size},
            "step": self.step,
            "position": self.position,
            "rng": rng_state_to_json(self._rng.getstate()),
            "pending": self._pending.model_dump(mode="json") if self._pending is not None else None,
            "empty_buckets": sorted(self._empty),
            "streams": {d: s.state_dict() for d, s in self.streams.items()},
            "sampler": self.sampler.state_dict(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume from `state_dict()` output. The loader must be built with the same source and
        arguments; a different seed/total_steps/group_size raises ValueError."""
        if state.get("version") != STATE_VERSION:
            raise ValueError(f"unsupported loader state version {state.get('version')!r}")
        config = {"seed": self.seed, "total_steps": self.total_steps, "group_size": self.group_size}
        for key, value in config.items():
            if state["config"][key] != value:
                raise ValueError(f"saved loader {key}={state['config'][key]!r} differs from this loader's {value!r}")
        self.step = int(state["step"])
        self.position = int(state["position"])
        self._rng.setstate(rng_state_from_json(state["rng"]))
        self._pending = Task.model_validate(state["pending"]) if state["pending"] is not None else None
        self._empty = set(state["empty_buckets"])
        for d, stream_state in state["streams"].items():
            self.streams[d].load_state_dict(stream_state)
        self.sampler.load_state_dict(state["sampler"])


def build_loader(config: Config, train_tasks: list[Task]) -> TaskDataLoader:
    """A GRPO run's loader over `train_tasks`: `grpo.curriculum`'s sampler, `grpo.batcher`'s batches
    (off: `training.tasks_per_step` tasks a step), seeded and sized by the run."""
    g, t = config.grpo, config.training
    c = g.curriculum
    sampler = CurriculumSampler(c.mode, start_mix=c.start.model_dump(), end_mix=c.end.model_dump(),
                                fixed_mix=c.fixed.model_dump() if c.fixed else None, high=c.adaptive_high,
                                low=c.adaptive_low, min_attempts=c.adaptive_min_attempts,
                                min_weight=c.adaptive_min_weight, ema_alpha=c.adaptive_ema_alpha)
    if g.batcher.enabled:
        batcher = TaskBatcher(target_turns=g.batcher.target_turns, max_batch=g.batcher.max_batch)
    else:
        batcher = TaskBatcher(target_turns=float("inf"), max_batch=t.tasks_per_step)
    return TaskDataLoader(train_tasks, sampler, batcher, seed=t.seed, total_steps=t.max_steps, group_size=g.group_size)
