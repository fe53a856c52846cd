"""A seeded, epoch-aware stream over a task list with exactly resumable state.

A `StreamingDataset` walks an endless sequence of epochs over its tasks, each an exact permutation
seeded from (seed, name, epoch) only; restoring jumps straight to the saved position.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from skyrl_tool_agent.data.tasks import Task

logger = logging.getLogger(__name__)


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
