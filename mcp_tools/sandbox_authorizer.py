"""The sandbox's authorizer (layer 3 of `mcp_tools.sandbox`): an allow-list checked at prepare time."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from typing import Protocol

from mcp_tools.sandbox_limits import clip_echo

#: PRAGMAs that only read the schema; every other PRAGMA is denied.
ALLOWED_PRAGMAS = frozenset(
    {"table_info", "table_xinfo", "index_list", "index_info", "index_xinfo", "foreign_key_list"}
)
#: Functions that reach outside the database (or take raw pointers); denied even if compiled in.
DENIED_FUNCTIONS = frozenset({"load_extension", "fts3_tokenizer", "readfile", "writefile", "edit"})
#: Eponymous virtual tables that expose the connection or the file rather than the data
#: (sqlite_stmt lists every prepared statement: other episodes' SQL on a shared connection).
DENIED_TABLES = frozenset({"sqlite_stmt", "dbstat", "sqlite_dbpage", "sqlite_dbdata", "sqlite_dbptr"})


class _RemembersDenial(Protocol):
    last_denial: str | None


_ACTION_NAMES: dict[int, str] = {
    getattr(sqlite3, name): name.removeprefix("SQLITE_").replace("_", " ")
    for name in dir(sqlite3)
    if name.startswith(("SQLITE_CREATE_", "SQLITE_DROP_"))
    or name
    in {
        "SQLITE_INSERT",
        "SQLITE_UPDATE",
        "SQLITE_DELETE",
        "SQLITE_ALTER_TABLE",
        "SQLITE_REINDEX",
        "SQLITE_ANALYZE",
        "SQLITE_ATTACH",
        "SQLITE_DETACH",
        "SQLITE_TRANSACTION",
        "SQLITE_SAVEPOINT",
    }
}
_WRITE_ACTIONS = {sqlite3.SQLITE_INSERT, sqlite3.SQLITE_UPDATE, sqlite3.SQLITE_DELETE}


def _denial_message(action: int, arg1: str | None, arg2: str | None) -> str:
    """Short reason for a denied action, for the model."""
    name = _ACTION_NAMES.get(action, f"action {action}")
    arg1, arg2 = clip_echo(arg1 or ""), clip_echo(arg2 or "")
    if action == sqlite3.SQLITE_READ:
        return f"table {arg1} is not allowed (it shows server internals, not data)"
    if action in _WRITE_ACTIONS:
        return f"write operations are not allowed ({name})"
    if action == sqlite3.SQLITE_PRAGMA:
        return f"PRAGMA {arg1} is not allowed (read-only PRAGMAs: {', '.join(sorted(ALLOWED_PRAGMAS))})"
    if action == sqlite3.SQLITE_FUNCTION:
        return f"function {arg2}() is not allowed"
    if action == sqlite3.SQLITE_ATTACH:
        return "ATTACH is not allowed"
    if action == sqlite3.SQLITE_DETACH:
        return "DETACH is not allowed"
    if action in (sqlite3.SQLITE_TRANSACTION, sqlite3.SQLITE_SAVEPOINT):
        return "transactions are not allowed"
    if "TEMP" in name:
        return f"temporary objects are not allowed ({name})"
    if action in _ACTION_NAMES:
        return f"schema changes are not allowed ({name})"
    return "only read-only SELECT queries are allowed"


def make_authorizer(conn: _RemembersDenial) -> Callable[[int, str | None, str | None, str | None, str | None], int]:
    """Allow-list authorizer: anything not explicitly read-only is denied (and the reason kept)."""
    ok, deny = sqlite3.SQLITE_OK, sqlite3.SQLITE_DENY
    always_ok = {sqlite3.SQLITE_SELECT, sqlite3.SQLITE_RECURSIVE}

    def authorizer(action: int, arg1: str | None, arg2: str | None, _db: str | None, _src: str | None) -> int:
        if action in always_ok:
            return ok
        # Reads name the table (also for count(*), with an empty column), so the check holds for
        # every way of reading these virtual tables, table-valued-function syntax included.
        if action == sqlite3.SQLITE_READ and (arg1 or "").lower() not in DENIED_TABLES:
            return ok
        if action == sqlite3.SQLITE_FUNCTION and (arg2 or "").lower() not in DENIED_FUNCTIONS:
            return ok
        if action == sqlite3.SQLITE_PRAGMA and (arg1 or "").lower() in ALLOWED_PRAGMAS:
            return ok
        # The first use of an eponymous virtual table (json_each, pragma_table_info, ...) on a
        # connection is authorized as an UPDATE of sqlite_master's columns, though nothing is
        # written. A real `UPDATE sqlite_master` never reaches the authorizer: SQLite refuses it
        # earlier ("may not be modified") unless writable_schema is on, and that PRAGMA is denied.
        if action == sqlite3.SQLITE_UPDATE and arg1 in ("sqlite_master", "sqlite_schema"):
            return ok
        if conn.last_denial is None:  # keep the first reason: later ones are consequences of it
            conn.last_denial = _denial_message(action, arg1, arg2)
        return deny

    return authorizer


__all__ = ["ALLOWED_PRAGMAS", "DENIED_FUNCTIONS", "DENIED_TABLES", "make_authorizer"]
