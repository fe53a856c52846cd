"""How large a tool's answer may be, for every server of ours: what one response may weigh.

A small model reads each result, and the MCP client reads each response line whole and parses it
in one piece: through the SDK's stdio client a 4 / 8 / 16 / 32 MB result took 0.37 / 1.16 / 3.57 /
13.91 s to arrive (its line buffer is copied once per 64 KiB read), and a one-file family's tool
returning one grew its run to 742 MB. So a server measures a result before it is serialized and
sent, and answers one over `MAX_RESPONSE_BYTES` with a short error the model reads instead.

* `MAX_RESPONSE_BYTES`: the cap, on the JSON (ASCII-escaped) encoding of a result's content and
  structured parts together; `json_size` counts a value that way.
* `too_long(value)`: whether a value's characters alone pass the cap (its JSON encoding has at
  least one byte per character, item and entry), found without converting or encoding it and
  without walking a long list to its end: a server asks this of a tool's raw return value first;
* `result_size`: the size of a whole `CallToolResult`, or None when it is over the cap;
* `capped_result`: the result, or the `too large:` error result (`too_large_result`) in its place.
* `MAX_ERROR_CHARS`: the longest error text of a call (an error may quote the caller's input, or
  a tool's exception its own huge value).
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from typing import Any

from mcp_types import CallToolResult, TextContent

from mcp_tools.sandbox_limits import MAX_ECHO_CHARS, clip_echo

#: Largest response of a tool: its text and structured parts together, JSON-encoded.
MAX_RESPONSE_BYTES = 64 * 1024
#: Longest error text of a tool call (the SDK's own messages quote the tool name and arguments).
MAX_ERROR_CHARS = 4 * MAX_ECHO_CHARS

__all__ = ["MAX_ERROR_CHARS", "MAX_RESPONSE_BYTES", "capped_result", "clip_error", "json_size", "result_size",
           "too_large_result", "too_long"]


def json_size(value: Any) -> int:
    """Bytes of `value` as compact JSON with every non-ASCII character escaped (a conservative
    measure of the wire size: control and non-ASCII characters count at their escaped length)."""
    return len(json.dumps(value, ensure_ascii=True, separators=(",", ":")))


def too_long(value: Any, limit: int = MAX_RESPONSE_BYTES) -> bool:
    """Whether `value` (plain data: str, bytes, numbers, lists, dicts; anything else counts one)
    surely encodes to more than `limit` bytes of JSON: its strings, keys and bytes have more
    characters, items and entries together, counted only until they pass `limit`."""
    return _chars_at_least(value, limit) > limit


def _chars_at_least(value: Any, budget: int) -> int:
    """Characters of the strings, keys and bytes in `value` plus one per item, entry and other
    value, counted only until they pass `budget` (a lower bound of its JSON size). Containers are
    walked lazily, so a 10 M-item list costs `budget` steps, not a copy of its items."""
    total = 0
    pending: list[Iterator[Any]] = [iter((value,))]
    while pending and total <= budget:
        item = next(pending[-1], _END)
        if item is _END:
            pending.pop()
        elif isinstance(item, str | bytes):
            total += len(item)
        elif isinstance(item, dict):
            total += len(item)  # a separator at least per entry
            pending.append(itertools.chain.from_iterable(item.items()))
        elif isinstance(item, list | tuple):
            total += len(item)
            pending.append(iter(item))
        else:
            total += 1
    return total


_END = object()


def _parts(result: CallToolResult) -> list[Any]:
    """The result's parts as plain values: each content block's fields, and the structured part."""
    parts: list[Any] = []
    for block in result.content:
        if isinstance(block, TextContent):
            parts.append(block.text)  # no copy of a large text
        else:
            parts.append(block.model_dump(mode="json", by_alias=True, exclude_none=True))
    if result.structured_content is not None:
        parts.append(result.structured_content)
    return parts


def result_size(result: CallToolResult, limit: int = MAX_RESPONSE_BYTES) -> int | None:
    """`json_size` of the result's parts together; None when that is over `limit` (found out from
    their characters, before any encoding, for a result far over it)."""
    parts = _parts(result)
    if too_long(parts, limit):
        return None
    size = json_size(parts)
    return size if size <= limit else None


def capped_result(result: CallToolResult, what: str, limit: int = MAX_RESPONSE_BYTES) -> CallToolResult:
    """`result`, or in its place an error result saying `what` returned more than `limit` bytes.

    An error result passes as it is when it fits, else its text is clipped (the model still reads
    what went wrong).
    """
    if result_size(result, limit) is not None:
        return result
    if result.is_error:
        text = "\n".join(getattr(block, "text", "") for block in result.content)
        return CallToolResult(content=[TextContent(type="text", text=clip_error(text))], is_error=True)
    return too_large_result(what, limit)


def too_large_result(what: str, limit: int = MAX_RESPONSE_BYTES) -> CallToolResult:
    """The error result the model reads in place of a result of `what` over `limit` bytes."""
    message = (f"too large: {what} returned more than {limit:,} bytes, the most a tool result may be; "
               "ask for less (a narrower question, fewer items)")
    return CallToolResult(content=[TextContent(type="text", text=message)], is_error=True)


def clip_error(text: str) -> str:
    """An error text cut to `MAX_ERROR_CHARS`, with a note of its real length."""
    return clip_echo(text, MAX_ERROR_CHARS)
