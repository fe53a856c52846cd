"""`ServerSet`: every MCP server process of a run behind one door.

It starts what the config names and hands each episode its tools (`episode_tools`); the caller
never learns how a server runs: shared (`pool.BackgroundMCPPool`), a warm pool on per-episode
copies (`writable_paths`: `warm.WarmServers`) or a process per episode (`stateful`: `EpisodeTools`).
`close` stops them all.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from skyrl_tool_agent.config.env import MCPServerConfig
from skyrl_tool_agent.mcp.copies import IsolatedServer, isolated_server
from skyrl_tool_agent.mcp.pool import BackgroundMCPPool, MCPClientPool, MCPConfigError, MCPPoolClosed
from skyrl_tool_agent.mcp.reaper import run_reaper
from skyrl_tool_agent.mcp.specs import ToolResult, ToolSpec
from skyrl_tool_agent.mcp.warm import WarmServers, _EpisodeState, start_on_copy

logger = logging.getLogger(__name__)


class ServerSet:
    """The run's MCP servers (module docstring): `start` them, `episode_tools`
    per episode, `close`. `writable_originals` are the paths the servers may write, known (and
    checked: each exists and is named by its server's command line) before any server starts."""

    def __init__(self, servers: Sequence[MCPServerConfig], *, call_timeout_s: float, sessions_per_server: int = 1,
                 warm_size: int = 1, pool: BackgroundMCPPool | None = None) -> None:
        """`servers` resolved (`MCPServerConfig.resolved`). `pool`: a started pool to route every
        call to instead (not owned: `close` leaves it running); `servers` are then not started."""
        self.servers = list(servers)
        self.call_timeout_s = call_timeout_s
        self.sessions_per_server = sessions_per_server
        self.warm_size = max(1, warm_size)
        #: Servers whose writes are isolated per episode (`copies.IsolatedServer`).
        self.isolated: list[IsolatedServer] = [] if pool is not None else [
            isolated_server(s) for s in self.servers if s.isolated]
        #: The warm pools of the servers with writable paths (not stateful), by server name.
        self.warm: dict[str, WarmServers] = {}
        self._owns_pool = pool is None
        self.pool = pool
        self.tools: list[ToolSpec] = [] if pool is None else list(pool.list_tools())
        self._scratch: Path | None = None
        self._closed = False

    @property
    def writable_originals(self) -> list[Path]:
        return [original for server in self.isolated for _, original in server.writable]

    def start(self) -> ServerSet:
        """Start the shared servers and the first process of each warm pool, and list every tool.
        `MCPConfigError` when a server does not start or two servers list one tool name (nothing is
        left running)."""
        if self.pool is not None:
            return self
        by_name = {s.spec.name: s for s in self.isolated}
        specs = []
        for server in self.servers:
            isolated = by_name.get(server.name)
            if isolated is not None and not isolated.stateful:
                continue  # its own warm pool, below
            if isolated is not None:
                # the runtime's own copies: removed by `close`, and with the run however it ends
                self._scratch = self._scratch or run_reaper().new_dir("servers-")
                server = isolated.copy_into(self._scratch / server.name)  # the listing instance: its own copy too
            specs.append(server)
        self.pool = BackgroundMCPPool(specs, call_timeout_s=self.call_timeout_s,
                                      sessions_per_server=self.sessions_per_server, allow_empty=True)
        try:
            self.pool.start()
            listed = list(self.pool.list_tools())
            for isolated in self.isolated:
                if isolated.stateful:
                    continue
                warm = self.warm[isolated.spec.name] = WarmServers(isolated, size=self.warm_size,
                                                                   call_timeout_s=self.call_timeout_s)
                listed.extend(t.model_copy(update={"server": isolated.spec.name}) for t in self.pool.run(warm.start()))
            _check_unique_tools(listed)
        except BaseException:
            self.close()  # a server that did not start must not leave the others running
            raise
        self.tools = listed
        return self

    def describe(self, name: str) -> str:
        """How server `name` runs, for the log: '' (shared), or how its writes are isolated."""
        warm = self.warm.get(name)
        if warm is not None:
            return f" (writes isolated: up to {warm.size} warm processes, each call on its episode's own copy)"
        return " (a process per episode, on its own copy)" if any(s.spec.name == name for s in self.isolated) else ""

    def episode_tools(self) -> EpisodeTools:
        """The tools of one new episode (its own servers start at its first call to one)."""
        assert self.pool is not None, "ServerSet.start first"
        return EpisodeTools(self.pool, self.isolated, call_timeout_s=self.call_timeout_s, warm=self.warm,
                            tools=self.tools)

    def close(self) -> None:
        """Stop every server process and remove the copies; idempotent."""
        if self._closed:
            return
        self._closed = True
        warm, self.warm = self.warm, {}
        for servers in warm.values():
            try:
                self.pool.run(servers.close(), timeout_s=60)
            except Exception as exc:  # noqa: BLE001 - closing must not raise
                logger.warning("closing the warm servers of %r failed: %r", servers.name, exc)
        if self._owns_pool and self.pool is not None:
            self.pool.close()
        if self._scratch is not None:
            shutil.rmtree(self._scratch, ignore_errors=True)
        self._scratch = None


def _check_unique_tools(tools: Sequence[ToolSpec]) -> None:
    """Two servers listing one tool name: the pool's `MCPConfigError` (across pools too)."""
    seen: dict[str, str] = {}
    for tool in tools:
        other = seen.setdefault(tool.name, tool.server)
        if other != tool.server:
            raise MCPConfigError(f"tool {tool.name!r} is listed by servers {other!r} and {tool.server!r}; "
                                 "set tool_prefix on one of them")


class EpisodeTools:
    """One episode's tool calls, each routed as its server runs (module docstring); a stateful
    server's process starts at the episode's first call to it. `close`/`aclose` end the episode."""

    def __init__(self, shared: BackgroundMCPPool, isolated: Sequence[IsolatedServer], *, call_timeout_s: float,
                 warm: Mapping[str, WarmServers], tools: Sequence[ToolSpec]) -> None:
        self.shared = shared
        self.isolated = tuple(s for s in isolated if s.stateful)  # a process per episode
        self.warm = dict(warm)
        #: Tool name -> the warm servers that serve it.
        self.warm_tools: dict[str, WarmServers] = {t.name: self.warm[t.server] for t in tools if t.server in self.warm}
        #: Tools routed to the episode's own servers (the names the runtime lists for them).
        self.isolated_tools: dict[str, IsolatedServer] = {
            t.name: s for t in tools for s in self.isolated if t.server == s.spec.name}
        self.call_timeout_s = call_timeout_s
        self._states: dict[str, _EpisodeState] = {}
        self._pools: dict[str, MCPClientPool] = {}  # the stateful servers it called, by name
        self._dir: Path | None = None
        self._opening: asyncio.Lock | None = None  # created on the pool's loop, where it is used
        self._closed = False

    def __eq__(self, other: object) -> bool:  # two episodes' tools are alike until one calls a server
        return isinstance(other, EpisodeTools) and self._key() == other._key()

    __hash__ = None  # type: ignore[assignment]

    def _key(self) -> tuple[Any, ...]:
        return (self.shared, self.isolated, tuple(self.warm.items()), self.call_timeout_s, tuple(self._pools), self._dir,
                self._closed, tuple(self._states))

    async def _open(self, server: IsolatedServer) -> MCPClientPool:
        """The episode's own process of a stateful server, started at its first call to it."""
        if self._opening is None:
            self._opening = asyncio.Lock()
        async with self._opening:
            if self._closed:
                raise MCPPoolClosed("the episode has ended")
            pool = self._pools.get(server.spec.name)
            if pool is None:
                self._dir = self._dir or run_reaper().new_dir("episode-")
                pool = await start_on_copy(server, self._dir / server.spec.name, self.call_timeout_s)
                self._pools[server.spec.name] = pool
            return pool

    async def _call_on_loop(self, name: str, arguments: Mapping[str, Any]) -> ToolResult:
        """One call, on the runtime pool's loop."""
        warm = self.warm_tools.get(name)
        if warm is not None:
            if self._closed:
                raise MCPPoolClosed("the episode has ended")
            state = self._states.setdefault(warm.name, _EpisodeState())
            return await warm.call(state, name, dict(arguments))
        stateful = self.isolated_tools.get(name)
        if stateful is not None:
            pool = await self._open(stateful)
            return await pool.call_tool(name, dict(arguments))
        return await self.shared.pool.call_tool(name, dict(arguments))

    async def call(self, name: str, arguments: Mapping[str, Any]) -> tuple[str, bool]:
        """One call from any event loop: (text, is_error)."""
        result = await asyncio.wrap_future(self.shared.submit(self._call_on_loop(name, arguments)))
        return result.text, result.is_error

    def call_sync(self, calls: Sequence[tuple[str, Mapping[str, Any]]]) -> list[tuple[str, bool]]:
        """One turn's calls, concurrently, blocking (for the sync `step`)."""
        if not calls:
            return []

        async def gather() -> list[ToolResult]:
            return await asyncio.gather(*(self._call_on_loop(n, a) for n, a in calls))

        return [(r.text, r.is_error) for r in self.shared.run(gather())]

    async def _close_on_loop(self) -> None:
        if self._opening is None:
            self._opening = asyncio.Lock()
        async with self._opening:
            self._closed = True
            pools, directory, self._pools, self._dir = self._pools, self._dir, {}, None
            states, self._states = self._states, {}
        for server_name, state in states.items():
            await self.warm[server_name].end(state)
        await asyncio.gather(*(pool.close() for pool in pools.values()), return_exceptions=True)
        if directory is not None:
            shutil.rmtree(directory, ignore_errors=True)

    @property
    def opened(self) -> bool:
        """Whether the episode called a server that isolates it (it has state to drop)."""
        return bool(self._pools) or bool(self._states)

    async def aclose(self) -> None:
        """End the episode's state and own servers (idempotent)."""
        if self.opened or self._dir is not None:
            await asyncio.wrap_future(self.shared.submit(self._close_on_loop()))
        self._closed = True

    def close(self) -> None:
        if self.opened or self._dir is not None:
            self.shared.run(self._close_on_loop())
        self._closed = True
