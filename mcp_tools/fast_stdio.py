"""A lower-overhead stdio transport for MCP servers: same wire format as `mcp.server.stdio`.

The SDK's `stdio_server` reads stdin and writes stdout through `anyio.wrap_file`, i.e. one
worker-thread hop per request line and two per response (write, flush); on a 2-core machine that
was most of the server's ~550 us of CPU per call. This transport uses asyncio's non-blocking pipe
transports instead (no threads). Like the SDK it moves the wire off fds 0/1 first (fd 0 -> null
device, fd 1 -> stderr), so a stray print in a tool cannot corrupt the protocol stream.

It also survives input the SDK transport would die on, and answers every request it can read: an
over-long line is skipped and answered with INVALID_REQUEST (for the id in its first 4 kB, else
null); a JSON-RPC batch gets INVALID_REQUEST for each request in it (MCP takes no batches); a request with a lone-surrogate escape
("\ud800", which pydantic's JSON parser rejects but JSON allows) is parsed by Python's json and
served (a request that is still not valid JSON-RPC gets a JSON-RPC error for its id); a response
that cannot be encoded (a lone surrogate echoed back) is sent with U+FFFD in its place. When stdin ends,
requests already read are still answered (for up to `DRAIN_ON_EOF_S`) before the server stops, so
`cat requests.jsonl | python -m mcp_tools.sqlite_server ...` gets every answer.

Falls back to the SDK transport when stdin/stdout are not pipes (e.g. a regular file).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import stat
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import mcp_types as types
from mcp.server.stdio import stdio_server
from mcp.shared.message import SessionMessage

logger = logging.getLogger(__name__)

#: Longest accepted request line (bytes); the sandbox caps SQL far below this.
MAX_LINE_BYTES = 8 * 1024 * 1024
#: After stdin ends, how long requests already read may still finish and be answered.
DRAIN_ON_EOF_S = 5.0


class _OpenRequests:
    """Ids of client requests read but not yet answered, so stdin EOF can wait for their answers."""

    def __init__(self) -> None:
        self.ids: set[Any] = set()
        self.idle = anyio.Event()
        self.idle.set()

    def opened(self, message: Any) -> None:
        if isinstance(message, types.JSONRPCRequest):
            if self.idle.is_set():
                self.idle = anyio.Event()
            self.ids.add(message.id)

    def answered(self, message: Any) -> None:
        if isinstance(message, types.JSONRPCResponse | types.JSONRPCError) and self.ids:
            self.ids.discard(message.id)
            if not self.ids:
                self.idle.set()


def _is_stream_fd(fd: int) -> bool:
    mode = os.fstat(fd).st_mode
    return stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode) or stat.S_ISCHR(mode)


class OverlongLine(Exception):
    """A request line over `MAX_LINE_BYTES`, skipped; `head` is its first bytes (for its id)."""

    def __init__(self, head: bytes) -> None:
        super().__init__("request line too long; skipped")
        self.head = head


_ID_IN_HEAD = re.compile(rb'"id"\s*:\s*(-?\d{1,18}|"(?:[^"\\]|\\.){0,200}")')


def _overlong_error(head: bytes) -> types.JSONRPCError:
    """The answer to a skipped over-long line: INVALID_REQUEST for the id found in its first bytes
    (null if none is there)."""
    match = _ID_IN_HEAD.search(head)
    request_id: Any = None
    if match:
        try:
            request_id = json.loads(match.group(1))
        except ValueError:
            request_id = None
    return types.JSONRPCError(jsonrpc="2.0", id=_scrub(request_id), error=types.ErrorData(
        code=types.INVALID_REQUEST, message=f"request line longer than {MAX_LINE_BYTES} bytes"))


async def _read_line(reader: asyncio.StreamReader) -> bytes | OverlongLine | None:
    """Next line (without requiring the newline at EOF); None at EOF; OverlongLine for a skipped
    over-long line."""
    try:
        return await reader.readuntil(b"\n")
    except asyncio.IncompleteReadError as exc:
        return exc.partial or None
    except asyncio.LimitOverrunError as exc:
        # Drop the whole line: consume what is buffered, then keep going until its newline.
        head = (await reader.readexactly(exc.consumed))[:4096]
        while True:
            try:
                await reader.readuntil(b"\n")
                return OverlongLine(head)
            except asyncio.IncompleteReadError:
                return None
            except asyncio.LimitOverrunError as more:
                await reader.readexactly(more.consumed)


_SURROGATE = re.compile("[\ud800-\udfff]")


def _scrub(value: Any) -> Any:
    """`value` (JSON data) with every lone surrogate replaced by U+FFFD, so it encodes as UTF-8."""
    if isinstance(value, str):
        return _SURROGATE.sub("\ufffd", value)
    if isinstance(value, dict):
        return {_scrub(k): _scrub(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_scrub(v) for v in value]
    return value


def _encode(message: types.JSONRPCMessage) -> bytes:
    """The message as one JSON line; lone surrogates (echoed input) become U+FFFD."""
    try:
        return message.model_dump_json(by_alias=True, exclude_unset=True).encode("utf-8") + b"\n"
    except Exception as exc:  # noqa: BLE001 - e.g. PydanticSerializationError on a lone surrogate
        logger.info("outgoing message is not valid UTF-8 (%s); replacing lone surrogates", exc)
    try:
        data = _scrub(message.model_dump(mode="json", by_alias=True, exclude_unset=True))
        return json.dumps(data, ensure_ascii=False, separators=(",", ":")).encode("utf-8") + b"\n"
    except Exception as exc:  # noqa: BLE001 - last resort: an error for the request, if it is one
        logger.warning("could not encode an outgoing message: %s", exc)
    request_id: Any = getattr(message, "id", None)
    if request_id is None:
        return b""
    error = types.JSONRPCError(
        jsonrpc="2.0",
        id=_scrub(request_id),
        error=types.ErrorData(code=types.INTERNAL_ERROR, message="response could not be encoded as UTF-8 JSON"),
    )
    return error.model_dump_json(by_alias=True, exclude_unset=True).encode("utf-8") + b"\n"


def _batch_errors(batch: list[Any]) -> list[types.JSONRPCError]:
    """INVALID_REQUEST for each request id in `batch` (at most 100), or one with a null id."""
    ids = [m["id"] for m in batch[:100] if isinstance(m, dict) and "method" in m
           and isinstance(m.get("id"), int | str) and not isinstance(m.get("id"), bool)]
    message = "JSON-RPC batches are not supported: send one request per line"
    return [types.JSONRPCError(jsonrpc="2.0", id=_scrub(i), error=types.ErrorData(code=types.INVALID_REQUEST,
                                                                                   message=message))
            for i in (ids or [None])]


def _parse(line: bytes) -> SessionMessage | types.JSONRPCError | list[types.JSONRPCError] | Exception:
    """A request line as a message for the session, an error to send back, or the parse failure.

    pydantic's JSON parser rejects lone-surrogate escapes that JSON allows ("\ud800"); such a
    request used to be dropped, and its client waited for its own timeout. Python's json reads
    them; the tools then refuse the text with a clear message.
    """
    text = line.decode("utf-8", errors="replace")  # as the SDK transport does
    try:
        return SessionMessage(types.jsonrpc_message_adapter.validate_json(text, by_name=False))
    except Exception as exc:  # noqa: BLE001 - tried again below
        failure: Exception = exc
    try:
        data = json.loads(text)
    except Exception:  # noqa: BLE001 - not JSON at all (RecursionError for "[[[[...", too)
        # No request id to answer; JSON-RPC's answer to unparsable input has a null id.
        return types.JSONRPCError(
            jsonrpc="2.0", id=None, error=types.ErrorData(code=types.PARSE_ERROR, message="parse error: invalid JSON")
        )
    if isinstance(data, list):  # a JSON-RPC batch: MCP does not take them (2025-06-18 dropped batching)
        return _batch_errors(data)
    try:
        return SessionMessage(types.jsonrpc_message_adapter.validate_python(data, by_name=False))
    except Exception as exc:  # noqa: BLE001 - valid JSON, not a valid message: answer it if it is a request
        logger.info("invalid JSON-RPC message: %.200s", exc)
    request_id = data.get("id") if isinstance(data, dict) and "method" in data else None
    if isinstance(request_id, int | str) and not isinstance(request_id, bool):
        return types.JSONRPCError(
            jsonrpc="2.0",
            id=_scrub(request_id),
            error=types.ErrorData(code=types.INVALID_REQUEST, message="invalid JSON-RPC request"),
        )
    return failure


@asynccontextmanager
async def fast_stdio_server() -> AsyncIterator[tuple[Any, Any]]:
    """(read_stream, write_stream) for `Server.run`, served over this process's stdin/stdout."""
    if not (_is_stream_fd(0) and _is_stream_fd(1)):
        async with stdio_server() as streams:
            yield streams
        return

    loop = asyncio.get_running_loop()
    wire_in, wire_out = os.dup(0), os.dup(1)
    null_fd = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null_fd, 0)
    os.close(null_fd)
    os.dup2(2, 1)

    reader = asyncio.StreamReader(limit=MAX_LINE_BYTES)
    read_transport, _ = await loop.connect_read_pipe(
        lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(wire_in, "rb", buffering=0)
    )
    write_transport, write_protocol = await loop.connect_write_pipe(
        asyncio.streams.FlowControlMixin, os.fdopen(wire_out, "wb", buffering=0)
    )
    writer = asyncio.StreamWriter(write_transport, write_protocol, None, loop)

    read_send, read_recv = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    write_send, write_recv = anyio.create_memory_object_stream[SessionMessage](0)
    open_requests = _OpenRequests()

    async def stdin_reader() -> None:
        async with read_send:
            await _read_messages()
            # EOF: closing the read stream ends the session and cancels handlers still running.
            with anyio.move_on_after(DRAIN_ON_EOF_S):
                await open_requests.idle.wait()

    async def _read_messages() -> None:
        while (line := await _read_line(reader)) is not None:
            if isinstance(line, OverlongLine):  # answered, so its client does not wait for its timeout
                try:
                    await write_send.send(SessionMessage(_overlong_error(line.head)))
                except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                    return
                continue
            if not line.strip():
                continue
            parsed = _parse(line)
            if isinstance(parsed, list):  # errors for a batch: one per request in it
                try:
                    for error in parsed:
                        await write_send.send(SessionMessage(error))
                except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                    return
            elif isinstance(parsed, types.JSONRPCError):
                try:
                    await write_send.send(SessionMessage(parsed))
                except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                    return  # shutting down
            elif isinstance(parsed, Exception):
                await read_send.send(parsed)  # reported to the session, like the SDK transport
            else:
                open_requests.opened(parsed.message)
                await read_send.send(parsed)

    writer_done = anyio.Event()

    async def stdout_writer() -> None:
        try:
            async with write_recv:
                async for session_message in write_recv:
                    message = session_message.message
                    data = _encode(message)
                    if data:
                        writer.write(data)
                        await writer.drain()
                    open_requests.answered(message)
        except (BrokenPipeError, ConnectionResetError):
            logger.info("client closed stdout; dropping further output")
        finally:
            writer_done.set()

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(stdin_reader)
            tg.start_soon(stdout_writer)
            try:
                yield read_recv, write_send
            finally:
                write_send.close()  # the writer flushes what is queued, then ends
                with anyio.move_on_after(1.0, shield=True):
                    await writer_done.wait()
                tg.cancel_scope.cancel()
    finally:
        read_transport.close()
        write_transport.close()
