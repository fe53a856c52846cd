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
        return value[: max(limit // 2, 0)]
    return value


def _clip_row(row: tuple, budget: int) -> tuple:
    """`row` with its text/BLOB values clipped so the whole row renders in about `budget` characters.

    Values are clipped left to right from one shared budget (not `budget` each: 2,000 columns of
    8,000 characters came back whole, 16 MB, when each value had the full budget to itself).
    """
    out = []
    left = budget
    for value in row:
        clipped = _clip_cell(value, max(left, 0))
        left -= _cell_chars(clipped)
        out.append(clipped)
    return tuple(out)


def fetch_capped(
    cur: sqlite3.Cursor, max_rows: int | None, max_chars: int | None, max_columns: int | None = None
) -> tuple[list[tuple], bool]:
    """Fetch at most `max_rows` rows of at most `max_columns` values and about `max_chars` characters.

    Returns (rows, truncated); cutting columns alone does not set `truncated` (the caller knows).
    """
    if max_chars is None:
        if max_rows is None:
            rows = cur.fetchall()
            truncated = False
        else:
            rows = cur.fetchmany(max_rows + 1)
            rows, truncated = (rows[:max_rows], True) if len(rows) > max_rows else (rows, False)
        return ([row[:max_columns] for row in rows] if max_columns is not None else rows), truncated
    # Row by row, so a few huge values never sit in memory all at once.
    rows: list[tuple] = []
    total = 0
    for row in cur:
        if max_rows is not None and len(rows) >= max_rows:
            return rows, True
        if max_columns is not None:
            row = row[:max_columns]
        size = sum(_cell_chars(v) for v in row)
        if total + size > max_chars:
            if not rows:  # keep one (clipped) row rather than an empty answer
                rows.append(_clip_row(row, max_chars))
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
