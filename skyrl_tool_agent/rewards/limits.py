"""Limits under which rewards run SQL inside the trainer's own process.

The reward runs the predicted SQL (and the gold) in the trainer's process, where a runaway query
would stall or balloon the trainer itself, so every scoring query runs as the server runs it:

* on a connection from `mcp_tools.sandbox.open_readonly`: the same layers (read-only URI,
  `query_only`, the allow-list authorizer) and per-operation limits (value length, checked
  printf/trim, `temp_store=MEMORY`) as the `execute_sql` tool;
* under the server's SQLite heap cap (`process_memory.set_heap_limit`, `MEMORY_LIMIT_MB`), set in
  this process on first use. Only the heap cap: an address-space limit would bound the trainer's
  own tensors too;
* with `run_query`'s deadline in CPU time of the query's thread (`clock="cpu"`), so other
  processes sharing the cores do not time a correct gold query out; a wall-clock backstop
  (`run_bounded`) bounds it whatever happens inside SQLite.

`database_fault` tells failures of the database itself (missing, unreadable, corrupt) from
failures of the query, so the caller reports an infrastructure error instead of scoring 0.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
from pathlib import Path
from typing import Any

from mcp_tools.sandbox import (
    CPU_CLOCK_WALL_FACTOR,
    QueryResult,
    SandboxConnection,
    SandboxError,
    open_readonly,
    run_query,
)
from mcp_tools.process_memory import MEMORY_LIMIT_MB, heap_limit_bytes, set_heap_limit
from skyrl_tool_agent.config.base import default_of
from skyrl_tool_agent.config.env import EnvConfig

logger = logging.getLogger(__name__)

#: A query's time limit when a caller gives none: `env.sql_timeout_s`'s default, referenced (the
#: env passes its configured value; this is for direct calls such as `rewards.score_answer`).
DEFAULT_TIMEOUT_S: float = default_of(EnvConfig, "sql_timeout_s")

#: How long past its own deadline the caller waits for a query before giving up on it.
WALL_CLOCK_GRACE_S = 1.0
#: Primary SQLite result codes that mean the database file, not the query, is the problem.
_DATABASE_FAULT_CODES = frozenset({
    sqlite3.SQLITE_IOERR, sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_CANTOPEN, sqlite3.SQLITE_NOTADB,
    sqlite3.SQLITE_NOLFS, sqlite3.SQLITE_PROTOCOL, sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED,
    sqlite3.SQLITE_PERM, sqlite3.SQLITE_FULL,
})

_heap_lock = threading.Lock()


def ensure_heap_limit() -> int:
    """Cap SQLite's heap in this process at the server's cap, once (a lower cap already set stays)."""
    with _heap_lock:
        cap = heap_limit_bytes()
        if cap is None:
            cap = set_heap_limit(MEMORY_LIMIT_MB << 20)
            logger.info("SQLite heap of this process capped at %d MiB for scoring", cap >> 20)
        return cap


def database_identity(db_path: str | Path) -> tuple[int, int, int, int] | None:
    """(device, inode, size, mtime) of the file, None if it cannot be stat'ed: changes when the
    database is replaced or rewritten, so cached gold results of the old file are not reused."""
    try:
        st = os.stat(db_path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def database_fault(error: BaseException, probe: str | Path | None = None, timeout_s: float = DEFAULT_TIMEOUT_S) -> str | None:
    """Why `error` (from `run_bounded`) is the database's fault, not the query's; else None.

    Decided by SQLite's result code, never by the message: a query can put any text in an error
    message (`SELECT * FROM "file is not a database"`), and must not pass its own failure off as ours.
    `probe`: the database file to look at when the code does not tell (a gold query that ran before
    failed): a file without any schema (truncated to 0 bytes, it opens as a new empty database) counts.
    """
    if isinstance(error, SandboxError) and error.kind == "not_found":
        return str(error)
    cause = error.__cause__ if isinstance(error, SandboxError) else error
    code = getattr(cause, "sqlite_errorcode", None)
    if isinstance(cause, sqlite3.Error) and isinstance(code, int) and code & 0xFF in _DATABASE_FAULT_CODES:
        return f"{getattr(cause, 'sqlite_errorname', code)}: {cause}"
    if probe is None or (isinstance(error, SandboxError) and error.kind == "timeout"):
        return None
    try:
        schema = run_bounded(probe, "SELECT count(*) FROM sqlite_schema", timeout_s=timeout_s, max_rows=1)
    except SandboxError as probe_error:
        return database_fault(probe_error)
    return "the file holds no tables (empty or truncated)" if schema.rows[0][0] == 0 else None


def run_bounded(db_path: str | Path, sql: str, *, timeout_s: float, max_rows: int | None,
                max_chars: int | None = None, expect_columns: int | None = None) -> QueryResult:
    """`run_query` on a fresh sandboxed connection to `db_path` under the limits above (`timeout_s`:
    CPU seconds); returns or raises SandboxError within about
    `CPU_CLOCK_WALL_FACTOR * timeout_s + WALL_CLOCK_GRACE_S`."""
    ensure_heap_limit()
    outcome: list[Any] = []
    conns: list[SandboxConnection] = []
    done = threading.Event()

    def work() -> None:
        try:
            conn = open_readonly(db_path)
            conns.append(conn)
            try:
                outcome.append(run_query(conn, sql, timeout_s=timeout_s, max_rows=max_rows, max_chars=max_chars,
                                         expect_columns=expect_columns, clock="cpu"))
            finally:
                conn.close()
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            outcome.append(exc)
        finally:
            done.set()

    threading.Thread(target=work, name="sql-scoring", daemon=True).start()
    wall_limit = CPU_CLOCK_WALL_FACTOR * timeout_s + WALL_CLOCK_GRACE_S
    if not done.wait(wall_limit):
        if conns:
            try:
                conns[0].interrupt()  # takes effect at the next VM instruction
            except sqlite3.Error:
                pass
        logger.warning("scoring query abandoned after %.1f s: %.200s", wall_limit, sql)
        raise SandboxError(f"timeout: query ran longer than {timeout_s:g} s and was abandoned", kind="timeout")
    if isinstance(outcome[0], BaseException):
        raise outcome[0]
    return outcome[0]
