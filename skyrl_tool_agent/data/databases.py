"""A task's db_id resolved to its database file exactly as the SQLite MCP server resolves it.

The server (`mcp_tools.sqlite_catalog.Catalog`) serves a db_id only when it is one of the names
it lists under its database root: a directory `<root>/<db_id>/` holding `<db_id>.sqlite`, whose
real path (links followed) lies inside the root. Anything else is unknown to it; it never builds a
path from a name it does not list. `DatabaseRoot` asks that same listing, so the load-time data
check and the report's result previews accept exactly the databases the server would serve: an
absolute db_id, `../x`, a link out of the root, a NUL byte or a name too long for a file are
refused, in words that say which, before any file is opened.
"""

from __future__ import annotations

import os
from pathlib import Path

from mcp_tools.sqlite_catalog import Catalog

__all__ = ["DATABASE_SUFFIX", "DatabaseRoot", "UnservedDatabaseError", "name_problem", "shown_name"]

#: A database's file name is `<db_id>` + this (Spider layout).
DATABASE_SUFFIX = ".sqlite"
#: Longest file name (bytes) on the file systems the server runs on (Linux and macOS NAME_MAX).
_NAME_MAX_BYTES = 255
#: Characters of a name quoted in a message (the rest is cut: a 4 kB db_id made a 4 kB error line).
_SHOWN_CHARS = 200


class UnservedDatabaseError(ValueError):
    """A db_id the SQLite server would not serve from its root; the message says why, in one line."""


def shown_name(name: str) -> str:
    """`name` quoted for a one-line message: its repr (control characters escaped), clipped."""
    if len(name) <= _SHOWN_CHARS:
        return repr(name)
    return f"{repr(name[:_SHOWN_CHARS])[:-1]}…' ({len(name):,} characters)"


def file_state(db_path: str | Path) -> tuple[object, ...] | None:
    """A database file as it is now, for keying what was computed from it in this process: its
    real path, inode, size and change times, and its write-ahead log's size and time (pages
    written there change what a query reads without touching the file); None if it cannot be
    stat'ed."""
    try:
        st = os.stat(db_path)
    except OSError:
        return None
    try:
        wal = os.stat(f"{db_path}-wal")
    except OSError:
        wal_state = None
    else:
        wal_state = (wal.st_size, wal.st_mtime_ns)
    return os.path.realpath(db_path), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns, wal_state


def name_problem(db_id: str) -> str | None:
    """Why `db_id` cannot name a database directory at all, looking at no file (None: it can)."""
    if "\x00" in db_id:
        return "holds a NUL character, which no file name can"
    if db_id in ("", ".", "..") or os.sep in db_id or (os.altsep and os.altsep in db_id):
        return "is a path, not the name of one database directory"
    size = len(db_id.encode("utf-8", "surrogateescape"))
    if size > _NAME_MAX_BYTES - len(DATABASE_SUFFIX):
        return f"is {size:,} bytes long; a database file name <db_id>{DATABASE_SUFFIX} has at most {_NAME_MAX_BYTES}"
    return None


def _inside(root: str, path: str) -> bool:
    return os.path.commonpath([root, path]) == root


class DatabaseRoot:
    """The databases the SQLite server serves from `root` (module doc); a snapshot of its listing,
    taken when this is built (a missing root serves none)."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        self._real_root = os.path.realpath(self.root)
        self._served = frozenset(Catalog(db_root=self.root).db_ids()) if self.root.is_dir() else frozenset()

    def path(self, db_id: str) -> Path:
        """The file the server opens for `db_id`; `UnservedDatabaseError` when it would refuse it."""
        if db_id in self._served:
            path = self.root / db_id / f"{db_id}{DATABASE_SUFFIX}"
            if _inside(self._real_root, os.path.realpath(path)):  # as the server checks again on each call
                return path
        raise UnservedDatabaseError(self._why_not(db_id))

    def _why_not(self, db_id: str) -> str:
        """`db_id` is not served: say why, looking at the file system only for a plain file name."""
        name = shown_name(db_id)
        if (problem := name_problem(db_id)) is not None:
            root = os.path.abspath(self.root)
            if "\x00" not in db_id and not _inside(root, os.path.normpath(os.path.join(root, db_id))):
                return f"db_id {name} resolves outside the database root {self.root}"  # `..`, `/abs`: a path out
            return f"db_id {name} {problem} (database root {self.root})"
        directory = self.root / db_id
        file = directory / f"{db_id}{DATABASE_SUFFIX}"
        try:
            if not os.path.lexists(directory):
                return f"unknown db_id {name}: {file} does not exist"
            if not _inside(self._real_root, os.path.realpath(directory)) or (
                    os.path.lexists(file) and not _inside(self._real_root, os.path.realpath(file))):
                return f"db_id {name} resolves outside the database root {self.root}"
            if not directory.is_dir():
                return f"unknown db_id {name}: {directory} is not a directory"
            if not file.is_file():
                return f"database file missing: {file}"
        except OSError as exc:  # e.g. a permission denied on the way
            return f"db_id {name} cannot be looked up under {self.root} ({exc.strerror or exc})"
        return f"db_id {name} is not a database the SQLite server serves from {self.root}"
