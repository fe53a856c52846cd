"""Read-only SQLite sandbox: the security boundary between model-written SQL and the databases.

Used by the MCP SQLite server (every query a policy sends) and by `skyrl_tool_agent.rewards`
(gold and predicted queries). Its contract is pinned by tests/test_sandbox.py (hostile inputs in
tests/hostile_sql.py).

Layers (defence in depth: 1, 2 and 3 each block every write on their own):

0. statements whose first keyword is a write, DDL, ATTACH, transaction or VACUUM are refused
   before SQLite sees them (a clear message, and no-op forms like `REINDEX t` never run);
1. the file is opened through a `file:...?mode=ro` URI, so SQLite itself refuses to write it or to
   create `-journal`/`-wal` files next to it;
2. `PRAGMA query_only=ON`;
3. an authorizer (`sandbox_authorizer`) built as an allow-list: only SELECT, column reads, function
   calls (minus `load_extension` and friends), recursive CTEs and a few read-only schema PRAGMAs
   pass; writes, DDL (temp objects included), ATTACH/DETACH, transactions, VACUUM, ANALYZE, and
   every other PRAGMA are denied at prepare time, before anything runs. So are the virtual tables
   that show the connection's internals (`sqlite_stmt`: other callers' SQL on a shared
   connection; `dbstat`: page layout);
4. limits (`setlimit`): no attached databases at all, 32 kB per value/row (so `randomblob(1e9)`
   fails fast instead of allocating), 100 k characters of SQL, short LIKE/GLOB patterns.

Resource limits: a deadline checked from `set_progress_handler` (no signals, so it works in worker
threads) and enforced from outside by `Connection.interrupt()` when it passes (`query_watch`, one
thread for the process, which also stops the query growing a server past its memory ceiling).
The deadline is wall-clock time (`clock="wall"`, the server's tool calls) or the query thread's
CPU time (`clock="cpu"`, scoring: a busy machine does not turn a correct answer into a timeout),
with a wall-clock backstop of `CPU_CLOCK_WALL_FACTOR` x the limit; caps on returned rows, columns and characters with a `truncated` flag; the
cost of a single VM instruction bounded (length limits, plus a checked printf/format, see
`sandbox_limits`); temp tables and sorters kept in memory (`temp_store=MEMORY`), so they count
against the memory caps a server sets (`process_memory.apply_server_limits`) and never write
temp files.
"""

from __future__ import annotations

import logging
import re
import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from mcp_tools.result_rows import fetch_capped
from mcp_tools.sandbox_authorizer import (  # noqa: F401 - the lists are re-exported
    ALLOWED_PRAGMAS,
    DENIED_FUNCTIONS,
    DENIED_TABLES,
    make_authorizer,
)
from mcp_tools.process_memory import memory_error_message
from mcp_tools.query_watch import query_watch
from mcp_tools.sandbox_limits import DEADLINE_PASSED, clip_echo, install_function_guards

logger = logging.getLogger(__name__)

ErrorKind = Literal["syntax", "denied", "timeout", "multiple_statements", "not_found", "too_large", "error"]

#: Largest string/BLOB/row SQLite may build or read (Spider's largest row is < 1 kB). Also bounds
#: the superlinear built-ins (instr, replace, trim: O(n*m) inside one VM op the deadline cannot stop).
MAX_VALUE_BYTES = 32_768
#: Longest accepted SQL text, in characters (a model-written query is a few hundred).
MAX_SQL_CHARS = 100_000
#: Longest LIKE/GLOB pattern; pathological patterns are O(len(text) * len(pattern)) inside one opcode.
MAX_LIKE_PATTERN = 1_000
#: Largest prepared program (opcodes); guards against enormous generated statements.
MAX_VDBE_OPS = 250_000
#: VM instructions between two deadline checks: ~10 us of work for most instructions, and at most
#: ~30 ms past the deadline when each one works on a 32 kB value (~30 us). The check (a Python
#: call, ~1 us) costs a few % of a tight loop; real queries are over long before it matters.
PROGRESS_EVERY_N_OPS = 1_000

#: With `clock="cpu"`: wall-clock time allowed, as a multiple of the CPU-time limit, before the
#: query is interrupted anyway (a starved or stopped process must still end its queries).
CPU_CLOCK_WALL_FACTOR = 6.0

#: Retries of a query that ran out of memory while other queries ran (they may have held the heap).
NOMEM_RETRIES = 2


class SandboxError(Exception):
    """A query the sandbox refused or that failed; `str(exc)` is written for the model to read.

    `kind` is one of: "syntax" (SQLite could not parse it), "denied" (not read-only), "timeout",
    "multiple_statements", "not_found" (no such database file), "too_large" (a size limit was hit),
    "error" (anything else, e.g. no such table/column).
    """

    def __init__(self, message: str, kind: ErrorKind = "error") -> None:
        super().__init__(message)
        self.kind: ErrorKind = kind

    def __reduce__(self) -> tuple[type[SandboxError], tuple[str, ErrorKind]]:  # keep `kind` across processes
        return (type(self), (str(self), self.kind))


@dataclass(frozen=True)
class QueryResult:
    """Rows of one query, capped; `truncated` says whether rows, columns or characters were cut.

    `omitted_columns` counts result columns dropped by the `max_columns` cap (they are absent from
    `columns` and `rows`).
    """

    columns: list[str]
    rows: list[tuple]
    truncated: bool
    row_count: int
    omitted_columns: int = 0


class SandboxConnection(sqlite3.Connection):
    """A connection made by `open_readonly`; remembers why the authorizer or a guard last said no."""

    last_denial: str | None = None
    last_function_error: str | None = None
    #: The running query's deadline check (None between queries), asked by the function guards.
    past_deadline: Any = None
    #: Why the query watch stopped the running query before its deadline ("memory"), else None.
    stop_reason: str | None = None

    def deadline_passed(self) -> bool:
        check = self.past_deadline
        return check is not None and (check() or self.stop_reason is not None)


def _decode_text(raw: bytes) -> str:
    # Some real databases hold Latin-1 or broken UTF-8; never fail a query over it.
    return raw.decode("utf-8", errors="replace")


def open_readonly(db_path: str | Path) -> SandboxConnection:
    """Open `db_path` read-only with every sandbox layer on (see the module docstring).

    The connection may be handed between threads (`check_same_thread=False`) but must be used by
    one thread at a time. Raises SandboxError(kind="not_found") if the file does not exist.
    """
    path = Path(db_path)
    if not path.is_file():
        raise SandboxError(f"database not found: {path}", kind="not_found")
    uri = path.resolve().as_uri() + "?mode=ro"
    try:
        conn = sqlite3.connect(
            uri, uri=True, factory=SandboxConnection, check_same_thread=False, isolation_level=None
        )
    except (sqlite3.Error, MemoryError) as exc:
        raise SandboxError(f"cannot open database {path.name}: {exc or type(exc).__name__}", kind="error") from exc
    assert isinstance(conn, SandboxConnection)
    try:
        # Sorters and temp b-trees stay in memory, under the heap cap, instead of temp files (a
        # fan-out recursive CTE wrote 1.9 GB of them per query). Before query_only and the authorizer.
        conn.execute("PRAGMA temp_store=MEMORY")
        conn.execute("PRAGMA query_only=ON")
        if hasattr(conn, "enable_load_extension"):  # absent when Python is built without it
            conn.enable_load_extension(False)
        conn.setlimit(sqlite3.SQLITE_LIMIT_ATTACHED, 0)
        conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, MAX_VALUE_BYTES)
        conn.setlimit(sqlite3.SQLITE_LIMIT_SQL_LENGTH, MAX_SQL_CHARS * 4)  # bytes; UTF-8 <= 4 per char
        conn.setlimit(sqlite3.SQLITE_LIMIT_LIKE_PATTERN_LENGTH, MAX_LIKE_PATTERN)
        conn.setlimit(sqlite3.SQLITE_LIMIT_VDBE_OP, MAX_VDBE_OPS)
        conn.setlimit(sqlite3.SQLITE_LIMIT_WORKER_THREADS, 0)
        conn.text_factory = _decode_text
        install_function_guards(conn, MAX_VALUE_BYTES, lambda reason: setattr(conn, "last_function_error", reason),
                                late=conn.deadline_passed)
        conn.set_authorizer(make_authorizer(conn))
    except (sqlite3.Error, MemoryError) as exc:  # e.g. the heap cap reached while other queries run
        conn.close()
        raise SandboxError(f"cannot open database {path.name}: {exc or type(exc).__name__}", kind="error") from exc
    except BaseException:
        conn.close()
        raise
    return conn


# --------------------------------------------------------------------------- running a query


def _check_sql_text(sql: Any) -> None:
    """Refuse inputs SQLite should never see: non-strings, empty, oversized, NUL, lone surrogates."""
    if not isinstance(sql, str):
        raise SandboxError(f"SQL must be a string, got {type(sql).__name__}")
    if not sql.strip():
        raise SandboxError("empty query: write one SELECT statement")
    if len(sql) > MAX_SQL_CHARS:
        raise SandboxError(f"query too long ({len(sql)} characters, limit {MAX_SQL_CHARS})", kind="too_large")
    if "\x00" in sql:
        raise SandboxError("SQL error: the query contains a NUL character")
    try:
        sql.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise SandboxError("SQL error: the query is not valid UTF-8 text") from exc


_MULTI = "only one SQL statement per call is allowed"

# Whitespace or one comment (a block comment cannot contain "*/"; unterminated ones run to the end,
# as in SQLite's tokenizer). Atomic groups and possessive repeats: linear time, no backtracking.
# Invisible characters count as gaps too: a leading U+FEFF (byte-order mark) hid `REINDEX` from
# this check while SQLite still ran it.
_INVISIBLE = "\ufeff\u200b\u200c\u200d\u200e\u200f\u2060\u2061\u2062\u2063\u2064\u180e\u00ad"
_GAP = r"(?>[\s" + _INVISIBLE + r"]++|--[^\n]*+\n?|/\*(?:[^*]|\*(?!/))*+(?:\*/)?)"
_FIRST_KEYWORD = re.compile(_GAP + r"*+([A-Za-z]+)")
_REFUSED_KEYWORDS = {
    **dict.fromkeys(("INSERT", "UPDATE", "DELETE", "REPLACE", "UPSERT"), "write operations are not allowed ({})"),
    **dict.fromkeys(("CREATE", "DROP", "ALTER", "REINDEX", "ANALYZE"), "schema changes are not allowed ({})"),
    **dict.fromkeys(("ATTACH", "DETACH"), "{} is not allowed"),
    **dict.fromkeys(("BEGIN", "COMMIT", "END", "ROLLBACK", "SAVEPOINT", "RELEASE"), "transactions are not allowed"),
    "VACUUM": "VACUUM is not allowed",
}


def _refuse_by_keyword(sql: str) -> None:
    """Layer 0: refuse statements that start with a non-read keyword (the authorizer still checks the rest)."""
    match = _FIRST_KEYWORD.match(sql)
    if match is None:
        return
    keyword = match.group(1).upper()
    reason = _REFUSED_KEYWORDS.get(keyword)
    if reason is not None:
        raise SandboxError(f"denied: {reason.format(keyword)}", kind="denied")


_ONLY_EMPTY_STATEMENTS = re.compile(f"(?:{_GAP}|;)*+")
#: Semicolons inside literals/comments scanned while looking for the end of the first statement.
_MAX_SEMICOLONS_SCANNED = 200


def _first_statement_if_rest_empty(sql: str) -> str:
    """`sql` minus trailing empty statements (`SELECT 1;;`), or SandboxError if a second real one exists.

    Only called after SQLite reported more than one statement. The end of the first statement is
    found with SQLite's own tokenizer (`complete_statement`), so `;` inside literals and comments is
    handled exactly as SQLite does; the remainder may only hold semicolons, whitespace and comments.
    """
    pos = sql.find(";")
    for _ in range(_MAX_SEMICOLONS_SCANNED):
        if pos == -1 or sqlite3.complete_statement(sql[: pos + 1]):
            break
        pos = sql.find(";", pos + 1)
    else:
        pos = -1
    if pos == -1 or not _ONLY_EMPTY_STATEMENTS.fullmatch(sql, pos + 1):
        raise SandboxError(_MULTI, kind="multiple_statements")
    return sql[: pos + 1]


def _classify(exc: BaseException, conn: SandboxConnection, timeout_s: float, timed_out: bool) -> SandboxError:
    """Turn whatever SQLite/Python raised into a SandboxError with a model-readable message."""
    # SQLite quotes the offending token ("no such table: <name>"); that may be most of the query.
    msg = clip_echo(str(exc))
    low = msg.lower()
    code = getattr(exc, "sqlite_errorname", "") or ""
    if isinstance(exc, MemoryError) or code == "SQLITE_NOMEM" or conn.stop_reason == "memory":
        return SandboxError(f"too large: {memory_error_message()}", kind="too_large")
    if conn.last_function_error == DEADLINE_PASSED and "user-defined function raised exception" in low:
        return SandboxError(f"timeout: query ran longer than {timeout_s:g} s and was interrupted", kind="timeout")
    if conn.last_function_error is not None and "user-defined function raised exception" in low:
        reason = conn.last_function_error
        kind: ErrorKind = "too_large" if any(s in reason for s in ("too large", "too big", "above")) else "error"
        return SandboxError(f"{'too large' if kind == 'too_large' else 'SQL error'}: {reason}", kind=kind)
    if isinstance(exc, sqlite3.Error | sqlite3.Warning) and "one statement at a time" in low:
        return SandboxError(_MULTI, kind="multiple_statements")
    if code == "SQLITE_INTERRUPT" or low == "interrupted":
        if timed_out:
            return SandboxError(
                f"timeout: query ran longer than {timeout_s:g} s and was interrupted", kind="timeout"
            )
        return SandboxError("SQL error: query was interrupted")
    if code == "SQLITE_AUTH" or "not authorized" in low or "prohibited" in low:
        return SandboxError(f"denied: {conn.last_denial or 'only read-only SELECT queries are allowed'}", "denied")
    if code.startswith("SQLITE_READONLY") or "readonly database" in low or "may not be modified" in low:
        return SandboxError("denied: the database is read-only", kind="denied")
    if "too many attached databases" in low:
        return SandboxError("denied: ATTACH is not allowed", kind="denied")
    if (
        isinstance(exc, OverflowError)
        or code == "SQLITE_TOOBIG"
        or any(s in low for s in ("too big", "too large", "too complex", "too many", "too long", "stack overflow"))
    ):
        return SandboxError(f"too large: {msg or type(exc).__name__}", kind="too_large")
    if any(s in low for s in ("syntax error", "incomplete input", "unrecognized token")):
        return SandboxError(f"SQL error: {msg}", kind="syntax")
    return SandboxError(f"SQL error: {msg or type(exc).__name__}", kind="error")


class _Activity:
    """Queries running in this process: the SQLite heap cap is process-wide, so a query that ran
    out of memory while another one ran may have lost to that one and deserves another try."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.running = 0
        self.started = 0

    def enter(self) -> tuple[bool, int]:
        """(whether others are running, start counter) for a query that starts now."""
        with self._lock:
            self.running += 1
            self.started += 1
            return self.running > 1, self.started

    def leave(self) -> None:
        with self._lock:
            self.running -= 1

    def overlapped(self, others_at_start: bool, started: int) -> bool:
        """Whether another query ran at some point since `enter` returned (others_at_start, started)."""
        with self._lock:
            return others_at_start or self.running > 1 or self.started != started


_activity = _Activity()


def run_query(
    conn_or_path: sqlite3.Connection | str | Path,
    sql: str,
    *,
    timeout_s: float = 5.0,
    max_rows: int | None = 200,
    max_chars: int | None = None,
    max_columns: int | None = None,
    clock: Literal["wall", "cpu"] = "wall",
    expect_columns: int | None = None,
) -> QueryResult:
    """Run exactly one read-only statement and return its (capped) rows.

    `expect_columns`: when the result has another number of columns, no row is fetched and the
    result comes back empty with `truncated` set (scoring: such an answer cannot match the gold).
    `timeout_s` is wall-clock time from the start of the query (`clock="wall"`) or CPU time of the
    thread running it (`clock="cpu"`, with a wall-clock backstop of `CPU_CLOCK_WALL_FACTOR` x
    `timeout_s`); when it passes the query is interrupted (module docstring).

    `conn_or_path` is a connection from `open_readonly` (reused; not thread-safe, one query at a
    time) or a database path (opened and closed around this call). A trailing semicolon, whitespace
    or comments are fine; a second statement raises SandboxError("multiple_statements").
    `max_rows=None` / `max_chars=None` / `max_columns=None` lift the caps (rewards compare full
    results); with `max_chars`, rows stop once their rendered size would pass it (an oversized
    first row is kept with its values clipped to fit). Never raises anything but SandboxError.
    """
    if isinstance(conn_or_path, str | Path):
        conn = open_readonly(conn_or_path)
        try:
            return run_query(
                conn, sql, timeout_s=timeout_s, max_rows=max_rows, max_chars=max_chars, max_columns=max_columns,
                clock=clock, expect_columns=expect_columns,
            )
        finally:
            conn.close()
    if not isinstance(conn_or_path, SandboxConnection):
        raise SandboxError("internal error: connection was not opened with open_readonly()")
    conn = conn_or_path
    _check_sql_text(sql)
    _refuse_by_keyword(sql)

    if clock == "cpu":
        cpu_deadline = time.thread_time() + timeout_s
        deadline = time.monotonic() + CPU_CLOCK_WALL_FACTOR * timeout_s

        def past_deadline() -> bool:
            return time.thread_time() > cpu_deadline or time.monotonic() > deadline
    else:
        deadline = time.monotonic() + timeout_s

        def past_deadline() -> bool:
            return time.monotonic() > deadline

    others_at_start, started = _activity.enter()
    # The handler returns True to abort; checked every N VM ops, so it also bounds fetching. The
    # query watch stops the query at its wall-clock deadline even when the handler cannot run.
    conn.set_progress_handler(past_deadline, PROGRESS_EVERY_N_OPS)
    conn.past_deadline = past_deadline
    conn.stop_reason = None
    token = query_watch.arm(conn, deadline)
    try:
        for attempt in range(NOMEM_RETRIES + 1):
            try:
                return _execute(conn, sql, max_rows, max_chars, max_columns, expect_columns)
            except SandboxError:
                raise
            except Exception as exc:  # the contract: nothing but SandboxError escapes
                out_of_memory = isinstance(exc, MemoryError) or getattr(exc, "sqlite_errorname", "") == "SQLITE_NOMEM"
                pause = 0.02 * (attempt + 1)
                if (
                    out_of_memory
                    and conn.stop_reason is None  # stopped by the watch: it was this query's memory
                    and attempt < NOMEM_RETRIES
                    and deadline - time.monotonic() > 2 * pause
                    and not past_deadline()
                    and _activity.overlapped(others_at_start, started)
                ):
                    logger.info("query ran out of memory beside other queries; retrying")
                    time.sleep(pause)  # the other query fails or finishes and frees the heap
                    continue
                err = _classify(exc, conn, timeout_s, timed_out=past_deadline())
                logger.debug("query refused (%s): %s", err.kind, err)
                raise err from exc
        raise AssertionError("unreachable")  # the loop returns or raises
    finally:
        query_watch.disarm(token)
        conn.past_deadline = None
        _activity.leave()
        try:
            conn.set_progress_handler(None, 0)
        except sqlite3.Error:
            pass


def _execute(
    conn: SandboxConnection, sql: str, max_rows: int | None, max_chars: int | None, max_columns: int | None,
    expect_columns: int | None = None,
) -> QueryResult:
    """One attempt of `run_query` (the progress handler is already set)."""
    conn.last_denial = None
    conn.last_function_error = None
    cur: sqlite3.Cursor | None = None
    try:
        try:
            cur = conn.execute(sql)
        except (sqlite3.ProgrammingError, sqlite3.Warning) as exc:
            if "one statement at a time" not in str(exc):
                raise
            cur = conn.execute(_first_statement_if_rest_empty(sql))
        columns = [d[0] for d in cur.description] if cur.description else []
        if expect_columns is not None and len(columns) != expect_columns:
            return QueryResult(columns=columns, rows=[], truncated=True, row_count=0)
        keep = len(columns) if max_columns is None else min(len(columns), max_columns)
        rows, truncated = fetch_capped(cur, max_rows, max_chars, keep if keep < len(columns) else None)
        return QueryResult(
            columns=columns[:keep],
            rows=rows,
            truncated=truncated or keep < len(columns),
            row_count=len(rows),
            omitted_columns=len(columns) - keep,
        )
    finally:
        if cur is not None:
            try:
                cur.close()
            except sqlite3.Error:
                pass
