"""Streaming task datasets: seeded, epoch-aware iteration with exactly resumable state.

A `StreamingDataset` walks an endless sequence of epochs over a task source without holding the
whole source in memory when it is large:

* an in-memory list (or a `.json` task file, loaded whole) is shuffled with an exact permutation
  per epoch; restoring jumps straight to the saved position;
* a zero-argument callable returning an iterator (a JSONL reader, a Spider generator, ...) or a
  `.jsonl` path is re-read once per epoch and shuffled through a bounded shuffle buffer of
  `buffer_size` tasks (the tf.data / webdataset scheme), so at most `buffer_size` tasks are held.
  Restoring re-creates the epoch's stream and skips `position` tasks, which reproduces the exact
  same order because the buffer's RNG is seeded from (seed, name, epoch) only. Skipping costs
  O(position) reads, bounded by one epoch.
"""

from __future__ import annotations

import itertools
import logging
import random
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from skyrl_tool_agent.data.json_input import loads_bounded
from skyrl_tool_agent.data.tasks import Task, load_tasks

logger = logging.getLogger(__name__)

#: What a `StreamingDataset` can read: a task list, a re-iterable factory, or a .json/.jsonl path.
TaskSource = Sequence[Task] | Callable[[], Iterable[Task]] | str | Path


class EmptyStreamError(ValueError):
    """An epoch of a dataset yielded no task at all (empty source or a filter that matches nothing)."""


def read_jsonl_tasks(path: str | Path) -> Iterator[Task]:
    """Yield tasks from a JSONL file (one Task object per line) one line at a time; blank lines skipped."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"task file not found: {path}")
    with path.open(encoding="utf-8") as handle:
        for lineno, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                yield Task.model_validate(loads_bounded(line))
            except ValueError as exc:  # JSONDecodeError and pydantic ValidationError are ValueErrors
                raise ValueError(f"{path}:{lineno}: invalid task line ({exc})") from exc


def derived_rng(seed: int, *parts: object) -> random.Random:
    """A `random.Random` seeded from `seed` and `parts` (e.g. a name and an epoch).

    String seeds are hashed with SHA-512 by `random` (independent of PYTHONHASHSEED), so the result
    is reproducible across processes, and (seed=0, epoch=1) does not collide with (seed=1, epoch=0)
    as plain `seed + epoch` would.
    """
    return random.Random("/".join(str(p) for p in (seed, *parts)))


def shuffle_buffer(
    items: Iterable[Task], buffer_size: int, rng: random.Random, on_fill: Callable[[int], None] | None = None
) -> Iterator[Task]:
    """Approximately shuffle a stream holding at most `buffer_size` items.

    Fill the buffer, then for each further item emit a random buffered one and put the new item in
    its slot; at the end emit the rest in random order. `on_fill` is told the buffer's size each
    time it grows (used to report the peak).
    """
    if buffer_size < 1:
        raise ValueError(f"buffer_size must be >= 1, got {buffer_size}")
    buf: list[Task] = []
    for item in items:
        if len(buf) < buffer_size:
            buf.append(item)
            if on_fill is not None:
                on_fill(len(buf))
            continue
        j = rng.randrange(buffer_size)
        out, buf[j] = buf[j], item
        yield out
    rng.shuffle(buf)
    yield from buf


class StreamingDataset:
    """An endless, seeded stream of tasks over repeated epochs, with saveable (epoch, position).

    `next_task()` (also `next(ds)`) returns the next task, moving on to a freshly shuffled epoch
    when one is exhausted; `iter_epoch(e)` gives a single pass. `state_dict()` / `load_state_dict()`
    save and restore the place in the stream exactly. Memory: a list source is held as given; a
    streamed source holds at most `buffer_size` tasks (see `peak_buffered`).
    """

    def __init__(
        self,
        source: TaskSource,
        *,
        seed: int = 0,
        shuffle: bool = True,
        buffer_size: int = 10_000,
        name: str = "",
    ) -> None:
        if buffer_size < 1:
            raise ValueError(f"buffer_size must be >= 1, got {buffer_size}")
        self.seed = seed
        self.shuffle = shuffle
        self.buffer_size = buffer_size
        self.name = name
        self._tasks: Sequence[Task] | None = None
        self._factory: Callable[[], Iterable[Task]] | None = None
        if isinstance(source, (str, Path)):
            path = Path(source)
            if path.suffix == ".jsonl":
                self._factory = lambda: read_jsonl_tasks(path)
            else:  # .json task lists are small (the built-in set): load them whole
                self._tasks = load_tasks(path)
        elif isinstance(source, Sequence):
            self._tasks = source
        elif callable(source):
            self._factory = source
        else:
            # A bare iterator/generator can only be read once, but every epoch (and every resume)
            # must re-read the source.
            raise TypeError(
                "source must be a list of Tasks, a .json/.jsonl path, or a zero-argument callable "
                f"returning an iterator (so each epoch can re-read it); got {type(source).__name__}"
            )
        self.epoch = 0
        self.position = 0  # tasks already returned from the current epoch
        self._iter: Iterator[Task] | None = None
        self._peak_buffered = 0

    # ------------------------------------------------------------------ introspection
    @property
    def in_memory(self) -> bool:
        """True when the source is an in-memory list (exact per-epoch permutation, O(1) resume)."""
        return self._tasks is not None

    @property
    def peak_buffered(self) -> int:
        """Most tasks the shuffle buffer has held at once (0 for list sources, which buffer nothing)."""
        return self._peak_buffered

    def __len__(self) -> int:
        if self._tasks is None:
            raise TypeError("len() is only known for in-memory sources; a streamed source is not counted")
        return len(self._tasks)

    def iter_source(self) -> Iterator[Task]:
        """One unshuffled pass over the source (reads a streamed source afresh)."""
        if self._tasks is not None:
            return iter(self._tasks)
        assert self._factory is not None
        return iter(self._factory())

    def filter(self, predicate: Callable[[Task], bool], name: str) -> StreamingDataset:
        """A new dataset over the tasks matching `predicate`, same seed/buffer settings, given `name`.

        The name enters the shuffle seed, so sibling filtered datasets shuffle independently. A list
        source is filtered once into a (smaller) list; a streamed source stays streamed.
        """
        source: TaskSource
        if self._tasks is not None:
            source = [t for t in self._tasks if predicate(t)]
        else:
            factory = self._factory
            assert factory is not None
            source = lambda: (t for t in factory() if predicate(t))  # noqa: E731
        full_name = f"{self.name}/{name}" if self.name else name
        return StreamingDataset(
            source, seed=self.seed, shuffle=self.shuffle, buffer_size=self.buffer_size, name=full_name
        )

    # ------------------------------------------------------------------ iteration
    def _note_buffered(self, size: int) -> None:
        if size > self._peak_buffered:
            self._peak_buffered = size

    def iter_epoch(self, epoch: int, start: int = 0) -> Iterator[Task]:
        """The tasks of `epoch` in their deterministic shuffled order, skipping the first `start`."""
        rng = derived_rng(self.seed, self.name, epoch)
        if self._tasks is not None:
            order = list(range(len(self._tasks)))
            if self.shuffle:
                rng.shuffle(order)
            tasks = self._tasks
            return (tasks[i] for i in order[start:])
        assert self._factory is not None
        stream: Iterator[Task] = iter(self._factory())
        if self.shuffle:
            stream = shuffle_buffer(stream, self.buffer_size, rng, self._note_buffered)
        return itertools.islice(stream, start, None)

    def next_task(self) -> Task:
        """The next task, starting a new (re-shuffled) epoch when the current one is exhausted."""
        for _ in range(2):  # at most one epoch boundary per call
            if self._iter is None:
                self._iter = self.iter_epoch(self.epoch, start=self.position)
            task = next(self._iter, None)
            if task is not None:
                self.position += 1
                return task
            if self.position == 0:
                self._iter = None
                raise EmptyStreamError(f"dataset {self.name or '<unnamed>'!r}: epoch {self.epoch} has no tasks")
            logger.debug("dataset %r: epoch %d done after %d tasks", self.name, self.epoch, self.position)
            self.epoch += 1
            self.position = 0
            self._iter = None
        raise EmptyStreamError(f"dataset {self.name or '<unnamed>'!r}: epoch {self.epoch} has no tasks")

    def __iter__(self) -> StreamingDataset:
        return self

    def __next__(self) -> Task:
        return self.next_task()

    # ------------------------------------------------------------------ state
    def state_dict(self) -> dict[str, Any]:
        """JSON-serialisable place in the stream, plus the settings that determine the order."""
        return {
            "epoch": self.epoch,
            "position": self.position,
            "seed": self.seed,
            "name": self.name,
            "shuffle": self.shuffle,
            "buffer_size": self.buffer_size,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume at a saved place. Raises ValueError if the saved ordering settings differ."""
        for key in ("seed", "name", "shuffle", "buffer_size"):
            if key in state and state[key] != getattr(self, key):
                raise ValueError(
                    f"dataset {self.name!r}: saved {key}={state[key]!r} differs from this dataset's "
                    f"{getattr(self, key)!r}; the order would not be reproduced"
                )
        self.epoch = int(state["epoch"])
        self.position = int(state["position"])
        self._iter = None  # re-created (and fast-forwarded) lazily by next_task()
