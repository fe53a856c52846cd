"""The stdio transport to one MCP server process, with what the SDK's `stdio_client` does not keep.

Like `mcp.client.stdio.stdio_client` (newline-delimited JSON-RPC over the server's stdin/stdout, the
server in a process group of its own, shutdown by closing stdin, then SIGTERM, then SIGKILL to the
group), and besides:

- the process group is registered with the run's watchdog (`mcp.reaper`), so it dies with this
  process however this process dies;
- stdout lines that are not MCP protocol are counted, the first logged once (not a traceback each);
- stderr is held while the server starts (`ServerOutput.describe`), then passed on to `errlog`;
- the exit code is kept (`ServerOutput.returncode`).
"""

from __future__ import annotations

import logging
import os
import signal
from collections import deque
from collections.abc import AsyncGenerator
from contextlib import asynccontextmanager, suppress
from pathlib import Path
from typing import Any, TextIO

import anyio
import anyio.lowlevel
import mcp_types as types
from anyio.abc import Process
from anyio.streams.text import TextReceiveStream
from mcp.client.stdio import get_default_environment
from mcp.shared.message import SessionMessage

from skyrl_tool_agent.mcp.reaper import run_reaper

logger = logging.getLogger(__name__)

#: Lines of a server's stderr kept to explain a failed start (a Python traceback's last frame and
#: its error).
STDERR_TAIL_LINES = 3
#: Characters of one line shown in a message (a line can be megabytes).
SHOWN_CHARS = 200
#: stderr lines held while a server starts; passed on once it answers (older ones are counted).
HELD_STDERR_LINES = 200
#: Seconds for the server to exit after its stdin closes, then after SIGTERM.
EXIT_GRACE_S = 2.0


def _shown(line: str) -> str:
    return repr(line if len(line) <= SHOWN_CHARS else line[:SHOWN_CHARS] + "...")


class ServerOutput:
    """What one server process printed besides the protocol, and how it ended."""

    def __init__(self, label: str, errlog: TextIO) -> None:
        self.label = label
        self.errlog = errlog
        self.pid: int | None = None
        self.returncode: int | None = None
        self.stderr_tail: deque[str] = deque(maxlen=STDERR_TAIL_LINES)
        self.bad_lines = 0
        self.first_bad_line: str | None = None
        self._held: deque[str] | None = deque(maxlen=HELD_STDERR_LINES)  # None once the server started
        self._held_dropped = 0

    def bad_line(self, line: str) -> None:
        self.bad_lines += 1
        if self.bad_lines == 1:
            self.first_bad_line = line
            logger.warning("MCP server %s printed a line on stdout that is not MCP protocol: %s (stdout is the "
                           "protocol channel: a server logs to stderr; further such lines are counted, not shown)",
                           self.label, _shown(line))

    def stderr_line(self, line: str) -> None:
        self.stderr_tail.append(line)
        if self._held is not None:
            if len(self._held) == self._held.maxlen:
                self._held_dropped += 1
            self._held.append(line)
            return
        self._write(line)

    def _write(self, line: str) -> None:
        with suppress(OSError, ValueError):
            self.errlog.write(line + "\n")
            self.errlog.flush()

    def started(self) -> None:
        """The server answered: pass on what it printed while starting, and the rest as it comes."""
        held, self._held = self._held, None
        if self._held_dropped:
            self._write(f"[{self.label}: {self._held_dropped} earlier stderr lines not shown]")
        for line in held or ():
            self._write(line)

    def describe(self) -> str:
        """How the process ended and what it printed: the detail of a one-line start failure."""
        parts = [] if self.returncode is None else [f"exit code {self.returncode}"]
        parts.append(("its stderr ends: " + " | ".join(_shown(line) for line in self.stderr_tail)) if self.stderr_tail
                     else "nothing on stderr")
        if self.bad_lines:
            parts.append(f"{self.bad_lines} non-protocol line(s) on stdout, the first {_shown(self.first_bad_line or '')}")
        return "; ".join(parts)

    def summary(self) -> str | None:
        """The count of non-protocol stdout lines, when there were any (logged when the process ends)."""
        if not self.bad_lines:
            return None
        return f"MCP server {self.label} printed {self.bad_lines} non-protocol line(s) on stdout (first: " \
               f"{_shown(self.first_bad_line or '')})"


async def _wait_exit(process: Process, timeout: float) -> bool:
    """Whether the process exited within `timeout` (polling: `wait()` also waits for pipe EOF)."""
    with anyio.move_on_after(timeout):
        while process.returncode is None:
            await anyio.sleep(0.01)
    return process.returncode is not None


def killpg(pgid: int, sig: int) -> None:
    with suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


async def _stop(process: Process) -> None:
    """Close stdin, then SIGTERM, then SIGKILL the process group (the MCP shutdown sequence)."""
    with suppress(OSError, anyio.BrokenResourceError, anyio.ClosedResourceError):
        if process.stdin is not None:
            await process.stdin.aclose()
    if await _wait_exit(process, EXIT_GRACE_S):
        killpg(process.pid, signal.SIGKILL)  # children it left behind
        return
    killpg(process.pid, signal.SIGTERM)
    if not await _wait_exit(process, EXIT_GRACE_S):
        killpg(process.pid, signal.SIGKILL)
        await _wait_exit(process, EXIT_GRACE_S)


@asynccontextmanager
async def server_transport(
    command: str, args: list[str], *, env: dict[str, str] | None, cwd: str | Path | None, output: ServerOutput
) -> AsyncGenerator[tuple[Any, Any], None]:
    """Spawn the server and yield the session's (read_stream, write_stream); `output` records the rest.

    Raises OSError when the command cannot be spawned."""
    process = await anyio.open_process([command, *args], env=get_default_environment() | (env or {}), cwd=cwd,
                                       start_new_session=True)
    reaper = run_reaper()
    reaper.register(process.pid)
    output.pid = process.pid
    read_writer, read_stream = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    write_stream, write_reader = anyio.create_memory_object_stream[SessionMessage](0)
    writer_done = anyio.Event()

    async def stdout_reader() -> None:
        assert process.stdout is not None
        stdout = TextReceiveStream(process.stdout, encoding="utf-8", errors="replace")
        try:
            async with read_writer:
                buffer = ""
                async for chunk in stdout:
                    lines = (buffer + chunk).split("\n")
                    buffer = lines.pop()
                    for line in lines:
                        if not line.strip():
                            continue
                        try:
                            message = types.jsonrpc_message_adapter.validate_json(line, by_name=False)
                        except ValueError:
                            output.bad_line(line)
                            continue
                        await read_writer.send(SessionMessage(message))
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, ConnectionError, OSError):
            pass  # shutting down, or the session is gone: it sees the stream close
        finally:
            with anyio.CancelScope(shield=True), suppress(Exception):
                while True:  # drain: a server blocked writing stdout cannot exit
                    await process.stdout.receive()

    async def stderr_reader() -> None:
        assert process.stderr is not None
        buffer = ""
        with suppress(anyio.ClosedResourceError, anyio.BrokenResourceError, anyio.EndOfStream, OSError):
            async for chunk in TextReceiveStream(process.stderr, encoding="utf-8", errors="replace"):
                lines = (buffer + chunk).split("\n")
                buffer = lines.pop()
                for line in lines:
                    output.stderr_line(line.rstrip("\r"))
        if buffer:
            output.stderr_line(buffer)

    async def stdin_writer() -> None:
        assert process.stdin is not None
        try:
            async with write_reader:
                async for message in write_reader:
                    data = message.message.model_dump_json(by_alias=True, exclude_unset=True) + "\n"
                    await process.stdin.send(data.encode("utf-8"))
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
            await read_writer.aclose()  # the session sees the connection end, not a hung request
        finally:
            writer_done.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(stdout_reader)
        tg.start_soon(stderr_reader)
        tg.start_soon(stdin_writer)
        try:
            yield read_stream, write_stream
        finally:
            with anyio.CancelScope(shield=True):
                read_stream.close()
                write_stream.close()
                with anyio.move_on_after(0.5):
                    await writer_done.wait()
                await _stop(process)
                output.returncode = process.returncode
                reaper.unregister(process.pid)
                for stream in (process.stdout, process.stderr):
                    with suppress(Exception):
                        if stream is not None:
                            await stream.aclose()
                for resource in (read_stream, write_stream, read_writer, write_reader):
                    await resource.aclose()
                if (summary := output.summary()) is not None:
                    logger.warning(summary)
            tg.cancel_scope.cancel()
    await anyio.lowlevel.cancel_shielded_checkpoint()
