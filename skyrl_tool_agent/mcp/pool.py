"""Pooled MCP clients: `MCPClientPool` (asyncio) and `BackgroundMCPPool` (thread-backed, for sync callers).

`MCPClientPool(servers)` starts `sessions_per_server` stdio processes per server, lists their tools
once, and routes `call_tool(name, ...)` round-robin over the live sessions of the server listing it
(a tool name two servers list is an `MCPConfigError`).

Failure model:
- tool-level errors (the server answered `is_error`, or a text matching its spec's `error_pattern`,
  for servers that report errors as plain text) are results, `ToolResult(is_error=True)`;
- a server that dies or hangs fails its in-flight calls with `MCPServerUnavailable` (retryable) and
  is restarted in the background; a session whose call timed out leaves the rotation at once
  (`slots.ServerSlot.suspect`), so retries never go to a hung server;
- an unknown tool name raises `MCPToolNotFound`.

`BackgroundMCPPool` owns one `MCPClientPool` on its own event-loop thread, so sync callers and
other loops share one set of sessions and anyio cancel scopes stay out of the callers' loops.
"""

from __future__ import annotations

import asyncio
import atexit
import json
import logging
import re
import threading
from collections.abc import Sequence
from concurrent.futures import Future
from typing import Any

import anyio
from mcp.client.session import ClientSession
from mcp.shared.exceptions import MCPError
from mcp_types import CONNECTION_CLOSED, CallToolResult

from skyrl_tool_agent.config.base import default_of
from skyrl_tool_agent.config.env import EnvConfig, MCPServerConfig
from skyrl_tool_agent.mcp.slots import ServerSlot, SlotGroup
from skyrl_tool_agent.mcp.specs import (
    MCPConfigError,
    MCPPoolClosed,
    MCPPoolError,
    MCPServerUnavailable,
    MCPToolNotFound,
    ToolResult,
    ToolSpec,
)

__all__ = [
    "BackgroundMCPPool",
    "MCPClientPool",
    "MCPConfigError",
    "MCPPoolClosed",
    "MCPPoolError",
    "MCPServerUnavailable",
    "MCPToolNotFound",
    "ToolResult",
    "ToolSpec",
]

logger = logging.getLogger(__name__)


def _result_text(result: CallToolResult) -> str:
    parts = []
    for block in result.content:
        text = getattr(block, "text", None)
        parts.append(text if isinstance(text, str) else f"[{block.type} content]")
    return "\n".join(parts)


def _check_arguments(arguments: Any) -> str | None:
    """Why `arguments` cannot be sent (the SDK's writer task would die on it), or None."""
    if not isinstance(arguments, dict):
        return f"tool arguments must be a JSON object, got {type(arguments).__name__}"
    try:
        json.dumps(arguments, ensure_ascii=False).encode("utf-8")
    except (TypeError, ValueError) as exc:  # UnicodeEncodeError is a ValueError
        return f"tool arguments are not valid UTF-8 JSON: {exc}"
    return None


class MCPClientPool:
    """Pooled, self-healing MCP stdio sessions; see the module docstring. asyncio only.

    `call_timeout_s` bounds each call (overridable per call), `startup_timeout_s` each server start
    (initialize + list_tools). Use `async with MCPClientPool(...) as pool:` or start()/close().
    """

    def __init__(
        self,
        servers: Sequence[MCPServerConfig],
        *,
        call_timeout_s: float = default_of(EnvConfig, "call_timeout_s"),
        sessions_per_server: int = default_of(EnvConfig, "sessions_per_server"),
        startup_timeout_s: float = 30.0,
        ping_timeout_s: float = 5.0,
        allow_empty: bool = False,
    ) -> None:
        names = [s.name for s in servers]
        if len(set(names)) != len(names):
            raise MCPConfigError(f"duplicate server names: {sorted({n for n in names if names.count(n) > 1})}")
        if not servers and not allow_empty:  # allow_empty: a runtime whose every server is started elsewhere
            raise MCPConfigError("no MCP servers configured")
        if sessions_per_server < 1:
            raise MCPConfigError("sessions_per_server must be >= 1")
        self.servers = list(servers)
        self.call_timeout_s = call_timeout_s
        self.sessions_per_server = sessions_per_server
        self.startup_timeout_s = startup_timeout_s
        self.ping_timeout_s = ping_timeout_s
        #: Servers that report errors as text: their pattern, by server name.
        self._error_patterns = {s.name: re.compile(s.error_pattern) for s in servers if s.error_pattern}
        self._groups: dict[str, SlotGroup] = {}
        self._routes: dict[str, tuple[SlotGroup, str]] = {}  # pool tool name -> (group, server's name)
        self._tools: list[ToolSpec] = []
        self._started = False
        self._closed = False

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Start every server and build the tool routes; MCPConfigError (a server did not start in
        time, or duplicate tool names) after closing the pool again."""
        if self._started:
            return
        self._started = True
        for spec in self.servers:
            group = SlotGroup(spec)
            for i in range(self.sessions_per_server):
                group.slots.append(
                    ServerSlot(
                        spec,
                        i,
                        group,
                        startup_timeout_s=self.startup_timeout_s,
                        ping_timeout_s=self.ping_timeout_s,
                        call_timeout_s=self.call_timeout_s,
                    )
                )
            self._groups[spec.name] = group
        slots = [slot for group in self._groups.values() for slot in group.slots]
        for slot in slots:
            slot.start()
        try:
            with anyio.fail_after(self.startup_timeout_s + 5.0):
                for slot in slots:
                    await slot.first_attempt_done.wait()
            failed = [f"{s.spec.name}[{s.index}]: {s.last_error or 'not ready'}" for s in slots if s.session is None]
            if failed:
                raise MCPConfigError("MCP servers failed to start: " + "; ".join(failed))
            self._build_routes()
        except BaseException:
            await self.close()
            raise

    def _build_routes(self) -> None:
        for name, group in self._groups.items():
            listed = group.slots[0].tools or []
            for tool in listed:
                exposed = group.spec.tool_prefix + tool.name
                if exposed in self._routes:
                    other = self._routes[exposed][0].spec.name
                    raise MCPConfigError(
                        f"tool {exposed!r} is listed by servers {other!r} and {name!r}; "
                        "set tool_prefix on one of them"
                    )
                self._routes[exposed] = (group, tool.name)
                self._tools.append(
                    ToolSpec(
                        name=exposed,
                        description=tool.description or "",
                        input_schema=dict(tool.input_schema),
                        server=name,
                    )
                )

    async def close(self) -> None:
        """Stop every server (idempotent). In-flight calls fail with MCPServerUnavailable."""
        if self._closed:
            return
        self._closed = True
        slots = [slot for group in self._groups.values() for slot in group.slots]
        await asyncio.gather(*(slot.close() for slot in slots), return_exceptions=True)

    async def __aenter__(self) -> MCPClientPool:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        await self.close()

    # ------------------------------------------------------------------ calls

    @property
    def tools(self) -> list[ToolSpec]:
        """Tools of all servers (listed once at start)."""
        return list(self._tools)

    def server_pids(self) -> dict[str, list[int | None]]:
        """Current process id of every slot, per server (None while restarting); for tests/diagnostics."""
        return {name: [slot.pid for slot in group.slots] for name, group in self._groups.items()}

    async def call_tool(self, name: str, arguments: dict[str, Any], *, timeout_s: float | None = None) -> ToolResult:
        """Call tool `name`; see the module docstring for what is a result and what raises."""
        if self._closed or not self._started:
            raise MCPPoolClosed("the MCP pool is closed" if self._closed else "the MCP pool is not started")
        route = self._routes.get(name)
        if route is None:
            raise MCPToolNotFound(f"unknown tool {name!r}; available: {', '.join(self._routes)}")
        group, remote_name = route
        problem = _check_arguments(arguments)
        if problem is not None:
            return ToolResult(text=problem, is_error=True)
        timeout = self.call_timeout_s if timeout_s is None else timeout_s
        slot: ServerSlot | None = None
        session: ClientSession | None = None
        try:
            with anyio.fail_after(timeout):
                while session is None:  # a slot can break between being picked and being used
                    slot = group.pick() or await group.wait_ready()
                    session = slot.session
                result = await session.call_tool(remote_name, arguments)
        except TimeoutError:
            if slot is None or session is None:
                raise MCPServerUnavailable(
                    f"MCP server {group.spec.name!r} is restarting and did not come back within {timeout:g} s"
                ) from None
            slot.suspect(session)
            raise MCPServerUnavailable(
                f"MCP server {group.spec.name!r}: {name} got no answer within {timeout:g} s"
            ) from None
        except MCPError as exc:
            if exc.code != CONNECTION_CLOSED:
                # A protocol-level error for this request (e.g. invalid params): the caller's to read.
                return ToolResult(text=f"error: {exc}", is_error=True)
            if slot is not None and session is not None:
                slot.mark_broken("connection closed", session=session)
            raise MCPServerUnavailable(f"MCP server {group.spec.name!r} closed the connection during {name}") from exc
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError) as exc:
            if slot is not None and session is not None:
                slot.mark_broken(type(exc).__name__, session=session)
            raise MCPServerUnavailable(f"MCP server {group.spec.name!r} is unavailable: {exc!r}") from exc
        except Exception as exc:  # noqa: BLE001 - e.g. a malformed response: the server's bug, reported as a result
            logger.warning("MCP call %s on %s failed: %r", name, group.spec.name, exc)
            return ToolResult(text=f"error: {type(exc).__name__}: {exc}", is_error=True)
        text = _result_text(result)
        pattern = self._error_patterns.get(group.spec.name)
        is_error = bool(result.is_error) or (pattern is not None and pattern.search(text) is not None)
        return ToolResult(text=text, is_error=is_error)


class BackgroundMCPPool:
    """An `MCPClientPool` on its own event-loop thread (module docstring); `close()` is idempotent
    and also runs at interpreter exit."""

    def __init__(self, servers: Sequence[MCPServerConfig], **pool_kwargs: Any) -> None:
        self.pool = MCPClientPool(servers, **pool_kwargs)  # touch it only from the pool's loop (`run`, `submit`)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._tools: list[ToolSpec] | None = None
        self._lock = threading.Lock()
        self._closed = False

    def start(self) -> BackgroundMCPPool:
        """Start the loop thread and the servers (idempotent); raises what MCPClientPool.start raises."""
        with self._lock:
            if self._closed:
                raise MCPPoolClosed("the MCP pool is closed")
            if self._thread is not None:
                return self
            loop = asyncio.new_event_loop()
            thread = threading.Thread(target=loop.run_forever, name="mcp-pool-loop", daemon=True)
            thread.start()
            self._loop, self._thread = loop, thread
            atexit.register(self.close)
        try:
            self.run(self.pool.start())
        except BaseException:
            self.close()
            raise
        self._tools = self.pool.tools
        return self

    def run(self, coro: Any, timeout_s: float | None = None) -> Any:
        """Run a coroutine on the pool's loop and wait for its result (from any non-loop thread)."""
        return self.submit(coro).result(timeout_s)

    def submit(self, coro: Any) -> Future[Any]:
        """Schedule a coroutine on the pool's loop (from any thread); its future."""
        loop = self._loop
        if loop is None or self._closed:
            coro.close()
            raise MCPPoolClosed("the MCP pool is closed" if self._closed else "the MCP pool is not started")
        return asyncio.run_coroutine_threadsafe(coro, loop)

    def list_tools(self) -> list[ToolSpec]:
        """Tools of all servers (cached at start)."""
        if self._tools is None:
            raise MCPPoolClosed("the MCP pool is not started")
        return list(self._tools)

    def close(self) -> None:
        """Stop the servers and the loop thread (idempotent; leaves no child processes)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            loop, thread = self._loop, self._thread
        atexit.unregister(self.close)
        if loop is None or thread is None:
            return
        try:
            asyncio.run_coroutine_threadsafe(self.pool.close(), loop).result(timeout=30)
        except Exception as exc:  # noqa: BLE001 - closing must not raise
            logger.warning("closing the MCP pool failed: %r", exc)
        finally:
            loop.call_soon_threadsafe(loop.stop)
            thread.join(timeout=10)
            if not thread.is_alive():
                loop.close()

    def __enter__(self) -> BackgroundMCPPool:
        return self.start()

    def __exit__(self, *exc_info: Any) -> None:
        self.close()
