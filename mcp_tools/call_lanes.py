"""How a server's tool calls get worker threads, so that a cheap call does not wait behind slow ones.

Every call body runs on a worker thread (SQLite releases the GIL while it works), never on the
event loop: one slow query must not hold up the calls beside it. Running cheap queries inline on
the event loop saved about a third of the server's CPU per call, but one query that spent its
whole budget inside a single SQLite operation (which no deadline check can split) then froze every
other call for as long: a 38 s printf made a concurrent `SELECT 1` wait 38 s.

Threads come from two lanes:

* the main lane: `MAX_QUERY_THREADS`, first come first served. A call there has the server's
  whole time limit, counted from the start of its thread, not from its arrival;
* the express lane: `EXPRESS_THREADS`, newest call first. Only a call that found every main
  thread busy goes there (slow queries running into their deadlines: with 32 of them in flight a
  `count(*)` used to wait up to the whole limit for a thread, and behind 64 up to twice that).
  It tries there with a short budget (`PROBE_S`) while it keeps its place in the main queue: a
  cheap call is answered from the express lane; a call that needs longer is stopped at the budget
  and runs again in the main lane, with its whole limit (the try cost it at most `PROBE_S` of
  work, and a read-only query gives the same answer twice). Work that does not take a budget
  (a schema's first load: cheap by kind) runs in the express lane to its end.

  A try stopped at its budget before its thread had `PROBE_MIN_CPU_S` of CPU was starved, not
  slow: on a machine whose cores ~50 busy threads share, a `count(*)` that needs ~1 ms of CPU got
  0.4 ms in 0.33 s, was sent to the main lane behind 68 slow calls and answered "timeout". Such a
  try runs again at once on its express slot (its tries' CPU counted together), up to
  `PROBE_TRIES` tries. Where a thread's CPU time cannot be read (macOS, for a try the watchdog
  gave up on), the try counts as slow.

A watchdog answers for a call whose thread is still running `WATCHDOG_GRACE_S` past its limit
(SQLite stuck inside one operation, or a starved machine): `run` returns None. A call that got no
thread within twice the limit gets None too, and its work never starts. What happens to a thread
left behind depends on the lanes' `stop_abandoned`:

* off (the SQL server): the thread ends on its own; the query's cost is bounded by the sandbox
  (its deadline and limits, `sandbox_limits`). Its work touches the server's shared catalog, which
  an exception raised at an arbitrary point could leave half-updated;
* on (the one-file server, whose tools are arbitrary Python with no deadline of their own): the
  watchdog raises `Abandoned` inside the thread (`PyThreadState_SetAsyncExc`), which stops the
  tool at its next Python instruction. A tool blocked inside one C call (a `time.sleep(60)`, a
  read with no timeout) stops when that call returns; a tool that catches BaseException and
  goes on is not stopped.

A server whose limit should follow its client's reads it with `limit_under_client`: the MCP client
pool (skyrl_tool_agent.mcp) puts the deadline it gives each call in every server's environment
(`CLIENT_DEADLINE_ENV_VAR`), and the server takes a share of it, so that its own `timeout:`
answer, which the model reads, arrives before the client gives up on the call.
"""

from __future__ import annotations

import ctypes
import logging
import math
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Generic, TypeVar

import anyio
import anyio.to_thread

from mcp_tools.sandbox import SandboxError

logger = logging.getLogger(__name__)

R = TypeVar("R")

#: Set by the MCP client pool in each server's environment: the seconds it waits for one call.
CLIENT_DEADLINE_ENV_VAR = "SKYRL_MCP_CALL_TIMEOUT_S"
#: The share of the client's deadline a server following it takes as its own limit; the rest
#: covers the watchdog's grace, a thread that starts late on a busy machine and the answer's trip.
SHARE_OF_CLIENT_DEADLINE = 0.8

#: Worker threads of the main lane; a call the watchdog gave up on frees its slot.
MAX_QUERY_THREADS = 32
#: Worker threads of the express lane (0: none, every call waits for the main lane). Enough to try
#: a burst of slow calls quickly: when the main lane's 32 slow queries end together, their
#: clients send 32 more, and a cheap call behind them waits for their tries (with 4 threads it
#: waited ~2 s; measured with 64 slow calls in flight, a 2 s limit).
EXPRESS_THREADS = 16
#: Time limit (s) of a try in the express lane. A Spider-sized query needs a few ms of CPU; with
#: ~40 threads sharing the cores it still gets that within this much wall time.
PROBE_S = 0.25
#: CPU time (s) a try's thread must have had before running out of its budget counts as slow:
#: a `count(*)` on Spider's singer table needs 0.3-1.2 ms of it, call and answer included; a
#: runaway query got 2-12 ms in a 0.25 s try beside 48 busy threads and 10 busy processes on 2
#: cores. (5 ms retried more runaway tries: a cheap call behind them waited 0.51 s, not 0.35.)
PROBE_MIN_CPU_S = 0.002
#: Tries of a starved call on its express slot, at most, before it waits for the main lane: a
#: starved cheap call needs one more. (4 held the slots longer with runaway queries' tries: beside
#: 100 of them and 16 busy processes a cheap call's median wait was 240 ms, with 2 190 ms.)
PROBE_TRIES = 2
#: Seconds past a call's limit after which the watchdog answers itself. The query's own deadline
#: check normally answers first; on a starved machine the worker thread may not run for a while.
WATCHDOG_GRACE_S = 0.05
#: How often the watchdog looks whether a call's thread has started.
QUEUE_POLL_S = 0.05


def limit_under_client(default_s: float) -> float:
    """A server's limit for one call: `SHARE_OF_CLIENT_DEADLINE` of the deadline its client put in
    `CLIENT_DEADLINE_ENV_VAR`, else `default_s` (a server started by hand, or by another client)."""
    text = os.environ.get(CLIENT_DEADLINE_ENV_VAR)
    if not text:
        return default_s
    try:
        client_s = float(text)
    except ValueError:
        client_s = math.nan
    if not math.isfinite(client_s) or client_s <= 0:
        logger.warning("ignoring %s=%r (not a positive number of seconds)", CLIENT_DEADLINE_ENV_VAR, text)
        return default_s
    return SHARE_OF_CLIENT_DEADLINE * client_s


#: Whether another thread's CPU time can be read (Linux, the BSDs; not macOS): a try the watchdog
#: gave up on counts as slow where it cannot.
_CPU_CLOCK_OF_THREAD = hasattr(time, "pthread_getcpuclockid")


class Abandoned(BaseException):
    """Raised inside a call's thread once the watchdog has answered for it (`stop_abandoned`). A
    BaseException, so that a tool's `except Exception` does not swallow it."""


def _raise_in_thread(ident: int, exc: type[BaseException] | None) -> None:
    """Have the thread `ident` raise `exc` at its next Python instruction (None: forget one that
    has not been raised yet)."""
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(ident), ctypes.py_object(exc) if exc else None)


class _Stoppable:
    """The worker thread of one attempt, stopped (`Abandoned`) when the watchdog gives up on it:
    only while it is inside the call's work, never once the work has returned (the exception
    would land in the thread pool's own loop)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ident: int | None = None
        self._abandoned = False
        self.clock: int | None = None  # the thread's CPU clock, where the platform names it

    def cpu_since(self, start: float) -> float | None:
        """CPU time the thread has had since its clock read `start`; None where unknown (no
        per-thread clock on this platform, or the thread has just ended)."""
        if self.clock is None:
            return None
        try:
            return time.clock_gettime(self.clock) - start
        except OSError:
            return None

    def enter(self) -> None:
        with self._lock:
            if self._abandoned:  # given up on before its thread started: the work never starts
                raise Abandoned
            self._ident = threading.get_ident()

    def leave(self) -> None:
        with self._lock:
            if self._ident is not None:
                _raise_in_thread(self._ident, None)  # a stop that came as the work returned
                self._ident = None

    def stop(self) -> None:
        with self._lock:
            self._abandoned = True
            if self._ident is not None:
                _raise_in_thread(self._ident, Abandoned)


class _Slots:
    """`size` slots; waiters are served oldest first, or newest first."""

    def __init__(self, size: int, *, newest_first: bool) -> None:
        self.size = self.free = size
        self._waiters: deque[anyio.Event] = deque()
        self._newest_first = newest_first

    def try_take(self) -> bool:
        if self.free and not self._waiters:
            self.free -= 1
            return True
        return False

    async def take(self) -> None:
        if self.try_take():
            return
        granted = anyio.Event()
        self._waiters.append(granted)
        try:
            await granted.wait()
        except BaseException:
            if granted.is_set():
                self.give_back()  # handed over as the wait was cancelled: pass it on
            else:
                self._waiters.remove(granted)
            raise

    def give_back(self) -> None:
        if self._waiters:
            (self._waiters.pop() if self._newest_first else self._waiters.popleft()).set()
        else:
            self.free += 1


class _Answer(Generic[R]):
    """What an attempt came to: a value or an exception to re-raise, and the CPU time its thread
    had (None: unknown, or it never started)."""

    def __init__(self, value: R | None = None, error: BaseException | None = None,
                 cpu_s: float | None = None) -> None:
        self.value, self.error, self.cpu_s = value, error, cpu_s

    def too_slow(self) -> bool:
        """Whether the try ran out of its budget (the watchdog's None, or the query's timeout)."""
        return (self.value is None and self.error is None) or (
            isinstance(self.error, SandboxError) and self.error.kind == "timeout")

    def get(self) -> R | None:
        if self.error is not None:
            raise self.error
        return self.value


class CallLanes:
    """The two lanes of one server (module docstring); made and used on its event loop."""

    def __init__(self, timeout_s: float, *, main_threads: int = MAX_QUERY_THREADS,
                 express_threads: int = EXPRESS_THREADS, probe_s: float = PROBE_S,
                 probe_min_cpu_s: float = PROBE_MIN_CPU_S, stop_abandoned: bool = False) -> None:
        self.timeout_s = timeout_s
        self.probe_s = probe_s
        self.probe_min_cpu_s = probe_min_cpu_s
        self.stop_abandoned = stop_abandoned  # module docstring
        self.stopped = 0  # threads the watchdog stopped (stop_abandoned)
        self._main = _Slots(main_threads, newest_first=False)
        self._express = _Slots(express_threads, newest_first=True)
        self._threads: anyio.CapacityLimiter | None = None  # anyio's own cap, above ours: never waits
        self.express_answers = 0  # calls answered from the express lane
        self.express_retries = 0  # tries there that ran out of budget and went to the main lane
        self.starved_tries = 0  # tries there that ran out of budget starved, and ran again (PROBE_MIN_CPU_S)

    async def run(self, work: Callable[[float], R], *, takes_budget: bool = True) -> R | None:
        """`work(limit)` on a worker thread; None if the watchdog gave up on it (module docstring).

        `takes_budget`: `work` stops at `limit` with SandboxError(kind="timeout") (a query), so
        it may be tried in the express lane with `PROBE_S` and run again in the main lane. Else it
        runs in the express lane, when it goes there, with the whole limit. Exceptions from
        `work` are raised.
        """
        if self._threads is None:
            self._threads = anyio.CapacityLimiter(self._main.size + self._express.size + 1)
        give_up_at = time.monotonic() + 2 * self.timeout_s
        if not self._main.try_take():
            answer = await self._wait_for_main(work, takes_budget, give_up_at)
            if answer is not None:
                return answer.get()
        try:
            return (await self._attempt(work, self.timeout_s, give_up_at)).get()
        finally:
            self._main.give_back()

    async def _wait_for_main(self, work: Callable[[float], R], takes_budget: bool,
                             give_up_at: float) -> _Answer[R] | None:
        """Wait for a main slot and try `work` in the express lane meanwhile. The express answer,
        or None with a main slot held; `_Answer(None)` when no thread came by `give_up_at`."""
        budget = self.probe_s if takes_budget else self.timeout_s
        use_express = self._express.size > 0 and (not takes_budget or 4 * budget <= self.timeout_s)
        have_main = trying = False
        answers: list[_Answer[R]] = []
        main_scope, express_scope = anyio.CancelScope(), anyio.CancelScope()

        async def wait_main() -> None:
            nonlocal have_main
            with main_scope:
                await self._main.take()
                have_main = True
                if not trying:
                    express_scope.cancel()

        async def try_express() -> None:
            nonlocal trying
            answer: _Answer[R] | None = None
            with express_scope:
                await self._express.take()
                try:
                    cpu_s = 0.0
                    for tries in range(1, PROBE_TRIES + 1):
                        if have_main:
                            return
                        trying = True
                        answer = await self._attempt(work, budget, give_up_at)
                        trying = False
                        if not (takes_budget and answer.too_slow()):
                            break
                        cpu_s += answer.cpu_s if answer.cpu_s is not None else math.inf
                        if cpu_s >= self.probe_min_cpu_s or tries == PROBE_TRIES:
                            break
                        self.starved_tries += 1  # starved, not slow: again, on this slot
                finally:
                    trying = False
                    self._express.give_back()
            if answer is None:  # the main lane came first
                return
            if takes_budget and answer.too_slow():
                self.express_retries += 1  # the main lane runs it again, with the whole limit
            else:
                answers.append(answer)
                self.express_answers += 1
                main_scope.cancel()

        try:
            with anyio.move_on_after(give_up_at - time.monotonic()):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(wait_main)
                    if use_express:
                        tg.start_soon(try_express)
        except BaseException:
            if have_main:
                self._main.give_back()
            raise
        if answers:
            if have_main:
                self._main.give_back()
            return answers[0]
        return None if have_main else _Answer(None)

    async def _attempt(self, work: Callable[[float], R], limit: float, give_up_at: float) -> _Answer[R]:
        """`work(limit)` on a worker thread; the value None once it runs `WATCHDOG_GRACE_S` past
        `limit` from its thread's start, or has not started by `give_up_at` (the thread is left
        behind, or stopped: `stop_abandoned`). With the CPU time its thread had."""
        started: list[float] = []
        outcome: list[_Answer[R]] = []
        cpu: list[float] = []  # the thread's CPU clock at the start, then the CPU time it had
        done = anyio.Event()
        thread = _Stoppable()

        def timed() -> R:
            if self.stop_abandoned:
                thread.enter()
            started.append(time.monotonic())
            cpu.append(time.thread_time())
            if _CPU_CLOCK_OF_THREAD:
                thread.clock = time.pthread_getcpuclockid(threading.get_ident())
            try:
                return work(limit)
            finally:
                cpu.append(time.thread_time() - cpu[0])
                if self.stop_abandoned:
                    thread.leave()

        async def runner() -> None:
            try:
                outcome.append(_Answer(await anyio.to_thread.run_sync(
                    timed, abandon_on_cancel=True, limiter=self._threads)))
            except Exception as exc:  # noqa: BLE001 - re-raised below
                outcome.append(_Answer(error=exc))
            finally:
                done.set()

        async with anyio.create_task_group() as tg:
            tg.start_soon(runner)
            while not done.is_set():
                now = time.monotonic()
                # Until the thread starts, look again every QUEUE_POLL_S (it usually starts at once).
                end = started[0] + limit + WATCHDOG_GRACE_S if started else min(give_up_at, now + QUEUE_POLL_S)
                if now >= end and (started or now >= give_up_at):
                    tg.cancel_scope.cancel()  # abandoned: the thread finishes on its own, or
                    if len(cpu) == 1:  # is stopped (or never starts its work)
                        cpu.append(thread.cpu_since(cpu[0]))  # what it had so far
                    if self.stop_abandoned:
                        thread.stop()
                        self.stopped += 1
                    break
                with anyio.move_on_after(max(0.0, end - now)):
                    await done.wait()
        cpu_s = cpu[1] if len(cpu) > 1 else None
        if outcome:
            outcome[0].cpu_s = cpu_s
            return outcome[0]
        return _Answer(cpu_s=cpu_s)


__all__ = ["CLIENT_DEADLINE_ENV_VAR", "Abandoned", "EXPRESS_THREADS", "MAX_QUERY_THREADS", "PROBE_MIN_CPU_S", "PROBE_S",
           "PROBE_TRIES", "SHARE_OF_CLIENT_DEADLINE",
           "CallLanes", "limit_under_client"]
