"""Stop training at a safe point on SIGINT or SIGTERM, keeping the work done.

The first signal only raises a flag: the trainer finishes the step under way (rollout and
update), saves a checkpoint and raises `TrainingInterrupted`, so the steps since the last
periodic checkpoint are not lost and `--resume auto` continues from the same state. A second
signal of either kind stops at once (Ctrl-C twice is the escape hatch for a stuck step).
Handlers are only installed from the main thread (signal's rule); elsewhere nothing changes.
"""

from __future__ import annotations

import logging
import signal
import threading
from pathlib import Path
from types import FrameType
from typing import Any

logger = logging.getLogger(__name__)

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class TrainingInterrupted(Exception):
    """Training stopped on a signal after `step`, with a checkpoint at `checkpoint`."""

    def __init__(self, signal_name: str, step: int, checkpoint: Path | None) -> None:
        super().__init__(f"interrupted by {signal_name} after step {step}"
                         + (f": checkpoint saved in {checkpoint}" if checkpoint else ""))
        self.signal_name = signal_name

    @property
    def exit_code(self) -> int:
        """The shell's convention for a process ended by a signal: 128 + its number."""
        return 128 + int(signal.Signals[self.signal_name])


class StopOnSignals:
    """Context manager: `received` is None until SIGINT/SIGTERM arrives, then the signal's name."""

    def __init__(self) -> None:
        self.received: str | None = None
        self._previous: dict[int, Any] = {}

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if self.received is not None:  # the second signal: give up the safe point
            self._restore()
            if signum == signal.SIGINT:
                raise KeyboardInterrupt
            raise SystemExit(128 + signum)
        self.received = name
        logger.warning("%s received: finishing the current step, then saving a checkpoint "
                       "(send it again to stop at once)", name)

    def _restore(self) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()

    def __enter__(self) -> StopOnSignals:
        if threading.current_thread() is threading.main_thread():
            for signum in STOP_SIGNALS:
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._restore()


__all__ = ["STOP_SIGNALS", "StopOnSignals", "TrainingInterrupted"]
