"""Resource limits of the SQLite sandbox that the per-connection settings in `sandbox.py` cannot give.

* Single operations: SQLite's deadline check (the progress handler) runs between VM instructions,
  so one instruction must not run long. Length limits bound almost every built-in, but SQLite
  3.40's printf/format repeats `%c` `precision` times with no limit check: `printf('%.*c',
  2147483647, 'x')` is one instruction of ~2**31 appends (13 s). And trim/ltrim/rtrim with a
  set of characters cost len(text) * len(set) even within the length limit (0.4 s of CPU for
  32,000 x 2,700). `install_function_guards` overrides these on a connection with checked
  wrappers around the built-ins.
* Memory of the whole process (the server's RSS ceiling and SQLite heap cap) is
  `mcp_tools.process_memory`'s.
* Echoed input: `clip_echo` shortens user-supplied text quoted back in error messages.
"""

from __future__ import annotations

import math
import re
import sqlite3
import threading
from collections.abc import Callable
from typing import Any

#: Longest piece of user input quoted back in an error message.
MAX_ECHO_CHARS = 200


def clip_echo(text: str, limit: int = MAX_ECHO_CHARS) -> str:
    """`text` cut to `limit` characters plus a note of its real length (for error messages)."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}… [{len(text):,} characters, clipped]"


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
    "clip_echo",
    "install_function_guards",
    "printf_problem",
    "search_problem",
    "trim_problem",
]
