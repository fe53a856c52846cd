"""Schema description of a built-in database and how it is written to a SQLite file."""

from __future__ import annotations

import random
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from skyrl_tool_agent.data.builtin.templates import Template

Row = tuple[Any, ...]

# Size bounds every table must respect (keeps data/processed small yet non-trivial).
MIN_ROWS, MAX_ROWS = 20, 200


@dataclass(frozen=True)
class Table:
    """One table: ordered (name, type-and-constraints) columns plus foreign keys."""

    name: str
    columns: tuple[tuple[str, str], ...]
    foreign_keys: tuple[tuple[str, str, str], ...] = ()  # (column, referenced table, referenced column)

    def ddl(self) -> str:
        """CREATE TABLE statement (one column per line, foreign keys last)."""
        lines = [f"  {name} {decl}" for name, decl in self.columns]
        lines += [f"  FOREIGN KEY ({col}) REFERENCES {ref} ({ref_col})" for col, ref, ref_col in self.foreign_keys]
        return f"CREATE TABLE {self.name} (\n" + ",\n".join(lines) + "\n)"


@dataclass(frozen=True)
class Domain:
    """A built-in database: schema, a seeded row generator and its question templates.

    `populate(rng)` returns rows per table name, each row a tuple in column order. Tables are created
    and filled in `tables` order, so parents must come before the tables that reference them.
    """

    db_id: str
    tables: tuple[Table, ...]
    populate: Callable[[random.Random], dict[str, list[Row]]]
    templates: tuple[Template, ...] = field(default=())


def create_database(domain: Domain, path: Path, seed: int) -> dict[str, int]:
    """Write `domain` to a fresh SQLite file at `path`; returns rows per table.

    Deterministic: the same seed gives the same rows in the same insert order, so the file bytes
    only depend on the SQLite library version.
    """
    rng = random.Random(f"{seed}:{domain.db_id}")
    rows = domain.populate(rng)
    if set(rows) != {t.name for t in domain.tables}:
        raise ValueError(f"{domain.db_id}: populate() returned tables {sorted(rows)}")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    counts: dict[str, int] = {}
    con = sqlite3.connect(path)
    try:
        con.execute("PRAGMA foreign_keys = ON")  # catch a generator bug that breaks referential integrity
        for table in domain.tables:
            con.execute(table.ddl())
            table_rows = rows[table.name]
            if not MIN_ROWS <= len(table_rows) <= MAX_ROWS:
                raise ValueError(f"{domain.db_id}.{table.name}: {len(table_rows)} rows, want {MIN_ROWS}-{MAX_ROWS}")
            marks = ", ".join("?" * len(table.columns))
            con.executemany(f"INSERT INTO {table.name} VALUES ({marks})", table_rows)
            counts[table.name] = len(table_rows)
        con.commit()
    finally:
        con.close()
    return counts
