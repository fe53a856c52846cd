"""Resource limits of the SQLite sandbox that the per-connection settings in `sandbox.py` cannot give.

* Single operations: SQLite's deadline check (the progress handler) runs between VM instructions,
  so one instruction must not run long. Length limits bound almost every built-in, but SQLite
  3.40's printf/format repeats `%c` `precision` times with no limit check: `printf('%.*c',
  2147483647, 'x')` is one instruction of ~2**31 appends (13 s). And trim/ltrim/rtrim with a
  set of characters cost len(text) * len(set) even within the length limit (0.4 s of CPU for
  32,000 x 2,700). `install_function_guards` overrides these on a connection with checked
  wrappers around the built-ins.
* Memory: `apply_server_limits` caps SQLite's heap for the whole process (`PRAGMA
  hard_heap_limit`: every connection, sorters and in-memory temp tables included) and sets an
  address-space limit as a backstop for memory SQLite does not count. Process-wide, so only the
  server calls it; a library user opts in. The heap cap does not see what malloc keeps after
  SQLite frees it: `release_freed_memory`, after each server call, returns that to the OS once
  RSS has grown (glibc's `malloc_trim`).
* Echoed input: `clip_echo` shortens user-supplied text quoted back in error messages.
"""

from __future__ import annotations

import ctypes
import logging
import math
import platform
import re
import resource
import sqlite3
import threading
import time
from collections.abc import Callable
from typing import Any

logger = logging.getLogger(__name__)

#: Default cap of the server's SQLite heap (MiB): no query (nor all of them together) passes it.
MEMORY_LIMIT_MB = 256
#: Address space allowed above the heap cap and what the process had mapped when the limits were
#: set: worker-thread stacks (8 MiB each, reserved not used), malloc arenas and Python's own
#: objects. A backstop only; the heap cap is what bounds queries.
ADDRESS_SPACE_HEADROOM_MB = 1024
#: RSS growth (MiB) above its level after the last trim at which a finished call hands the memory
#: queries freed back to the OS (`release_freed_memory`); below it the memory is reused anyway.
TRIM_ABOVE_MB = 32
#: Longest piece of user input quoted back in an error message.
MAX_ECHO_CHARS = 200

_heap_limit_bytes: int | None = None


def clip_echo(text: str, limit: int = MAX_ECHO_CHARS) -> str:
    """`text` cut to `limit` characters plus a note of its real length (for error messages)."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}… [{len(text):,} characters, clipped]"


# --------------------------------------------------------------------------- process memory


def heap_limit_bytes() -> int | None:
    """The SQLite heap cap set by `set_heap_limit` in this process, or None."""
    return _heap_limit_bytes


def memory_error_message() -> str:
    """Why a query ran out of memory, for the model."""
    if _heap_limit_bytes:
        return f"query exceeded the server's memory limit ({_heap_limit_bytes >> 20} MB)"
    return "query ran out of memory"


def set_heap_limit(limit_bytes: int) -> int:
    """Cap SQLite's heap for every connection of this process; returns the cap in force.

    SQLite can only lower the hard limit through the PRAGMA, so a second, larger call keeps the
    first cap. The soft limit (3/4 of it) makes page caches give memory back before queries fail.
    """
    global _heap_limit_bytes
    conn = sqlite3.connect(":memory:")
    try:
        (hard,) = conn.execute(f"PRAGMA hard_heap_limit={int(limit_bytes)}").fetchone()
        conn.execute(f"PRAGMA soft_heap_limit={int(hard) * 3 // 4}")
    finally:
        conn.close()
    _heap_limit_bytes = int(hard) or None
    return int(hard)


def _statm_bytes(field: int) -> int | None:
    """Field `field` of /proc/self/statm (0: address space mapped, 1: resident) in bytes (Linux), else None."""
    try:
        with open("/proc/self/statm", encoding="ascii") as f:
            pages = int(f.read().split()[field])
    except (OSError, ValueError, IndexError):
        return None
    return pages * resource.getpagesize()


def _address_space_bytes() -> int | None:
    """Bytes of address space mapped by this process now (Linux), else None."""
    return _statm_bytes(0)


def _limit_malloc_arenas(arenas: int) -> None:
    # glibc reserves 64 MiB of address space per malloc arena, up to 8 per core: on a large
    # machine that alone would outgrow any fixed RLIMIT_AS. And memory a query frees stays in its
    # thread's arena, so each arena can hold up to a whole heap cap of it: with one arena the RSS
    # stays near the cap (the worker threads' malloc calls then share one lock; SQLite's, mostly).
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return
    try:
        libc = ctypes.CDLL(None)
        m_arena_max = -8  # from malloc.h
        libc.mallopt(ctypes.c_int(m_arena_max), ctypes.c_int(arenas))
    except (OSError, AttributeError) as exc:
        logger.info("could not limit malloc arenas: %s", exc)


class _FreedMemory:
    """Hands memory that queries freed back to the OS (glibc `malloc_trim`), once RSS has grown.

    SQLite's heap cap counts what SQLite holds, not what malloc keeps after SQLite frees it: a
    window-function query took a server from 71 to 346 MiB RSS (SQLite's own peak: ~255 MiB) and
    the process stayed there, the freed sorter and temp b-tree pages scattered in the heap where
    only `malloc_trim` (MADV_DONTNEED on free pages inside it) returns them. `after_call` costs
    one read of /proc/self/statm; the trim runs only when RSS passed the level after the last one
    by `TRIM_ABOVE_MB`, so cheap calls never pay for it.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._floor: int | None = None  # RSS (bytes) after the last trim
        self._trim: Callable[[int], int] | None = None
        self.trims = 0
        if platform.system() == "Linux" and platform.libc_ver()[0] == "glibc":
            try:
                trim = ctypes.CDLL(None).malloc_trim
                trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
                self._trim = trim
            except (OSError, AttributeError) as exc:
                logger.info("malloc_trim unavailable: %s", exc)

    def after_call(self) -> None:
        if self._trim is None:
            return
        rss = rss_bytes()
        if rss is None:
            return
        with self._lock:  # one trim at a time; calls ending meanwhile see the new floor
            if self._floor is None:
                self._floor = rss
            if rss - self._floor < TRIM_ABOVE_MB << 20:
                self._floor = min(self._floor, rss)
                return
            start = time.perf_counter()
            self._trim(0)
            self.trims += 1
            after = rss_bytes() or rss
            logger.debug("returned freed memory: RSS %d -> %d MiB in %.1f ms", rss >> 20, after >> 20,
                         1e3 * (time.perf_counter() - start))
            self._floor = after


def rss_bytes() -> int | None:
    """Resident memory of this process (Linux), else None."""
    return _statm_bytes(1)


_freed_memory = _FreedMemory()


def release_freed_memory() -> None:
    """After a server call: return memory queries freed to the OS if RSS grew (`_FreedMemory`)."""
    _freed_memory.after_call()


def apply_server_limits(memory_limit_mb: int = MEMORY_LIMIT_MB) -> None:
    """Memory caps for a server process (module docstring); `memory_limit_mb <= 0` sets none."""
    if memory_limit_mb <= 0:
        return
    limit = set_heap_limit(memory_limit_mb << 20)
    _limit_malloc_arenas(1)
    mapped = _address_space_bytes()
    if mapped is None:
        logger.info("address space unknown on this platform; only the SQLite heap is capped")
        return
    wanted = mapped + limit + (ADDRESS_SPACE_HEADROOM_MB << 20)
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    if soft != resource.RLIM_INFINITY and soft <= wanted:
        return  # already tighter
    if hard != resource.RLIM_INFINITY:
        wanted = min(wanted, hard)
    try:
        resource.setrlimit(resource.RLIMIT_AS, (wanted, hard))
    except (ValueError, OSError) as exc:
        logger.warning("could not set RLIMIT_AS: %s", exc)
        return
    logger.info("SQLite heap capped at %d MiB, address space at %d MiB", limit >> 20, wanted >> 20)


# --------------------------------------------------------------------------- printf guard

# A conversion's flags, width and precision (what SQLite reads between "%" and the conversion).
_SPEC = re.compile(r"%([-+ #!0,.*0-9]*)")
_NUMBER_PREFIX = re.compile(r"\s*([+-]?(?:0[xX][0-9a-fA-F]+|(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?))")


def _magnitude(value: Any) -> float:
    """Largest width SQLite could read from `value` for a `*` (conservative: int64 and int32 views)."""
    if value is None:
        return 0.0
    if isinstance(value, bytes):
        value = value.decode("latin-1")
    if isinstance(value, str):
        match = _NUMBER_PREFIX.match(value)
        if match is None:
            return 0.0
        text = match.group(1)
        try:
            value = int(text, 16) if text.lstrip("+-")[:2].lower() == "0x" else float(text)
        except (ValueError, OverflowError):
            return math.inf
    if isinstance(value, float):
        if not math.isfinite(value):
            return math.inf
        value = int(value)
    if not isinstance(value, int):
        return 0.0
    as_int32 = (value & 0xFFFFFFFF) - ((value & 0x80000000) << 1)  # SQLite casts the int64 to int
    return float(max(abs(value), abs(as_int32)))


def printf_problem(args: tuple[Any, ...], limit: int) -> str | None:
    """Why printf(*args) could run away (a width or precision above `limit`), or None."""
    if not args or args[0] is None:
        return None
    fmt = args[0].decode("utf-8", "replace") if isinstance(args[0], bytes) else str(args[0])
    star = False
    for match in _SPEC.finditer(fmt):
        body = match.group(1)
        star = star or "*" in body
        for digits in re.findall(r"\d+", body):
            digits = digits.lstrip("0") or "0"
            if len(digits) > 9 or int(digits) > limit:
                return f"printf() width/precision {clip_echo(digits, 20)} is too large (limit {limit})"
    # Which argument a "*" reads depends on every conversion before it, so all are checked.
    if star and any(_magnitude(a) > limit for a in args[1:]):
        return f"printf() with a * width/precision takes no argument above {limit}"
    return None


#: Largest len(text) * len(characters) for trim(text, characters); realistic sets have a few
#: characters (32,000 x 60 passes), the cost is ~4 ns per unit (8 ms at the limit).
MAX_TRIM_WORK = 2_000_000


def _text_length(value: Any) -> int:
    if isinstance(value, str | bytes):
        return len(value)
    return 0 if value is None else 24  # a number's text


def trim_problem(args: tuple[Any, ...], limit: int = MAX_TRIM_WORK) -> str | None:
    """Why trim(text, characters) would run long (see MAX_TRIM_WORK), or None."""
    if len(args) != 2:
        return None
    text, chars = _text_length(args[0]), _text_length(args[1])
    if text * chars <= limit:
        return None
    return f"trim() of {text:,} characters by a set of {chars:,} is too large (their product is limited to {limit:,})"


#: Largest len(haystack) * len(needle) for instr(), and len(text) * len(pattern) for replace():
#: SQLite compares the needle at every position (~4 ms for 32,000 x 15,000). Realistic calls
#: are far below (a column value and a short literal).
MAX_SEARCH_WORK = 50_000_000

#: The refusal reason a guarded function gives when its query's deadline has passed.
DEADLINE_PASSED = "timeout: the query's time limit passed"


def search_problem(args: tuple[Any, ...], limit: int = MAX_SEARCH_WORK) -> str | None:
    """Why instr(haystack, needle) or replace(text, pattern, with) would run long, or None."""
    if len(args) < 2:
        return None
    text, pattern = _text_length(args[0]), _text_length(args[1])
    if text * pattern <= limit:
        return None
    return (f"instr()/replace() of {text:,} characters by a pattern of {pattern:,} is too large "
            f"(their product is limited to {limit:,})")


_helpers = threading.local()


def _builtin(function: str, args: tuple[Any, ...], max_length: int) -> Any:
    """SQLite's own `function(*args)` on a private per-thread connection (the guard overrides it)."""
    conn = getattr(_helpers, "conn", None)
    if conn is None:
        conn = sqlite3.connect(":memory:")
        conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, max_length)
        conn.text_factory = lambda raw: raw.decode("utf-8", errors="replace")
        _helpers.conn = conn
    placeholders = ", ".join("?" * len(args))
    return conn.execute(f"SELECT {function}({placeholders})", args).fetchone()[0]


def install_function_guards(conn: sqlite3.Connection, max_length: int, on_refusal: Callable[[str], None],
                            late: Callable[[], bool] | None = None) -> None:
    """Replace printf/format, two-argument trims, instr and replace on `conn` with checked
    versions (module doc).

    A refused call raises inside SQLite; `on_refusal(reason)` is told first, so the caller can
    report the reason instead of SQLite's "user-defined function raised exception". Calls that
    pass the check run SQLite's own function, so results are exactly the built-in's. `late()`:
    whether the running query's deadline passed; every guarded call asks first and refuses with
    `DEADLINE_PASSED`. A statement made only of function calls has no loop, so SQLite never runs
    its progress handler nor looks at the interrupt flag inside it: without this, 120 expensive
    calls in one SELECT ran 11 s past a 1 s limit.
    """

    def guarded(function: str, check: Callable[[tuple[Any, ...]], str | None]) -> Callable[..., Any]:
        def call(*args: Any) -> Any:
            problem = DEADLINE_PASSED if late is not None and late() else check(args)
            if problem is None:
                try:
                    return _builtin(function, args, max_length)
                except sqlite3.Error as exc:
                    problem = f"{function}(): {exc}"
            on_refusal(problem)
            raise ValueError(problem)

        return call

    def check_printf(args: tuple[Any, ...]) -> str | None:
        return printf_problem(args, max_length)

    for name in ("printf", "format"):
        conn.create_function(name, -1, guarded(name, check_printf), deterministic=True)
    for name in ("trim", "ltrim", "rtrim"):  # one-argument forms trim spaces only: linear, left alone
        conn.create_function(name, 2, guarded(name, trim_problem), deterministic=True)
    conn.create_function("instr", 2, guarded("instr", search_problem), deterministic=True)
    conn.create_function("replace", 3, guarded("replace", search_problem), deterministic=True)


__all__ = [
    "DEADLINE_PASSED",
    "MAX_SEARCH_WORK",
    "MAX_ECHO_CHARS",
    "MEMORY_LIMIT_MB",
    "apply_server_limits",
    "clip_echo",
    "heap_limit_bytes",
    "install_function_guards",
    "memory_error_message",
    "printf_problem",
    "search_problem",
    "set_heap_limit",
    "trim_problem",
]
