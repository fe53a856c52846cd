"""The read-only SQLite sandbox (mcp_tools.sandbox): results, caps, refusals, and a hostile corpus."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import pytest

from mcp_tools.sandbox import (
    MAX_SQL_CHARS,
    QueryResult,
    SandboxError,
    open_readonly,
    run_query,
)
from tests.hostile_sql import DENIED, MAY_RUN, MUST_FAIL, hostile_corpus, make_hostile_db, tree_state

TIMEOUT_S = 0.25


@pytest.fixture(scope="module")
def db_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Shared by the module's tests: nothing may change it (the corpus test checks that)."""
    directory = tmp_path_factory.mktemp("sandbox") / "dbs"
    make_hostile_db(directory)
    return directory


@pytest.fixture
def conn(db_dir: Path):
    c = open_readonly(db_dir / "target.sqlite")
    yield c
    c.close()


def refused(conn: sqlite3.Connection, sql: str, **kwargs) -> SandboxError:
    with pytest.raises(SandboxError) as info:
        run_query(conn, sql, **kwargs)
    return info.value


# ----------------------------------------------------------------------------- normal queries


def test_select_returns_columns_rows_and_count(conn) -> None:
    result = run_query(conn, "SELECT singer_id, name FROM singer WHERE singer_id <= 3 ORDER BY singer_id")
    assert result == QueryResult(
        columns=["singer_id", "name"],
        rows=[(1, "singer 1"), (2, "singer 2"), (3, "singer 3")],
        truncated=False,
        row_count=3,
    )


def test_path_argument_opens_and_closes(db_dir: Path) -> None:
    result = run_query(db_dir / "target.sqlite", "SELECT count(*) FROM concert")
    assert result.rows == [(10,)]


def test_missing_database_is_not_found(tmp_path: Path) -> None:
    with pytest.raises(SandboxError) as info:
        run_query(tmp_path / "nope.sqlite", "SELECT 1")
    assert info.value.kind == "not_found"


@pytest.mark.parametrize(
    ("sql", "expected"),
    [
        ("SELECT ';'", [(";",)]),
        ("SELECT ';' AS x;", [(";",)]),
        ("SELECT 1; -- trailing comment", [(1,)]),
        ("SELECT 1 /* a */ ; /* b */", [(1,)]),
        ("SELECT 1;;", [(1,)]),
        ("SELECT 'a;b'; ;", [("a;b",)]),
        ("-- leading comment\nSELECT 2", [(2,)]),
    ],
)
def test_one_statement_with_semicolons_and_comments(conn, sql: str, expected: list) -> None:
    assert run_query(conn, sql).rows == expected


@pytest.mark.parametrize(
    "sql", ["SELECT 1; SELECT 2", "SELECT ';'; SELECT 2", "SELECT 1; DROP TABLE singer", "SELECT 1;;SELECT 2"]
)
def test_second_statement_is_refused(conn, sql: str) -> None:
    err = refused(conn, sql)
    assert err.kind == "multiple_statements"
    assert str(err) == "only one SQL statement per call is allowed"


def test_row_cap_sets_truncated(conn) -> None:
    result = run_query(conn, "SELECT * FROM singer", max_rows=5)
    assert (result.row_count, result.truncated) == (5, True)
    assert len(run_query(conn, "SELECT * FROM singer", max_rows=None).rows) == 41
    exact = run_query(conn, "SELECT * FROM concert", max_rows=10)
    assert (exact.row_count, exact.truncated) == (10, False)


def test_char_cap_cuts_rows_and_clips_a_single_huge_value(conn) -> None:
    result = run_query(conn, "SELECT name FROM singer ORDER BY singer_id", max_rows=None, max_chars=40)
    assert result.truncated and 0 < result.row_count < 41
    assert sum(len(r[0]) for r in result.rows) <= 40
    big = run_query(conn, "SELECT printf('%.20000c', 'x')", max_chars=100)
    assert big.truncated and big.row_count == 1
    assert len(big.rows[0][0]) == 101  # 100 characters and an ellipsis


def test_invalid_utf8_in_database_is_decoded_with_replacement(conn) -> None:
    (name,) = run_query(conn, "SELECT name FROM singer WHERE singer_id = 100").rows[0]
    assert name.startswith("M") and "\ufffd" in name and name.endswith("ller\ufffd")


def test_read_only_pragmas_and_table_valued_functions_work(conn) -> None:
    cols = run_query(conn, "PRAGMA table_info(singer)").rows
    assert [c[1] for c in cols] == ["singer_id", "name", "country", "age"]
    fks = run_query(conn, "PRAGMA foreign_key_list(singer_in_concert)").rows
    assert {fk[2] for fk in fks} == {"concert", "singer"}
    names = run_query(conn, "SELECT name FROM pragma_table_info('concert')").rows
    assert names == [("concert_id",), ("title",), ("year",)]
    assert run_query(conn, "SELECT sum(value) FROM json_each('[1,2,3]')").rows == [(6,)]


def test_error_kinds_and_messages(conn) -> None:
    assert refused(conn, "SELECT nme FROM singer").kind == "error"
    assert "no such column: nme" in str(refused(conn, "SELECT nme FROM singer"))
    assert refused(conn, "SELEC 1").kind == "syntax"
    assert refused(conn, "SELECT (1").kind == "syntax"
    assert refused(conn, "").kind == "error"
    assert refused(conn, 42).kind == "error"  # type: ignore[arg-type]
    err = refused(conn, "INSERT INTO singer(name) VALUES ('x')")
    assert (err.kind, str(err)) == ("denied", "denied: write operations are not allowed (INSERT)")
    err = refused(conn, "WITH x AS (SELECT 1) DELETE FROM singer")
    assert err.kind == "denied" and "DELETE" in str(err)
    assert "PRAGMA journal_mode is not allowed" in str(refused(conn, "PRAGMA journal_mode = WAL"))
    assert "load_extension" in str(refused(conn, "SELECT load_extension('x')"))


def test_timeout_interrupts_runaway_query(conn) -> None:
    start = time.monotonic()
    endless = "WITH RECURSIVE r(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM r) SELECT count(*) FROM r"
    err = refused(conn, endless, timeout_s=0.2)
    assert err.kind == "timeout" and "0.2 s" in str(err)
    assert time.monotonic() - start < 0.7
    # The connection is still usable afterwards.
    assert run_query(conn, "SELECT count(*) FROM concert").rows == [(10,)]


def test_size_limits(conn) -> None:
    start = time.monotonic()
    assert refused(conn, "SELECT randomblob(1000000000)").kind == "too_large"
    assert refused(conn, "SELECT 'a' || '" + "b" * (MAX_SQL_CHARS + 1) + "'").kind == "too_large"
    assert time.monotonic() - start < 0.5


@pytest.mark.parametrize("sql", ["SELECT 1\x00", "SELECT '\ud800'", "SELECT '\udcff' -- surrogateescape"])
def test_nul_and_invalid_unicode_in_sql_are_clean_errors(conn, sql: str) -> None:
    assert refused(conn, sql).kind == "error"


def test_only_sandbox_connections_are_accepted(db_dir: Path) -> None:
    plain = sqlite3.connect(db_dir / "target.sqlite")
    try:
        assert refused(plain, "SELECT 1").kind == "error"
    finally:
        plain.close()


def test_vacuum_into_and_attach_create_no_files(db_dir: Path, conn) -> None:
    before = tree_state(db_dir)
    for sql in (
        f"VACUUM INTO '{db_dir / 'copy.sqlite'}'",
        f"ATTACH '{db_dir / 'new.sqlite'}' AS n",
        "PRAGMA journal_mode = WAL",
    ):
        assert refused(conn, sql).kind == "denied"
    assert tree_state(db_dir) == before


# ----------------------------------------------------------------------------- hostile corpus


def test_hostile_corpus_changes_nothing_and_respects_deadlines(db_dir: Path, conn) -> None:
    corpus = hostile_corpus(db_dir)
    assert len(corpus) >= 1000
    before = tree_state(db_dir)
    outcomes: dict[str, int] = {}
    for category, sql in corpus:
        start = time.monotonic()
        try:
            run_query(conn, sql, timeout_s=TIMEOUT_S, max_rows=200, max_chars=8000)
            outcome = "ran"
        except SandboxError as exc:
            outcome = exc.kind
        elapsed = time.monotonic() - start
        assert elapsed < TIMEOUT_S + 0.5, (category, sql[:200], elapsed)
        if category in DENIED:
            assert outcome == "denied", (category, sql[:200], outcome)
        elif category in MUST_FAIL:
            assert outcome != "ran", (category, sql[:200])
        else:
            assert category in MAY_RUN
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
    assert tree_state(db_dir) == before, "the corpus changed or created files"
    assert outcomes.get("timeout", 0) >= 3  # the runaway queries really ran into the deadline
    assert run_query(conn, "SELECT count(*) FROM singer").rows == [(41,)]
