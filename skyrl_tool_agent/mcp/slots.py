"""One supervised MCP server process + client session (`ServerSlot`), and the slots of one spec.

A slot's supervisor task owns the server's whole life (anyio cancel scopes need one task): it opens
the session, marks the slot ready and waits until the session breaks, a health check fails or the
pool closes, then starts a new process with backoff. Callers share the live session.

The process runs through `mcp.transport`. A server that does not start is one line
(`ServerSlot.last_error`): why, its exit code, its stderr's last lines and its non-protocol stdout.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import signal
import sys
from typing import Any

import anyio
from mcp.client.session import ClientSession
from mcp_types import Tool

from mcp_tools.call_lanes import CLIENT_DEADLINE_ENV_VAR
from skyrl_tool_agent.config.env import MCPServerConfig
from skyrl_tool_agent.mcp.transport import ServerOutput, killpg, server_transport

logger = logging.getLogger(__name__)

#: Set in each server's environment: which slot started it (for diagnostics).
SLOT_ENV_VAR = "SKYRL_MCP_SLOT"
#: Parent environment variables passed on besides the SDK's safe default set (HOME, PATH, ...):
#: without them a `python -m ...` server may not import what the parent can.
PASSED_ENV_VARS = ("PYTHONPATH", "VIRTUAL_ENV")
_slot_ids = itertools.count()


class _StartFailed(Exception):
    """A server did not start; the message is the whole one-line reason."""


def _leaf(exc: BaseException) -> BaseException:
    """The first real exception inside (nested) exception groups."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


class _EofWatchingStream:
    """A session read stream that calls `on_eof` when the server's output ends (it died or exited)."""

    def __init__(self, inner: Any, on_eof: Any) -> None:
        self._inner = inner
        self._on_eof = on_eof

    async def receive(self) -> Any:
        try:
            return await self._inner.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError):
            self._on_eof()
            raise

    def __aiter__(self) -> _EofWatchingStream:
        return self

    async def __anext__(self) -> Any:
        try:
            return await self.receive()
        except anyio.EndOfStream:
            raise StopAsyncIteration from None

    async def aclose(self) -> None:
        await self._inner.aclose()

    async def __aenter__(self) -> _EofWatchingStream:
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        await self.aclose()


class ServerSlot:
    """One server process and its live `ClientSession`, restarted whenever it breaks."""

    def __init__(
        self,
        spec: MCPServerConfig,
        index: int,
        group: SlotGroup,
        *,
        startup_timeout_s: float,
        ping_timeout_s: float,
        call_timeout_s: float | None = None,
    ) -> None:
        self.spec = spec
        self.index = index
        self.group = group
        self.startup_timeout_s = startup_timeout_s
        self.ping_timeout_s = ping_timeout_s
        #: The pool's deadline for one call, told to the server (`CLIENT_DEADLINE_ENV_VAR`) so a
        #: server can answer `timeout:` itself before the client gives up (mcp_tools.call_lanes).
        self.call_timeout_s = call_timeout_s
        self.tag = f"{os.getpid()}-{next(_slot_ids)}"
        self.session: ClientSession | None = None
        self.tools: list[Tool] | None = None
        self.starts = 0  # successful starts so far
        self.last_error: str | None = None
        self.first_attempt_done = asyncio.Event()
        self._broken = asyncio.Event()
        self._stop = anyio.CancelScope()  # entered by the supervisor; close() cancels it
        self._task: asyncio.Task[None] | None = None
        self._health_task: asyncio.Task[None] | None = None
        self._suspected: ClientSession | None = None  # out of rotation until its ping answers
        self.pid: int | None = None  # the current process, from spawn until it is reaped

    def start(self) -> None:
        name = f"mcp-slot-{self.spec.name}-{self.index}"
        self._task = asyncio.get_running_loop().create_task(self._supervise(), name=name)

    async def close(self) -> None:
        """Stop the server for good. An anyio cancellation (not task.cancel()), so the SDK's
        shielded transport shutdown still reaps the process, even mid-startup or mid-backoff."""
        self._stop.cancel()
        if self._health_task is not None:
            self._health_task.cancel()
        if self._task is not None:
            await asyncio.shield(self._task)

    def mark_broken(self, reason: str, *, session: ClientSession | None = None, kill: bool = False) -> None:
        """Tear this session down and start a fresh server (no-op if already restarting); with
        `session`, only if that is still the live one. `kill` SIGKILLs first (a hung server would
        hold the restart for the SDK's shutdown grace periods)."""
        if session is not None and session is not self.session:
            return
        if self.session is not None and not self._broken.is_set():
            logger.warning("MCP server %s[%d] restarting: %s", self.spec.name, self.index, reason)
            self.session = None
            self.group.changed()
            if kill:
                self._kill()
        self._broken.set()

    def _kill(self) -> None:
        if (pid := self.pid) is not None:
            killpg(pid, signal.SIGKILL)  # the server leads its own group (mcp.transport)

    @property
    def in_rotation(self) -> bool:
        """Serving, and not out of rotation after a timeout (see `suspect`)."""
        return self.session is not None and self.session is not self._suspected

    def suspect(self, session: ClientSession) -> None:
        """A call on `session` timed out: out of rotation at once (retries would otherwise go to a hung
        server), pinged in the background; it comes back if the ping answers, else is restarted."""
        if session is not self.session or self._suspected is session:
            return
        self._suspected = session
        logger.warning("MCP server %s[%d] out of rotation: a call timed out; pinging it", self.spec.name, self.index)
        self._health_task = asyncio.get_running_loop().create_task(self._health_check(session))

    async def _health_check(self, session: ClientSession) -> None:
        try:
            with anyio.fail_after(self.ping_timeout_s):
                await session.send_ping()
        except Exception as exc:  # noqa: BLE001 - any failure means the session is unusable
            reason = f"no answer to ping within {self.ping_timeout_s:g} s ({type(exc).__name__})"
            self.mark_broken(reason, session=session, kill=True)
        else:
            logger.info("MCP server %s[%d] answered a ping: back in rotation", self.spec.name, self.index)
        finally:
            if self._suspected is session:
                self._suspected = None
            self.group.changed()  # wake calls waiting for a slot

    def _env(self) -> dict[str, str]:
        env = {k: os.environ[k] for k in PASSED_ENV_VARS if k in os.environ}
        env.update(self.spec.env or {})
        env[SLOT_ENV_VAR] = self.tag
        if self.call_timeout_s is not None:
            env.setdefault(CLIENT_DEADLINE_ENV_VAR, f"{self.call_timeout_s:g}")  # a spec's own value wins
        return env

    async def _supervise(self) -> None:
        backoff = 0.2
        with self._stop:
            while True:
                self._broken.clear()
                try:
                    await self._serve_once()
                    backoff = 0.2
                except Exception as exc:  # noqa: BLE001 - a broken server must never kill the supervisor
                    leaf = _leaf(exc)
                    self.last_error = str(leaf) if isinstance(leaf, _StartFailed) else f"{type(leaf).__name__}: {leaf}"
                    logger.warning("MCP server %s[%d] failed: %s", self.spec.name, self.index, self.last_error)
                finally:
                    self.session = None
                    self.group.changed()
                    self.first_attempt_done.set()
                await anyio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)

    async def _serve_once(self) -> None:
        output = ServerOutput(f"{self.spec.name}[{self.index}]", sys.__stderr__ or sys.stderr)
        failure: str | None = None
        try:
            async with server_transport(self.spec.command, list(self.spec.args), env=self._env(), cwd=self.spec.cwd,
                                        output=output) as (read_stream, write_stream):
                self.pid = output.pid
                watched = _EofWatchingStream(read_stream, lambda: self.mark_broken("server output ended"))
                async with ClientSession(watched, write_stream) as session:
                    try:
                        with anyio.fail_after(self.startup_timeout_s):
                            await session.initialize()
                            # Listing once also fills the session's output-schema cache, so call_tool
                            # never lists tools again on its own.
                            self.tools = list((await session.list_tools()).tools)
                    except TimeoutError:
                        self._kill()  # unresponsive: skip the shutdown grace periods
                        failure = f"no answer to initialize within {self.startup_timeout_s:g} s"
                    except Exception as exc:  # noqa: BLE001 - exited, or refused the handshake: one line below
                        leaf = _leaf(exc)
                        failure = f"the handshake failed ({type(leaf).__name__}: {leaf})"
                    if failure is None and not self._broken.is_set():
                        output.started()
                        self.session = session
                        self.starts += 1
                        self.last_error = None
                        self.group.changed()
                        self.first_attempt_done.set()
                        try:
                            await self._broken.wait()
                        finally:
                            self.session = None  # before the contexts close (their EOF is no news)
        except OSError as exc:  # the command itself cannot run
            raise _StartFailed(f"cannot run {self.spec.command!r}: {exc.strerror or exc}") from None
        finally:
            self.pid = None
        if failure is not None:
            if failure.startswith("no answer"):
                output.returncode = None  # killed by us: its code says nothing
            elif output.returncode is not None and "Connection closed" in failure:
                failure = "exited before answering initialize"
            raise _StartFailed(f"{failure}; {output.describe()}")


class SlotGroup:
    """The slots of one server spec; hands out ready slots round-robin."""

    def __init__(self, spec: MCPServerConfig) -> None:
        self.spec = spec
        self.slots: list[ServerSlot] = []
        self._next = 0
        self._changed = asyncio.Event()

    def changed(self) -> None:
        """Wake everyone waiting for a slot state change."""
        self._changed.set()
        self._changed = asyncio.Event()

    def pick(self) -> ServerSlot | None:
        """Next slot in rotation (round-robin), or None if all are restarting or suspected."""
        n = len(self.slots)
        for k in range(n):
            slot = self.slots[(self._next + k) % n]
            if slot.in_rotation:
                self._next = (self._next + k + 1) % n
                return slot
        return None

    async def wait_ready(self) -> ServerSlot:
        """A ready slot, waiting for a restart if needed (callers bound this with a timeout)."""
        while (slot := self.pick()) is None:
            await self._changed.wait()
        return slot
