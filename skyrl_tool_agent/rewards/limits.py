"""Limits under which rewards run SQL inside the trainer's own process.

The MCP server runs model SQL in a child process the pool can kill; the reward runs the same
predicted SQL (and the gold) locally, where a runaway query stalls or balloons the trainer itself
(issue 17 #7: `printf('%.*c', 2147483647, 'x')` stalled `score_answer` for 10 s, and a
`json_group_array` over an endless recursive CTE took the trainer to 2.07 GB). So every scoring
query runs

* on a connection opened here (`open_for_scoring`) with the sandbox's layers (read-only URI,
  `query_only`, an allow-list authorizer, no ATTACH, no extensions) and its limits: 32 kB per
  value (`SQLITE_LIMIT_LENGTH`), SQL length, LIKE pattern and program size, `temp_store=MEMORY`
  (sorters and temp b-trees count against the heap cap instead of writing temp files), and a
  printf/format that refuses widths/precisions beyond the length limit (SQLite 3.40 repeats `%c`
  `precision` times inside one VM instruction, with no limit check);
* under a process-wide SQLite heap cap (`PRAGMA hard_heap_limit` 256 MiB, soft limit 3/4 of it),
  set on first use and only ever lowered, so aggregate buffers and sorters fail with SQLITE_NOMEM
  instead of growing;
* with `run_query`'s progress-handler deadline plus a wall-clock bound (`run_bounded`): the query
  runs on a worker thread and the caller gets a timeout at `timeout_s + WALL_CLOCK_GRACE_S`
  whatever happens inside SQLite (a single VM instruction never reaches the progress handler);
  the worker is interrupted and left to finish and close its connection on its own.

Self-contained on purpose (the server's sandbox is hardened separately): from `mcp_tools.sandbox`
it uses `run_query`, `SandboxConnection`, `SandboxError` and, when present, its constants.

`database_fault` tells failures of the database itself (missing, unreadable, corrupt) from
failures of the query, so the caller reports an infrastructure error instead of scoring 0.
"""

from __future__ import annotations

import logging
import math
import os
import re
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mcp_tools import sandbox
from mcp_tools.sandbox import QueryResult, SandboxConnection, SandboxError, run_query

logger = logging.getLogger(__name__)

MAX_VALUE_BYTES: int = getattr(sandbox, "MAX_VALUE_BYTES", 32_768)
MAX_SQL_CHARS: int = getattr(sandbox, "MAX_SQL_CHARS", 100_000)
MAX_LIKE_PATTERN: int = getattr(sandbox, "MAX_LIKE_PATTERN", 1_000)
MAX_VDBE_OPS: int = getattr(sandbox, "MAX_VDBE_OPS", 250_000)
ALLOWED_PRAGMAS: frozenset[str] = frozenset(
    getattr(sandbox, "ALLOWED_PRAGMAS", {"table_info", "table_xinfo", "index_list", "index_info", "index_xinfo",
                                         "foreign_key_list"}))
DENIED_FUNCTIONS: frozenset[str] = frozenset(
    getattr(sandbox, "DENIED_FUNCTIONS", {"load_extension", "fts3_tokenizer", "readfile", "writefile", "edit"}))
#: SQLite heap cap of a process that scores (the tool server's default cap).
SCORING_HEAP_LIMIT_BYTES = 256 << 20
#: How long past its own deadline the caller waits for a query before giving up on it.
WALL_CLOCK_GRACE_S = 1.0
#: Primary SQLite result codes that mean the database file, not the query, is the problem.
_DATABASE_FAULT_CODES = frozenset({
    sqlite3.SQLITE_IOERR, sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_CANTOPEN, sqlite3.SQLITE_NOTADB,
    sqlite3.SQLITE_NOLFS, sqlite3.SQLITE_PROTOCOL, sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED,
    sqlite3.SQLITE_PERM, sqlite3.SQLITE_FULL,
})

_heap_lock = threading.Lock()
_heap_cap: int | None = None
abandoned_queries = 0  # queries the wall-clock bound gave up on in this process (diagnostics)


def ensure_heap_limit(limit_bytes: int = SCORING_HEAP_LIMIT_BYTES) -> int:
    """Cap SQLite's heap for this process (once; the PRAGMA only ever lowers it); returns the cap."""
    global _heap_cap
    with _heap_lock:
        if _heap_cap is None:
            conn = sqlite3.connect(":memory:")
            try:
                (hard,) = conn.execute(f"PRAGMA hard_heap_limit={int(limit_bytes)}").fetchone()
                (soft,) = conn.execute("PRAGMA soft_heap_limit").fetchone()
                wanted = int(hard) * 3 // 4  # page caches shrink before queries fail
                if not 0 < soft <= wanted:  # never raise a lower soft limit someone else set
                    conn.execute(f"PRAGMA soft_heap_limit={wanted}")
            finally:
                conn.close()
            _heap_cap = int(hard)
            logger.info("SQLite heap of this process capped at %d MiB for scoring", _heap_cap >> 20)
        return _heap_cap


def database_identity(db_path: str | Path) -> tuple[int, int, int, int] | None:
    """(device, inode, size, mtime) of the file, None if it cannot be stat'ed: changes when the
    database is replaced or rewritten, so cached gold results of the old file are not reused."""
    try:
        st = os.stat(db_path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def database_fault(error: BaseException) -> str | None:
    """Why `error` (from `run_bounded`) is the database's fault, not the query's; else None.

    Decided by SQLite's result code, never by the message: a query can put any text in an error
    message (`SELECT * FROM "file is not a database"`), and must not pass its own failure off as ours.
    """
    if isinstance(error, SandboxError) and error.kind == "not_found":
        return str(error)
    cause = error.__cause__ if isinstance(error, SandboxError) else error
    code = getattr(cause, "sqlite_errorcode", None)
    if isinstance(cause, sqlite3.Error) and isinstance(code, int) and code & 0xFF in _DATABASE_FAULT_CODES:
        return f"{getattr(cause, 'sqlite_errorname', code)}: {cause}"
    return None


def out_of_memory(error: BaseException) -> bool:
    cause = error.__cause__ if isinstance(error, SandboxError) else error
    return isinstance(cause, MemoryError) or getattr(cause, "sqlite_errorname", "") == "SQLITE_NOMEM"


# ----------------------------------------------------------------------------- the connection


def _authorizer(conn: SandboxConnection) -> Callable[[int, str | None, str | None, str | None, str | None], int]:
    """Allow-list: reads, function calls (minus the denied ones), recursive CTEs, schema PRAGMAs."""
    always = {sqlite3.SQLITE_SELECT, sqlite3.SQLITE_READ, sqlite3.SQLITE_RECURSIVE}

    def check(action: int, arg1: str | None, arg2: str | None, _db: str | None, _src: str | None) -> int:
        if action in always:
            return sqlite3.SQLITE_OK
        if action == sqlite3.SQLITE_FUNCTION and (arg2 or "").lower() not in DENIED_FUNCTIONS:
            return sqlite3.SQLITE_OK
        if action == sqlite3.SQLITE_PRAGMA and (arg1 or "").lower() in ALLOWED_PRAGMAS:
            return sqlite3.SQLITE_OK
        # The first use of an eponymous virtual table (json_each, ...) is authorized as an UPDATE of
        # sqlite_master, though nothing is written (a real one is refused earlier by SQLite).
        if action == sqlite3.SQLITE_UPDATE and arg1 in ("sqlite_master", "sqlite_schema"):
            return sqlite3.SQLITE_OK
        if conn.last_denial is None:
            conn.last_denial = "only read-only SELECT queries are allowed"
        return sqlite3.SQLITE_DENY

    return check


_NUMBER_PREFIX = re.compile(r"\s*([+-]?(?:0[xX][0-9a-fA-F]+|(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?))")
_PRINTF_SPEC = re.compile(r"%([-+ #!0,.*0-9]*)")


def _magnitude(value: Any) -> float:
    """Largest width SQLite could read from `value` for a `*` (int64 and its int32 cast)."""
    if isinstance(value, bytes | str):
        text = value.decode("latin-1") if isinstance(value, bytes) else value
        match = _NUMBER_PREFIX.match(text)
        if match is None:
            return 0.0
        number = match.group(1)
        try:
            value = int(number, 16) if number.lstrip("+-")[:2].lower() == "0x" else float(number)
        except (ValueError, OverflowError):
            return math.inf
    if isinstance(value, float):
        if not math.isfinite(value):
            return math.inf
        value = int(value)
    if not isinstance(value, int):
        return 0.0
    as_int32 = (value & 0xFFFFFFFF) - ((value & 0x80000000) << 1)
    return float(max(abs(value), abs(as_int32)))


def printf_refusal(args: tuple[Any, ...], limit: int = MAX_VALUE_BYTES) -> str | None:
    """Why printf(*args) could run away inside one VM instruction (a width or precision above
    `limit`; every `*` argument counts, since which one a `*` reads depends on the format), or None."""
    if not args or not isinstance(args[0], str | bytes):
        return None
    fmt = args[0].decode("utf-8", "replace") if isinstance(args[0], bytes) else args[0]
    star = False
    for spec in _PRINTF_SPEC.finditer(fmt):
        star = star or "*" in spec.group(1)
        if any(len(d.lstrip("0")) > 9 or int(d) > limit for d in re.findall(r"\d+", spec.group(1))):
            return f"printf() width or precision above {limit}"
    if star and any(_magnitude(a) > limit for a in args[1:]):
        return f"printf() with a * width or precision takes no argument above {limit}"
    return None


_builtin = threading.local()


def _guarded_printf(conn: SandboxConnection, name: str) -> Callable[..., Any]:
    def call(*args: Any) -> Any:
        problem = printf_refusal(args)
        if problem is not None:
            conn.last_function_error = problem  # the sandbox's error message quotes it
            raise ValueError(problem)
        helper = getattr(_builtin, "conn", None)
        if helper is None:  # SQLite's own printf, on a private connection (the guard overrides it here)
            helper = _builtin.conn = sqlite3.connect(":memory:")
            helper.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, MAX_VALUE_BYTES)
            helper.text_factory = lambda raw: raw.decode("utf-8", errors="replace")
        return helper.execute(f"SELECT {name}({', '.join('?' * len(args))})", args).fetchone()[0]

    return call


def open_for_scoring(db_path: str | Path) -> SandboxConnection:
    """Open `db_path` read-only with every limit above; SandboxError("not_found") if it is missing,
    SandboxError(cause=the sqlite3 error) if it cannot be opened."""
    path = Path(db_path)
    if not path.is_file():
        raise SandboxError(f"database not found: {path}", kind="not_found")
    try:
        conn = sqlite3.connect(path.resolve().as_uri() + "?mode=ro", uri=True, factory=SandboxConnection,
                               check_same_thread=False, isolation_level=None)
    except (sqlite3.Error, MemoryError) as exc:
        raise SandboxError(f"cannot open database {path.name}: {exc}") from exc
    assert isinstance(conn, SandboxConnection)
    try:
        conn.execute("PRAGMA temp_store=MEMORY")  # before query_only and the authorizer
        conn.execute("PRAGMA query_only=ON")
        if hasattr(conn, "enable_load_extension"):
            conn.enable_load_extension(False)
        for limit, value in ((sqlite3.SQLITE_LIMIT_ATTACHED, 0), (sqlite3.SQLITE_LIMIT_LENGTH, MAX_VALUE_BYTES),
                             (sqlite3.SQLITE_LIMIT_SQL_LENGTH, MAX_SQL_CHARS * 4),
                             (sqlite3.SQLITE_LIMIT_LIKE_PATTERN_LENGTH, MAX_LIKE_PATTERN),
                             (sqlite3.SQLITE_LIMIT_VDBE_OP, MAX_VDBE_OPS), (sqlite3.SQLITE_LIMIT_WORKER_THREADS, 0)):
            conn.setlimit(limit, value)
        conn.text_factory = lambda raw: raw.decode("utf-8", errors="replace")  # as the server: never fail on bad UTF-8
        for name in ("printf", "format"):
            conn.create_function(name, -1, _guarded_printf(conn, name), deterministic=True)
        conn.set_authorizer(_authorizer(conn))
    except (sqlite3.Error, MemoryError) as exc:
        conn.close()
        raise SandboxError(f"cannot open database {path.name}: {exc}") from exc
    except BaseException:
        conn.close()
        raise
    return conn


# ----------------------------------------------------------------------------- running a query


class _Activity:
    """Scoring queries running now: the heap cap is process-wide, so a query that ran out of
    memory beside another one may have lost to it and gets one more try."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.running = 0
        self.started = 0

    def enter(self) -> tuple[bool, int]:
        with self._lock:
            self.running += 1
            self.started += 1
            return self.running > 1, self.started

    def leave(self) -> None:
        with self._lock:
            self.running -= 1

    def overlapped(self, at_start: bool, started: int) -> bool:
        with self._lock:
            return at_start or self.running > 1 or self.started != started


_activity = _Activity()


def _run_on_worker(open_conn: Callable[[], SandboxConnection], sql: str, timeout_s: float,
                   max_rows: int | None) -> QueryResult:
    box: list[Any] = []
    conns: list[SandboxConnection] = []
    done = threading.Event()

    def work() -> None:
        try:
            conn = open_conn()
            conns.append(conn)
            try:
                box.append(run_query(conn, sql, timeout_s=timeout_s, max_rows=max_rows))
            finally:
                conn.close()
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            box.append(exc)
        finally:
            done.set()

    threading.Thread(target=work, name="sql-scoring", daemon=True).start()
    if not done.wait(timeout_s + WALL_CLOCK_GRACE_S):
        global abandoned_queries
        abandoned_queries += 1
        if conns:
            try:
                conns[0].interrupt()  # takes effect at the next VM instruction
            except sqlite3.Error:
                pass
        logger.warning("scoring query abandoned after %.1f s (wall clock): %.200s", timeout_s + WALL_CLOCK_GRACE_S, sql)
        raise SandboxError(f"timeout: query ran longer than {timeout_s:g} s and was abandoned", kind="timeout")
    if isinstance(box[0], BaseException):
        raise box[0]
    return box[0]


def run_bounded(db_path: str | Path, sql: str, *, timeout_s: float, max_rows: int | None,
                open_conn: Callable[[], SandboxConnection] | None = None) -> QueryResult:
    """Run one query under the limits above; returns within ~timeout_s + WALL_CLOCK_GRACE_S
    (twice that when a memory failure beside other queries is retried). Raises SandboxError.

    `open_conn` replaces `open_for_scoring(db_path)` (tests use it to stall SQLite on purpose).
    """
    ensure_heap_limit()
    opener = open_conn or (lambda: open_for_scoring(db_path))
    at_start, started = _activity.enter()
    try:
        try:
            return _run_on_worker(opener, sql, timeout_s, max_rows)
        except SandboxError as exc:
            if not (out_of_memory(exc) and _activity.overlapped(at_start, started)):
                raise
        logger.info("scoring query ran out of memory beside other queries; retrying once")
        time.sleep(0.05)  # the other query fails or finishes and frees the heap
        return _run_on_worker(opener, sql, timeout_s, max_rows)
    finally:
        _activity.leave()


def database_is_empty(db_path: str | Path, timeout_s: float = 5.0) -> bool:
    """True when the file holds no schema at all (e.g. truncated to 0 bytes, which SQLite opens
    as a new empty database); raises SandboxError if it cannot be read."""
    return run_bounded(db_path, "SELECT count(*) FROM sqlite_schema", timeout_s=timeout_s, max_rows=1).rows[0][0] == 0
