"""Database resolution, pooled sandbox connections and cached schema for the SQLite MCP server.

A `Catalog` maps a `db_id` to a file (Spider layout `<db_root>/<db_id>/<db_id>.sqlite`, or one
fixed file), hands out sandboxed read-only connections (a few idle ones kept per database, an LRU
bound on how many databases stay open), and caches each database's schema. Thread-safe: the MCP
server runs tool bodies on worker threads, one connection per running query.
"""

from __future__ import annotations

import difflib
import logging
import os
import threading
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from mcp_tools.sandbox import SandboxConnection, SandboxError, open_readonly, run_query
from mcp_tools.sandbox_limits import MAX_ECHO_CHARS, clip_echo

logger = logging.getLogger(__name__)

#: Names listed in an "unknown db_id/table" message before "... and N more".
MAX_NAMES_IN_ERROR = 25
#: Time allowed to count one table's rows for the schema (over it: "? rows").
ROW_COUNT_TIMEOUT_S = 0.5


class CatalogError(Exception):
    """Unknown database or table; the message (for the model) lists valid names."""


@dataclass(frozen=True)
class ColumnInfo:
    name: str
    type: str
    pk: bool
    notnull: bool


@dataclass(frozen=True)
class TableInfo:
    """Columns, primary key, foreign keys `(column, ref_table, ref_column|None)` and row count."""

    name: str
    columns: list[ColumnInfo]
    foreign_keys: list[tuple[str, str, str | None]]
    row_count: int | None  # None if counting timed out


@dataclass
class _OpenDb:
    """Idle connections and cached schema of one database."""

    path: Path
    max_idle: int
    idle: list[SandboxConnection] = field(default_factory=list)
    tables: list[TableInfo] | None = None
    closed: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)

    def acquire(self) -> SandboxConnection:
        with self.lock:
            if self.idle:
                return self.idle.pop()
        return open_readonly(self.path)

    def release(self, conn: SandboxConnection) -> None:
        with self.lock:
            if not self.closed and len(self.idle) < self.max_idle:
                self.idle.append(conn)
                return
        conn.close()

    def close(self) -> None:
        with self.lock:
            self.closed = True
            idle, self.idle = self.idle, []
        for conn in idle:
            conn.close()


def names_hint(kind: str, wanted: str, valid: list[str]) -> str:
    """'unknown <kind> 'x'; did you mean ...? Valid (N): a, b, ...' (long lists and names are cut)."""
    # The name is the caller's input (a 1 MB table name made a 1 MB error): quote a clipped repr.
    msg = f"unknown {kind} {clip_echo(repr(wanted))}."
    wanted = wanted[: 2 * MAX_ECHO_CHARS]  # no valid name is that long; keeps difflib cheap
    close = difflib.get_close_matches(wanted, valid, n=3, cutoff=0.6)
    lower = [v for v in valid if v.lower() == wanted.lower()]
    if lower or close:
        msg += f" Did you mean: {', '.join(dict.fromkeys(lower + close))}?"
    shown = ", ".join(valid[:MAX_NAMES_IN_ERROR])
    more = f", ... and {len(valid) - MAX_NAMES_IN_ERROR} more" if len(valid) > MAX_NAMES_IN_ERROR else ""
    return f"{msg} Valid {kind}s ({len(valid)}): {shown}{more}"


def quote_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def find_table(tables: list[TableInfo], name: str) -> TableInfo:
    """The table called `name` (exact match first, then case-insensitive); CatalogError otherwise."""
    for t in tables:
        if t.name == name:
            return t
    for t in tables:
        if t.name.lower() == name.lower():
            return t
    raise CatalogError(names_hint("table", name, [t.name for t in tables]))


class Catalog:
    """Resolves db ids and serves sandboxed connections and schema; see the module docstring.

    Exactly one of `db_root` (Spider layout, every call names a db_id) or `db_path` (one database;
    the db_id argument is ignored) must be given.
    """

    def __init__(
        self,
        *,
        db_root: str | Path | None = None,
        db_path: str | Path | None = None,
        max_open_dbs: int = 32,
        idle_per_db: int = 4,
        timeout_s: float = 5.0,
    ) -> None:
        if (db_root is None) == (db_path is None):
            raise ValueError("give exactly one of db_root or db_path")
        self.db_root = Path(db_root) if db_root is not None else None
        self.db_path = Path(db_path) if db_path is not None else None
        if self.db_root is not None and not self.db_root.is_dir():
            raise ValueError(f"db root is not a directory: {self.db_root}")
        if self.db_path is not None and not self.db_path.is_file():
            raise ValueError(f"database file not found: {self.db_path}")
        self.max_open_dbs = max_open_dbs
        self.idle_per_db = idle_per_db
        self.timeout_s = timeout_s
        self._open: OrderedDict[str, _OpenDb] = OrderedDict()
        self._ids: list[str] = []
        self._id_set: frozenset[str] = frozenset()
        self._lock = threading.Lock()
        self._scan()

    # ------------------------------------------------------------------ resolution

    @property
    def single(self) -> bool:
        """True when bound to one database file (`--db`)."""
        return self.db_path is not None

    def _scan(self) -> None:
        if self.db_root is None:
            assert self.db_path is not None
            ids = [self.db_path.stem]
        else:
            ids = sorted(
                p.name for p in self.db_root.iterdir()
                if p.is_dir() and (p / f"{p.name}.sqlite").is_file() and self._inside_root(p / f"{p.name}.sqlite")
            )
        self._ids, self._id_set = ids, frozenset(ids)

    def db_ids(self) -> list[str]:
        """Known database ids (the single database's file stem in `db_path` mode)."""
        return list(self._ids)

    def _resolve(self, db_id: str) -> tuple[str, Path]:
        if self.db_path is not None:
            return self._ids[0], self.db_path
        assert self.db_root is not None
        if db_id not in self._id_set:
            self._scan()  # a database may have been added since start
            if db_id not in self._id_set:
                raise CatalogError(names_hint("db_id", db_id, self._ids))
        # db_id comes from the directory listing; its real path must still be inside db_root (a
        # symlinked directory or file would serve a database from anywhere).
        path = self.db_root / db_id / f"{db_id}.sqlite"
        if not self._inside_root(path):
            raise CatalogError(f"db_id {db_id!r} resolves outside the database root")
        return db_id, path

    def _inside_root(self, path: Path) -> bool:
        assert self.db_root is not None
        root = os.path.realpath(self.db_root)
        return os.path.commonpath([root, os.path.realpath(path)]) == root

    def _entry(self, db_id: str) -> _OpenDb:
        key, path = self._resolve(db_id)
        evicted: list[_OpenDb] = []
        with self._lock:
            entry = self._open.get(key)
            if entry is None:
                entry = _OpenDb(path=path, max_idle=self.idle_per_db)
                self._open[key] = entry
                while len(self._open) > self.max_open_dbs:
                    evicted.append(self._open.popitem(last=False)[1])
            else:
                self._open.move_to_end(key)
        for old in evicted:
            old.close()
        return entry

    @contextmanager
    def connection(self, db_id: str) -> Iterator[SandboxConnection]:
        """A sandboxed connection to `db_id`, returned to the pool afterwards."""
        entry = self._entry(db_id)
        conn = entry.acquire()
        try:
            yield conn
        finally:
            entry.release(conn)

    def close(self) -> None:
        """Close every pooled connection (in-use ones close when released)."""
        with self._lock:
            entries, self._open = list(self._open.values()), OrderedDict()
        for entry in entries:
            entry.close()

    # ------------------------------------------------------------------ schema

    def tables(self, db_id: str) -> list[TableInfo]:
        """All tables and views of `db_id` (cached after the first call)."""
        entry = self._entry(db_id)
        if entry.tables is None:
            conn = entry.acquire()
            try:
                entry.tables = self._load_tables(conn)
            finally:
                entry.release(conn)
        return entry.tables

    def loaded_tables(self, db_id: str) -> list[TableInfo] | None:
        """The cached schema of `db_id`, or None if it has not been loaded yet (no SQL runs)."""
        return self._entry(db_id).tables

    def table(self, db_id: str, name: str) -> TableInfo:
        """One table by name (case-insensitive, as in SQLite); CatalogError lists valid names."""
        return find_table(self.tables(db_id), name)

    def _load_tables(self, conn: SandboxConnection) -> list[TableInfo]:
        t = self.timeout_s
        master = run_query(
            conn,
            "SELECT name FROM sqlite_master WHERE type IN ('table','view') AND name NOT LIKE 'sqlite_%' ORDER BY rowid",
            timeout_s=t,
            max_rows=None,
        )
        out: list[TableInfo] = []
        for (name,) in master.rows:
            q = quote_ident(name)
            cols = run_query(conn, f"PRAGMA table_info({q})", timeout_s=t, max_rows=None).rows
            fks = run_query(conn, f"PRAGMA foreign_key_list({q})", timeout_s=t, max_rows=None).rows
            try:  # a short budget: a huge table shows "? rows" rather than stalling the schema
                count = run_query(conn, f"SELECT count(*) FROM {q}", timeout_s=min(t, ROW_COUNT_TIMEOUT_S)).rows[0][0]
            except SandboxError as exc:
                logger.info("row count of %s failed: %s", name, exc)
                count = None
            out.append(
                TableInfo(
                    name=name,
                    # table_info rows: cid, name, type, notnull, dflt_value, pk
                    columns=[ColumnInfo(c[1], c[2] or "", bool(c[5]), bool(c[3])) for c in cols],
                    # foreign_key_list rows: id, seq, table, from, to, on_update, on_delete, match
                    foreign_keys=[(fk[3], fk[2], fk[4]) for fk in fks],
                    row_count=count,
                )
            )
        return out
