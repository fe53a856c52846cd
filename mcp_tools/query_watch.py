"""One thread per process that stops running SQLite queries from outside: at their deadline, or
when the process passed its memory ceiling (`mcp_tools.process_memory`).

A stop is `Connection.interrupt()`: SQLite sees the flag at its next loop step, without the GIL,
so a query stops within milliseconds instead of running on until its next progress check.
`run_query` arms the watch when a query starts and disarms it when it ends; arming, disarming and
the interrupt itself hold one lock, so a query that was disarmed is never interrupted (the
connection may be running the next caller's query by then). A query stopped for memory finds
`stop_reason = "memory"` on its connection.
"""

from __future__ import annotations

import heapq
import itertools
import os
import sqlite3
import threading
import time

from mcp_tools.process_memory import RSS_POLL_S, memory_victim, rss_ceiling, thread_faults

#: After a query was stopped for memory, how long the watch waits for it to end (and free what
#: it held) before it stops another one while RSS is still over the ceiling.
UNWIND_S = 0.5


class QueryWatch:
    """The watch thread and the queries it watches (module docstring)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int]] = []
        self._live: dict[int, sqlite3.Connection] = {}
        self._threads: dict[int, tuple[int, int]] = {}  # token -> (native thread id, its faults at the start)
        self._unwinding: dict[int, float] = {}  # token stopped for memory -> when
        self._seq = itertools.count()
        self._thread: threading.Thread | None = None
        self.fired = 0
        self.memory_stops = 0

    def arm(self, conn: sqlite3.Connection, deadline: float) -> int:
        """Watch the query `conn` starts now, on this thread, until `disarm`."""
        faults = thread_faults() if rss_ceiling() is not None else None
        with self._cond:
            token = next(self._seq)
            heapq.heappush(self._heap, (deadline, token))
            self._live[token] = conn
            if faults is not None:
                self._threads[token] = (threading.get_native_id(), faults)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._loop, name="sqlite-query-watch", daemon=True)
                self._thread.start()
            self._cond.notify()
            return token

    def disarm(self, token: int) -> bool:
        """Stop watching `token`; True if its query was interrupted by the watch."""
        with self._cond:
            self._threads.pop(token, None)
            self._unwinding.pop(token, None)
            return self._live.pop(token, None) is None

    def _stop(self, token: int, reason: str | None) -> None:
        """Interrupt `token`'s query (the lock held)."""
        conn = self._live.pop(token)
        self._threads.pop(token, None)
        self.fired += 1
        if reason is not None:
            conn.stop_reason = reason  # type: ignore[attr-defined]
        try:
            conn.interrupt()
        except Exception:  # noqa: BLE001 - a closed connection has nothing to stop
            pass

    def _check_memory(self) -> None:
        """Stop the query growing the process if RSS is over the ceiling (the lock not held)."""
        with self._cond:
            now = time.monotonic()
            if any(now - since < UNWIND_S for since in self._unwinding.values()):
                return  # the last one stopped is still freeing its memory
            running = dict(self._threads)
        victim = memory_victim(running)  # reads /proc and may trim: outside the lock
        with self._cond:
            if victim is not None and victim in self._live:
                self._stop(victim, "memory")
                self._unwinding[victim] = time.monotonic()
                self.memory_stops += 1

    def _loop(self) -> None:
        while True:
            with self._cond:
                while self._heap and self._heap[0][1] not in self._live:
                    heapq.heappop(self._heap)
                if not self._heap:
                    self._cond.wait()
                    continue
                deadline, token = self._heap[0]
                delay = deadline - time.monotonic()
                if delay <= 0:
                    heapq.heappop(self._heap)
                    self._stop(token, None)
                    continue
                watch_memory = bool(self._threads)
                self._cond.wait(min(delay, RSS_POLL_S) if watch_memory else delay)
            if watch_memory:
                self._check_memory()

    def after_fork(self) -> None:
        self.__init__()  # type: ignore[misc]  # the thread did not survive the fork; nor did the queries it watched


query_watch = QueryWatch()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=query_watch.after_fork)

__all__ = ["QueryWatch", "UNWIND_S", "query_watch"]
