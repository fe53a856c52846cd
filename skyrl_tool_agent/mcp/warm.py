"""`WarmServers`: a server that writes, shared by every episode without one seeing another's writes.

It runs as a warm pool of at most `env.isolation_pool_size` processes, each on its own copies of
the writable paths (`mcp.copies`), started as calls need them. A call takes a warm process alone,
its files holding that episode's state (the original's bytes at its first call, else its latest,
saved when another episode takes the process). The process is never told, so a server that keeps
state in memory must say `stateful: true`.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from skyrl_tool_agent.mcp.copies import IsolatedServer, state_digest, sync_state
from skyrl_tool_agent.mcp.pool import MCPClientPool, MCPPoolClosed, MCPPoolError, MCPServerUnavailable
from skyrl_tool_agent.mcp.reaper import run_reaper
from skyrl_tool_agent.mcp.specs import ToolResult, ToolSpec

logger = logging.getLogger(__name__)


async def start_on_copy(server: IsolatedServer, directory: Path, call_timeout_s: float) -> MCPClientPool:
    """One process of `server`, started on a fresh copy of its writable paths in `directory`
    (removed again if it does not start)."""
    try:
        spec = await asyncio.to_thread(server.copy_into, directory)
        pool = MCPClientPool([spec], call_timeout_s=call_timeout_s, sessions_per_server=1)
        await pool.start()
    except BaseException:
        shutil.rmtree(directory, ignore_errors=True)
        raise
    return pool

#: Files below this size are digested on the event loop (tens of microseconds), not in a thread.
_INLINE_BYTES = 1 << 20


class _WarmProcess:
    """One warm process of a `WarmServers`, on its own directory of copies."""

    def __init__(self, directory: Path, pool: MCPClientPool, paths: list[Path]) -> None:
        self.directory = directory
        self.pool = pool
        self.paths = paths  # the copies its server was pointed at
        self.busy = False
        self.holder: _EpisodeState | None = None  # the episode whose state the files hold, if any
        self.from_original = True  # the files were the original's when `digest` was taken
        self.digest: str | None = None  # of the files when installed: unchanged since = no call wrote


class _EpisodeState:
    """One episode's state of one warm server: in a warm process (`resident`) or saved (`saved`), else
    the original's."""

    def __init__(self) -> None:
        self.resident: _WarmProcess | None = None
        self.saved: Path | None = None
        self.lost: str | None = None  # its server failed mid-call: the state is gone, the episode cannot go on
        self.ended = False


class WarmServers:
    """At most `size` processes of one server with writable paths, shared by every episode (module
    docstring). Lives on the runtime pool's event loop; every method runs there."""

    def __init__(self, server: IsolatedServer, *, size: int, call_timeout_s: float) -> None:
        self.server = server
        self.size = max(1, size)
        self.call_timeout_s = call_timeout_s
        self.running: list[_WarmProcess] = []
        self._starting = 0  # processes being started (counted against size)
        self._growing: set[asyncio.Task[None]] = set()
        self._grow_error: str | None = None
        self._changed: asyncio.Condition | None = None
        self._closed = False
        #: What the processes did, for the log and the benchmark: restores from the original, saves and
        #: restores of an episode's state, processes started.
        self.counts = {"started": 0, "restored_original": 0, "saved": 0, "restored_saved": 0}

    @property
    def name(self) -> str:
        return self.server.spec.name

    def _condition(self) -> asyncio.Condition:
        if self._changed is None:
            self._changed = asyncio.Condition()
        return self._changed

    async def _new_process(self) -> _WarmProcess:
        directory = run_reaper().new_dir(f"warm-{self.name}-")
        pool = await start_on_copy(self.server, directory, self.call_timeout_s)
        self.counts["started"] += 1
        proc = _WarmProcess(directory, pool, self.server.paths_in(directory))
        proc.digest = await self._digest(proc.paths)
        return proc

    async def start(self) -> list[ToolSpec]:
        """Start the first process (its tools are the server's listing); the others start on demand."""
        proc = await self._new_process()
        self.running.append(proc)
        return proc.pool.tools

    async def _acquire(self, state: _EpisodeState) -> _WarmProcess:
        condition = self._condition()
        async with condition:
            while True:
                if self._closed:
                    raise MCPPoolClosed(f"the MCP server {self.name!r} is closed")
                if state.resident is not None:  # its state is in that process: wait for it (its own calls serialise)
                    if state.resident in self.running and not state.resident.busy:
                        proc = state.resident
                        proc.busy = True
                        return proc
                    if state.resident not in self.running:
                        state.resident = None
                        continue
                else:
                    idle = [s for s in self.running if not s.busy]
                    # a free process first (no episode's state to keep), then a live episode's (saved first
                    # if its calls changed the files)
                    idle.sort(key=lambda s: s.holder is not None and not s.holder.ended)
                    if idle:
                        proc = idle[0]
                        proc.busy = True
                        return proc
                    if len(self.running) + self._starting < self.size:
                        # every process busy: one more, started aside; this call takes whichever
                        # process frees first (a busy one usually does, long before a process starts)
                        self._starting += 1
                        task = asyncio.get_running_loop().create_task(self._grow())
                        self._growing.add(task)
                        task.add_done_callback(self._growing.discard)
                    elif not self.running and not self._starting:
                        raise MCPServerUnavailable(f"MCP server {self.name!r} cannot start: {self._grow_error}")
                await condition.wait()

    async def _grow(self) -> None:
        try:
            proc = await self._new_process()
        except Exception as exc:  # noqa: BLE001 - the callers waiting hear of it (none left) or use the others
            self._grow_error = f"{type(exc).__name__}: {exc}"
            logger.warning("MCP server %r: another process did not start: %s", self.name, self._grow_error)
            proc = None
        async with self._condition():
            self._starting -= 1
            if proc is not None and not self._closed:
                self.running.append(proc)
                proc = None
            self._condition().notify_all()
        if proc is not None:  # closed meanwhile
            await proc.pool.close()
            shutil.rmtree(proc.directory, ignore_errors=True)

    async def _install(self, proc: _WarmProcess, state: _EpisodeState) -> None:
        """Make the process's files hold `state`: its saved copy, else the original's bytes. The live
        episode whose state they held is saved first, unless no call changed them (digest)."""
        if proc.holder is state:
            return
        changed = proc.digest is None or await self._digest(proc.paths) != proc.digest
        holder = proc.holder
        if holder is not None and not holder.ended and holder.lost is None:
            if changed:  # else its state is still what was installed: its saved copy, or the original
                saved = holder.saved or run_reaper().new_dir(f"state-{self.name}-")
                await asyncio.to_thread(self._copy_all, proc.paths, self.server.paths_in(saved))
                holder.saved = saved
                self.counts["saved"] += 1
            holder.resident = None
        if state.saved is not None:
            await asyncio.to_thread(self._copy_all, self.server.paths_in(state.saved), proc.paths)
            self.counts["restored_saved"] += 1
            proc.digest = await self._digest(proc.paths)
        elif changed or not proc.from_original:
            await asyncio.to_thread(functools.partial(self._copy_all, [o for _, o in self.server.writable], proc.paths,
                                                      from_original=True))
            self.counts["restored_original"] += 1
            proc.digest = await self._digest(proc.paths)
        proc.holder, proc.from_original = state, state.saved is None
        state.resident = proc

    async def _digest(self, paths: Sequence[Path]) -> str:
        """`state_digest`, in a thread unless the files are small (a thread hop costs more)."""
        small = all(p.is_file() and p.stat().st_size < _INLINE_BYTES for p in paths)
        return state_digest(paths) if small else await asyncio.to_thread(state_digest, paths)

    @staticmethod
    def _copy_all(sources: Sequence[Path], targets: Sequence[Path], *, from_original: bool = False) -> None:
        for source, target in zip(sources, targets, strict=True):
            sync_state(source, target, source_is_copy=not from_original)

    async def call(self, state: _EpisodeState, name: str, arguments: dict[str, Any]) -> ToolResult:
        """One call of an episode, on a process holding its state."""
        if state.lost is not None:
            raise MCPServerUnavailable(state.lost)
        proc = await self._acquire(state)
        try:
            await self._install(proc, state)
            return await proc.pool.call_tool(name, arguments)
        except MCPPoolError as exc:
            # The server failed or hung mid-call: what it wrote is unknown. Its process is retired (a
            # fresh one replaces it on demand) and the episode's state is gone with it.
            state.lost = f"MCP server {self.name!r} failed during an episode that writes to it, losing the " \
                         f"episode's copy of its files ({exc})"
            await self._retire(proc)
            raise
        finally:
            proc.busy = False
            async with self._condition():
                self._condition().notify_all()

    async def _retire(self, proc: _WarmProcess) -> None:
        async with self._condition():
            if proc in self.running:
                self.running.remove(proc)
        if proc.holder is not None:
            proc.holder.resident = None
        await proc.pool.close()
        shutil.rmtree(proc.directory, ignore_errors=True)

    async def end(self, state: _EpisodeState) -> None:
        """The episode ended: its saved copy goes, its process's files are the original's again at next use."""
        state.ended = True
        if state.saved is not None:
            saved, state.saved = state.saved, None
            await asyncio.to_thread(shutil.rmtree, saved, True)
        state.resident = None
        async with self._condition():
            self._condition().notify_all()

    async def close(self) -> None:
        self._closed = True
        async with self._condition():
            self._condition().notify_all()
        await asyncio.gather(*self._growing, return_exceptions=True)
        running, self.running = self.running, []
        await asyncio.gather(*(proc.pool.close() for proc in running), return_exceptions=True)
        for proc in running:
            shutil.rmtree(proc.directory, ignore_errors=True)
        if self.counts["started"]:
            logger.info("MCP server %r: %d warm process(es) served its episodes (%s)", self.name,
                        self.counts["started"], ", ".join(f"{k} {v}" for k, v in self.counts.items()))
