"""Rows of a query result, capped and made JSON-safe: the sandbox's output side.

`fetch_capped` bounds what a query may return (rows and characters, row by row so a few huge
values never sit in memory at once); `jsonable_cell` renders a cell for the MCP tool result.
"""

from __future__ import annotations

import math
import sqlite3
from typing import Any


def _cell_chars(value: Any) -> int:
    """Characters a cell takes when rendered (bytes count as hex)."""
    if isinstance(value, str):
        return len(value)
    if isinstance(value, bytes):
        return 2 * len(value)
    return 8


def _clip_cell(value: Any, limit: int) -> Any:
    if isinstance(value, str) and len(value) > limit:
        return value[:limit] + "…"
    if isinstance(value, bytes) and 2 * len(value) > limit:
        return value[: max(limit // 2, 1)]
    return value


def fetch_capped(cur: sqlite3.Cursor, max_rows: int | None, max_chars: int | None) -> tuple[list[tuple], bool]:
    """Fetch at most `max_rows` rows and about `max_chars` characters; return (rows, truncated)."""
    if max_chars is None:
        if max_rows is None:
            return cur.fetchall(), False
        rows = cur.fetchmany(max_rows + 1)
        return (rows[:max_rows], True) if len(rows) > max_rows else (rows, False)
    # Row by row, so a few huge values never sit in memory all at once.
    rows: list[tuple] = []
    total = 0
    for row in cur:
        if max_rows is not None and len(rows) >= max_rows:
            return rows, True
        size = sum(_cell_chars(v) for v in row)
        if total + size > max_chars:
            if not rows:  # keep one (clipped) row rather than an empty answer
                rows.append(tuple(_clip_cell(v, max_chars) for v in row))
            return rows, True
        total += size
        rows.append(row)
    return rows, False


def jsonable_cell(value: Any) -> Any:
    """A cell as a JSON-safe value: BLOBs as hex strings, non-finite floats as strings."""
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


__all__ = ["fetch_capped", "jsonable_cell"]
