"""Single-operation limits of the sandbox, in process: printf bombs, internal tables, temp files,
wide rows, echoed input, out-of-memory handling (issue 17, items 1-6; the server-level checks are in
test_sandbox_limits_server.py)."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from mcp_tools import sandbox
from mcp_tools.result_rows import fetch_capped
from mcp_tools.sandbox import SandboxError, open_readonly, run_query
from mcp_tools.sandbox_limits import printf_problem
from mcp_tools.sqlite_catalog import names_hint
from tests.hostile_sql import make_hostile_db, tree_state

REPO_ROOT = Path(__file__).resolve().parents[1]
#: Generous: an instant refusal must not wait for the timeout, even on a starved machine.
INSTANT_S = 1.0


_initial_state: dict[str, str] = {}


@pytest.fixture(scope="module")
def db_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Shared by the module's tests; the last test checks that nothing changed it."""
    directory = tmp_path_factory.mktemp("limits") / "dbs"
    make_hostile_db(directory)
    _initial_state.update(tree_state(directory))
    return directory


@pytest.fixture
def conn(db_dir: Path):
    c = open_readonly(db_dir / "target.sqlite")
    yield c
    c.close()


def refused(conn: sqlite3.Connection, sql: str, **kwargs) -> tuple[SandboxError, float]:
    start = time.monotonic()
    with pytest.raises(SandboxError) as info:
        run_query(conn, sql, **kwargs)
    return info.value, time.monotonic() - start


# ----------------------------------------------------------------------------- item 1: printf


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT length(printf('%.*c', 2147483647, 'x'))",
        "SELECT length(format('%.*c', 2147483647, 'x'))",
        "SELECT length(printf('%.2147483647c', 'x'))",
        "SELECT length(printf('%!.*c', 2147483647, 'x'))",
        "SELECT length(printf('%*.*c', 1, 2147483647, 'x'))",
        "SELECT length(printf('%d %.*c', 1, 2147483647, 'x'))",
        "SELECT length(printf('%.*c', 4294967296 + 2147483647, 'x'))",  # SQLite keeps the low 32 bits
        "SELECT length(printf('%.*c', '2147483647', 'x'))",
        "SELECT length(printf('%.*c', 2147483647.0, 'x'))",
        "SELECT length(printf('%.*c', 2147483647, name)) FROM singer LIMIT 3",
        "SELECT length(printf(printf('%%.%dc', 2147483647), 'x'))",
    ],
)
def test_printf_bombs_are_refused_at_once(conn, sql: str) -> None:
    err, elapsed = refused(conn, sql, timeout_s=5.0)
    assert err.kind == "too_large" and "printf() " in str(err), str(err)
    assert elapsed < INSTANT_S


@pytest.mark.parametrize(
    ("fmt", "args"),
    [
        ("%5.2f|%-4d|%s|%%|%.3s", (3.14159, 42, "abc", "abcdef")),
        ("%q %Q %w", ("it's", None, 'a"b')),
        ("%,d %x %X %o %e %g %!.3g", (1234567, 255, 255, 8, 12345.678, 0.0001, 1 / 3)),
        ("%*d|%-*d|%.*f", (6, 42, 6, 42, 2, 2.71828)),
        ("%.5c%c", ("ab", "z")),
        ("%d %s", (None, None)),
        ("no conversions", ()),
        ("%s", (b"blob",)),
        ("%40000d", (1,)),  # a width over the limit is refused; SQLite alone returns NULL
    ],
)
def test_printf_results_match_sqlite(conn, fmt: str, args: tuple) -> None:
    placeholders = ", ".join("?" * (len(args) + 1))
    plain = sqlite3.connect(":memory:")
    plain.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, sandbox.MAX_VALUE_BYTES)
    expected = plain.execute(f"SELECT printf({placeholders})", (fmt, *args)).fetchone()[0]
    plain.close()
    literals = ", ".join(_literal(v) for v in (fmt, *args))
    if printf_problem((fmt, *args), sandbox.MAX_VALUE_BYTES) is not None:
        assert expected is None  # the built-in gives up too, after the work
        assert refused(conn, f"SELECT printf({literals})")[0].kind == "too_large"
        return
    assert run_query(conn, f"SELECT printf({literals}), format({literals})").rows == [(expected, expected)]


def _literal(value: object) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, bytes):
        return f"x'{value.hex()}'"
    if isinstance(value, str):
        return "'" + value.replace("'", "''") + "'"
    return repr(value)


def test_trim_by_a_huge_set_is_refused_and_normal_trims_are_unchanged(conn) -> None:
    big = "replace(hex(zeroblob(16000)), '0', 'a')"
    chars = "(SELECT group_concat(char(i + 256), '') FROM (WITH RECURSIVE r(i) AS (SELECT 1 UNION ALL " \
        "SELECT i + 1 FROM r LIMIT 2700) SELECT i FROM r)) || 'a'"
    for function in ("trim", "ltrim", "rtrim"):
        err, elapsed = refused(conn, f"SELECT length({function}({big}, {chars}))", timeout_s=5.0)
        assert err.kind == "too_large" and "trim() of 32,000 characters" in str(err), str(err)
        assert elapsed < INSTANT_S
    sql = ("SELECT trim('xxhixx', 'x'), ltrim('  a '), rtrim('abcc', 'c'), trim(NULL, 'x'), trim(12.50, '0'), "
           "trim(x'4142', 'A')")
    plain = sqlite3.connect(":memory:")
    expected = plain.execute(sql).fetchall()
    plain.close()
    assert run_query(conn, sql).rows == expected


def test_printf_problem_reads_widths_and_star_arguments() -> None:
    limit = 100
    assert printf_problem(("%5d %.3s %-20c",), limit) is None
    assert printf_problem(("%%500d",), limit) is not None  # conservative: digits after "%%" count too
    assert printf_problem(("%.101c", "x"), limit) is not None
    assert printf_problem(("%0000000000000000000005d", 1), limit) is None  # leading zeros are flags
    assert printf_problem(("%.*c", 100, "x"), limit) is None
    assert printf_problem(("%.*c", -2**31, "x"), limit) is not None
    assert printf_problem(("%.*c", " 1e9 ", "x"), limit) is not None
    assert printf_problem(("%.*c", "0x7fffffff", "x"), limit) is not None
    assert printf_problem(("%.*c", float("inf"), "x"), limit) is not None
    assert printf_problem(("%d", 10**30), limit) is None  # no "*": values are not widths
    assert printf_problem((None, 10**30), limit) is None


# ----------------------------------------------------------------------------- item 5: internal tables


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT * FROM sqlite_stmt",
        "SELECT sql FROM SQLITE_STMT",
        "SELECT count(*) FROM main.sqlite_stmt",
        "SELECT 1 WHERE EXISTS (SELECT 1 FROM sqlite_stmt)",
        "SELECT * FROM dbstat",
        "SELECT count(*) FROM dbstat('main')",
        "SELECT name FROM singer WHERE singer_id IN (SELECT pageno FROM dbstat)",
    ],
)
def test_internal_virtual_tables_are_denied(conn, sql: str) -> None:
    err, _ = refused(conn, sql)
    assert err.kind == "denied" and "not allowed" in str(err), str(err)


def test_other_connections_sql_is_not_visible(db_dir: Path, conn) -> None:
    other = open_readonly(db_dir / "target.sqlite")
    try:
        cur = other.execute("SELECT 'secret of another episode' FROM singer")
        cur.fetchone()  # left open, as a concurrent query would be
        assert refused(conn, "SELECT group_concat(sql) FROM sqlite_stmt")[0].kind == "denied"
    finally:
        other.close()


# ----------------------------------------------------------------------------- item 3: temp files


def _temp_files_open() -> set[str]:
    """Files this process has open that SQLite made as temp files (deleted, named etilqs_*)."""
    found = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if "etilqs_" in target:
            found.add(target)
    return found


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs /proc")
@pytest.mark.parametrize(
    "sql",
    [
        # A sort larger than the page cache (2 MB): SQLite spills sorted runs to temp files.
        "SELECT hex(randomblob(200)) AS h FROM singer a, singer b, concert c ORDER BY h",
        # A de-duplicating recursive CTE: its UNION index is a temp b-tree that outgrows the cache.
        "WITH RECURSIVE r(i, pad) AS (SELECT 1, hex(randomblob(40)) UNION "
        "SELECT i + 1, hex(randomblob(40)) FROM r WHERE i < 60000) SELECT count(*) FROM r",
    ],
)
def test_sorts_and_temp_tables_write_no_temp_files(conn, sql: str) -> None:
    seen: set[str] = set()
    done = threading.Event()

    def watch() -> None:
        while not done.wait(0.002):
            seen.update(_temp_files_open())

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        result = run_query(conn, sql, timeout_s=60.0, max_rows=1)
    finally:
        done.set()
        watcher.join()
    assert result.row_count == 1
    assert not seen, f"temp files written: {sorted(seen)}"


# ----------------------------------------------------------------------------- item 4: wide rows


WIDE = "SELECT " + ", ".join(["x"] * 2000) + " FROM (SELECT printf('%.8000c', 'x') AS x)"


def test_wide_first_row_is_clipped_and_columns_capped(conn) -> None:
    result = run_query(conn, WIDE, max_chars=8000, max_columns=100)
    assert (len(result.columns), result.omitted_columns, result.truncated) == (100, 1900, True)
    assert len(result.rows) == 1 and len(result.rows[0]) == 100
    assert sum(len(v) for v in result.rows[0]) <= 8000 + 100  # + one ellipsis per clipped value
    # Without a column cap the one row still fits the character budget as a whole.
    result = run_query(conn, WIDE, max_chars=8000)
    assert len(result.columns) == 2000 and result.truncated
    assert sum(len(v) for v in result.rows[0]) <= 8000 + 2000


def test_column_cap_without_char_cap(conn) -> None:
    result = run_query(conn, "SELECT 1, 2, 3 FROM singer LIMIT 2", max_columns=2, max_chars=None)
    assert result.columns == ["1", "2"] and result.rows == [(1, 2), (1, 2)]
    assert result.omitted_columns == 1 and result.truncated
    assert run_query(conn, "SELECT 1, 2", max_columns=2).omitted_columns == 0


def test_fetch_capped_shares_the_budget_across_a_row() -> None:
    plain = sqlite3.connect(":memory:")
    cur = plain.execute("SELECT " + ", ".join(["printf('%.50c', 'y')"] * 10))
    (row,), truncated = fetch_capped(cur, max_rows=5, max_chars=120)
    assert truncated and [len(v) for v in row] == [50, 50, 21] + [1] * 7  # 20 left, then "…" only
    plain.close()


# ----------------------------------------------------------------------------- item 6: echoed input


def test_error_texts_clip_echoed_input(conn) -> None:
    long_name = "q" * 20_000  # SQLite quotes names up to ~32 kB (its length limit) in its messages
    for sql in (f"SELECT {long_name}()", f"SELECT {long_name} FROM singer", f"SELECT * FROM {long_name}",
                f"PRAGMA {long_name}"):
        err, _ = refused(conn, sql)
        assert len(str(err)) < 1000 and "characters, clipped]" in str(err), (sql[:40], str(err)[:300])
    hint = names_hint("table", "t" * 1_000_000, ["singer", "concert"])
    assert len(hint) < 1000 and "1,000,002 characters, clipped" in hint and "singer, concert" in hint


# ----------------------------------------------------------------------------- item 2: memory


def test_out_of_memory_beside_other_queries_is_retried(conn, monkeypatch: pytest.MonkeyPatch) -> None:
    """The heap cap is process-wide: a cheap query that lost to a concurrent hog gets another try."""
    real = sandbox._execute
    calls = []

    def flaky(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise MemoryError
        return real(*args, **kwargs)

    monkeypatch.setattr(sandbox, "_execute", flaky)
    sandbox._activity.enter()  # as if another query were running
    try:
        assert run_query(conn, "SELECT count(*) FROM concert").rows == [(10,)]
        assert len(calls) == 2
    finally:
        sandbox._activity.leave()
    calls.clear()
    # Alone, an out-of-memory failure is the query's own: reported, not retried.
    assert refused(conn, "SELECT count(*) FROM concert")[0].kind == "too_large"
    assert len(calls) == 1


MEMORY_BOMBS = [
    # json_group_array keeps growing one buffer (SQLite 3.40 checks its length only at the end).
    "SELECT length(json_group_array(x)) FROM (WITH RECURSIVE r(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM r) "
    "SELECT hex(zeroblob(15000)) AS x FROM r)",
    # An endless sort: every row must be stored before the first one comes out.
    "SELECT i FROM (WITH RECURSIVE r(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM r) "
    "SELECT i, hex(zeroblob(15000)) AS x FROM r) ORDER BY x, i",
    # A window over the whole input buffers every row.
    "WITH RECURSIVE r(i, x) AS (SELECT 1, hex(zeroblob(15000)) UNION ALL SELECT i + 1, x FROM r) "
    "SELECT x, count(*) OVER () FROM r",
    # One row of 2,000 values of 32 kB (64 MB): result rows are not bound by the length limit.
    "SELECT " + ", ".join(["x"] * 2000) + " FROM (SELECT hex(zeroblob(16000)) AS x)",
]


def test_heap_cap_stops_memory_bombs_with_a_clear_message(db_dir: Path) -> None:
    """In a child process: the SQLite heap cap is process-wide, and pytest's process must keep none."""
    script = (
        "import sys, time\n"
        "from mcp_tools.process_memory import set_heap_limit\n"
        "from mcp_tools.sandbox import SandboxError, open_readonly, run_query\n"
        "set_heap_limit(32 << 20)\n"
        "conn = open_readonly(sys.argv[1])\n"
        "for sql in sys.argv[2:]:\n"
        "    try:\n"
        "        run_query(conn, sql, timeout_s=120)\n"
        "        print('ran')\n"
        "    except SandboxError as exc:\n"
        "        print(exc.kind, exc)\n"
        "print(run_query(conn, 'SELECT count(*) FROM singer').rows)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(db_dir / "target.sqlite"), *MEMORY_BOMBS],
        capture_output=True, text=True, cwd=REPO_ROOT, timeout=280, check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert lines[:-1] == ["too_large too large: query exceeded the server's memory limit (32 MB)"] * len(MEMORY_BOMBS)
    assert lines[-1] == "[(41,)]"  # the connection still works


def test_limits_leave_the_files_alone(db_dir: Path) -> None:
    """Runs last in this module: nothing above changed or created a file next to the databases."""
    assert _initial_state and tree_state(db_dir) == _initial_state
    assert set(_initial_state) == {"target.sqlite", "other.sqlite"}
