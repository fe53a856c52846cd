"""Cheap calls do not wait behind slow ones (issue 28, finding 7): `mcp_tools.call_lanes`.

With 32-64 slow calls in flight a trivial `count(*)` waited up to 4.98 s for a worker thread, and
behind more than that it was answered "timeout" without ever running. The lane tests use work
that sleeps (no CPU), so they assert the order of answers, not wall times; the last test floods a
real server.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from pathlib import Path

import anyio
import pytest

from mcp_tools.call_lanes import CallLanes
from mcp_tools.sandbox import SandboxError
from tests.fixtures.live_server import sqlite_server
from tests.hostile_sql import make_hostile_db

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(300)]


def sleeper(need_s: float, limits: list[float] | None = None) -> Callable[[float], str]:
    """Work that needs `need_s` seconds and stops at its limit as a query does (a timeout error)."""

    def work(limit: float) -> str:
        if limits is not None:
            limits.append(limit)
        time.sleep(min(need_s, limit))
        if need_s > limit:
            raise SandboxError("timeout: query ran longer than its limit", kind="timeout")
        return "done"

    return work


async def behind_slow(lanes: CallLanes, slow: int, work: Callable[[float], str],
                      **kwargs: bool) -> tuple[object, list[str]]:
    """Start `slow` calls that run into their limit, then `lanes.run(work)` 0.2 s later: its answer,
    and the order in which the calls ended ("slow" or "it")."""
    order: list[str] = []
    answer: list[object] = []

    async def one_slow() -> None:
        with contextlib.suppress(SandboxError):  # or None: the watchdog answered first
            await lanes.run(sleeper(60))
        order.append("slow")

    async with anyio.create_task_group() as tg:
        for _ in range(slow):
            tg.start_soon(one_slow)
        await anyio.sleep(0.2)
        answer.append(await lanes.run(work, **kwargs))
        order.append("it")
    # Every slot is back (none leaked by the cancelled waits).
    assert lanes._main.free == lanes._main.size and lanes._express.free == lanes._express.size
    return answer[0], order


@pytest.mark.parametrize("express", [1, 0], ids=["express", "main_lane_only"])
async def test_a_cheap_call_does_not_wait_for_slow_ones(express: int) -> None:
    lanes = CallLanes(1.0, main_threads=2, express_threads=express, probe_s=0.1, probe_min_cpu_s=0.0)
    answer, order = await behind_slow(lanes, 3, sleeper(0.0))
    assert answer == "done"
    if express:  # answered from the express lane while every main thread was busy
        assert order[0] == "it" and lanes.express_answers == 1, order
    else:  # the behaviour before: it waited for slow calls to end
        assert order.index("it") >= 2, order


async def test_a_call_too_slow_for_the_express_lane_keeps_its_whole_limit() -> None:
    """Tried with the 0.1 s budget, it runs again in the main lane with the whole 1 s, and answers.
    (Sleeping work has no CPU: `probe_min_cpu_s=0` counts its try as slow, not starved.)"""
    lanes = CallLanes(1.0, main_threads=1, express_threads=1, probe_s=0.1, probe_min_cpu_s=0.0)
    limits: list[float] = []
    answer, order = await behind_slow(lanes, 1, sleeper(0.3, limits))
    assert answer == "done" and limits == [0.1, 1.0] and order == ["slow", "it"]
    assert lanes.express_retries == 1


async def test_work_without_a_budget_runs_in_the_express_lane_to_its_end() -> None:
    """A schema's first load takes no budget: in the express lane it gets the whole limit."""
    lanes = CallLanes(1.0, main_threads=1, express_threads=1, probe_s=0.1)
    limits: list[float] = []
    answer, order = await behind_slow(lanes, 1, sleeper(0.3, limits), takes_budget=False)
    assert answer == "done" and limits == [1.0] and order == ["it", "slow"]


def starved_once(limits: list[float], *, raises: bool) -> Callable[[float], str]:
    """Cheap work whose first try was starved: its thread slept past the budget with no CPU, and
    stopped at the query's deadline (`raises`) or was left to the watchdog; later tries answer."""

    def work(limit: float) -> str:
        limits.append(limit)
        if len(limits) == 1:
            time.sleep(limit + (0 if raises else 0.2))
            if raises:
                raise SandboxError("timeout: query ran longer than its limit", kind="timeout")
        return "done"

    return work


def burning_once(limits: list[float]) -> Callable[[float], str]:
    """Work whose first try spends 20 ms of its thread's CPU, then blocks past its limit (SQLite
    inside one long operation): the watchdog gives up on it. Later tries answer."""

    def work(limit: float) -> str:
        limits.append(limit)
        if len(limits) == 1:
            start = time.thread_time()
            while time.thread_time() - start < 0.02:
                pass
            time.sleep(limit + 0.2)
        return "done"

    return work


@pytest.mark.parametrize("raises", [True, False], ids=["stopped_at_its_deadline", "given_up_by_the_watchdog"])
async def test_a_starved_try_runs_again_in_the_express_lane(raises: bool) -> None:
    """A try that ran out of its budget with under `probe_min_cpu_s` of CPU was starved (a busy
    machine), not slow: it runs again at once on its express slot and is answered there, before
    the slow call holding the main lane ends (CI: a `count(*)` starved this way went to the main
    lane behind 68 slow calls and was answered "timeout")."""
    lanes = CallLanes(1.0, main_threads=1, express_threads=1, probe_s=0.1, probe_min_cpu_s=0.01)
    limits: list[float] = []
    answer, order = await behind_slow(lanes, 1, starved_once(limits, raises=raises))
    assert answer == "done" and limits == [0.1, 0.1] and order == ["it", "slow"]
    assert lanes.starved_tries == 1 and lanes.express_answers == 1 and lanes.express_retries == 0


async def test_a_try_that_had_the_cpu_is_slow_even_when_the_watchdog_gave_up_on_it() -> None:
    """The CPU of a thread the watchdog left behind is read from outside: 20 ms, over
    `probe_min_cpu_s`, so the call goes to the main lane with its whole limit."""
    lanes = CallLanes(1.0, main_threads=1, express_threads=1, probe_s=0.1, probe_min_cpu_s=0.005)
    limits: list[float] = []
    answer, order = await behind_slow(lanes, 1, burning_once(limits))
    assert answer == "done" and limits == [0.1, 1.0] and order == ["slow", "it"]
    assert lanes.starved_tries == 0 and lanes.express_retries == 1


def beating(beats: list[float], quit_: threading.Event) -> Callable[[float], str]:
    """Work with no deadline of its own (a one-file tool): a beat every 10 ms until `quit_`."""

    def work(_limit: float) -> str:
        while not quit_.is_set():
            beats.append(time.monotonic())
            time.sleep(0.01)
        return "quit"

    return work


@pytest.mark.parametrize("stop", [True, False], ids=["stop_abandoned", "left_behind"])
async def test_the_watchdog_stops_the_work_it_gave_up_on(stop: bool) -> None:
    """With `stop_abandoned` (the one-file server) the thread the watchdog gave up on stops at
    once (issue 43: it used to run on, answer dropped); without (the SQL server, whose queries the
    sandbox bounds) it runs on."""
    lanes = CallLanes(0.3, main_threads=1, express_threads=0, stop_abandoned=stop)
    beats: list[float] = []
    quit_ = threading.Event()
    try:
        assert await lanes.run(beating(beats, quit_), takes_budget=False) is None
        answered = time.monotonic()
        await anyio.sleep(0.5)
        late = [t for t in beats if t > answered + 0.1]
        if stop:
            assert not late and lanes.stopped == 1, len(late)
        else:
            assert len(late) > 3 and lanes.stopped == 0  # ~40 beats when the machine is idle
    finally:
        quit_.set()
    assert lanes._main.free == 1 and await lanes.run(lambda _limit: "next") == "next"


async def test_work_given_up_on_before_its_thread_started_never_starts() -> None:
    """The watchdog also gives up on a call whose thread has not started by twice the limit (a
    starved machine): when the thread comes, the work does not start."""
    from mcp_tools.call_lanes import Abandoned, _Stoppable

    thread = _Stoppable()
    thread.stop()
    with pytest.raises(Abandoned):
        thread.enter()


RUNAWAY = "WITH RECURSIVE r(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM r) SELECT count(*) FROM r"


async def test_cheap_call_behind_a_hundred_slow_ones_on_a_real_server(tmp_path: Path) -> None:
    """100 runaway queries under a 1 s limit fill the 32 main threads three times over. A cheap
    call sent behind them is answered, correctly. (Before the express lane it waited in the queue
    past twice its limit and was answered "timeout" without having run.)"""
    make_hostile_db(tmp_path / "demo").rename(tmp_path / "demo" / "demo.sqlite")
    async with sqlite_server(tmp_path, "--timeout-s", "1") as (session, _):
        slow: list[str] = []
        cheap: list[tuple[str, bool]] = []

        async def call(sql: str, into: list) -> None:
            result = await session.call_tool("execute_sql", {"db_id": "demo", "sql": sql})
            text = result.content[0].text
            into.append(text if into is slow else (text, bool(result.is_error)))

        async with anyio.create_task_group() as tg:
            for _ in range(100):
                tg.start_soon(call, RUNAWAY, slow)
            await anyio.sleep(0.3)  # the slow calls are in
            await call("SELECT count(*) FROM singer", cheap)
            assert len(slow) < 100  # the slow ones were still in flight
        assert cheap == [("count(*)\n41", False)]
        assert len(slow) == 100 and all(text.startswith("timeout") for text in slow)
