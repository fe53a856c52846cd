"""A built-in database: its schema, how it is written to a SQLite file, and its question templates
(paraphrased questions + canonical gold SQL with slots filled from the database)."""

from __future__ import annotations

import random
import sqlite3
import string
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import sqlglot
from sqlglot import exp


@dataclass(frozen=True)
class Template:
    """One question pattern.

    `sql` and every string in `questions` are `str.format` patterns over the same slot names.
    `slots` is a SQL query over the template's database whose result columns are named like the
    slots; each distinct result row is one candidate instance (values come from real rows, so
    most answers are non-empty). A template without slots has exactly one instance.
    Text slots sit between single quotes in both question and SQL, so the value is copied verbatim.
    """

    local_id: str
    sql: str
    questions: tuple[str, ...]
    slots: str | None = None

    def slot_names(self) -> set[str]:
        return _fields(self.sql)

    def check(self) -> None:
        """Raise ValueError when a paraphrase does not mention every slot, or vice versa."""
        if not self.questions:
            raise ValueError(f"{self.local_id}: no questions")
        names = self.slot_names()
        if bool(names) != (self.slots is not None):
            raise ValueError(f"{self.local_id}: slots query and SQL placeholders disagree")
        for question in self.questions:
            if _fields(question) != names:
                raise ValueError(f"{self.local_id}: {question!r} uses {_fields(question)}, SQL uses {names}")


def T(local_id: str, sql: str, *questions: str, slots: str | None = None) -> Template:
    """Shorthand used by the domain modules: T(id, sql, question, paraphrase, ..., slots=...)."""
    return Template(local_id=local_id, sql=sql, questions=tuple(questions), slots=slots)


def _fields(pattern: str) -> set[str]:
    return {name for _, name, _, _ in string.Formatter().parse(pattern) if name}


def format_value(value: Any) -> str:
    """How a slot value is written, identically in question and SQL."""
    if isinstance(value, float):
        return f"{value:.2f}".rstrip("0").rstrip(".") if value != int(value) else str(int(value))
    text = str(value)
    if "'" in text:
        raise ValueError(f"slot value {text!r} contains a single quote")
    return text


def slot_candidates(template: Template, con: sqlite3.Connection) -> list[dict[str, str]]:
    """Distinct slot assignments (formatted), in a stable order; rows with a NULL are dropped."""
    if template.slots is None:
        return [{}]
    cursor = con.execute(template.slots)
    names = [d[0] for d in cursor.description]
    if set(names) != template.slot_names():
        raise ValueError(f"{template.local_id}: slot query columns {names} != {sorted(template.slot_names())}")
    seen: dict[tuple[str, ...], None] = {}
    for row in cursor.fetchall():
        if any(v is None for v in row):
            continue
        seen[tuple(format_value(v) for v in row)] = None
    return [dict(zip(names, values)) for values in sorted(seen)]


def has_answer(rows: list[tuple[Any, ...]]) -> bool:
    """A result counts as non-empty when some cell is not NULL (e.g. AVG over no rows is empty)."""
    return any(v is not None for row in rows for v in row)


def limit_is_ambiguous(con: sqlite3.Connection, sql: str) -> bool:
    """True when a top-level ORDER BY ... LIMIT k cuts through a tie on the sort key.

    Then several answers are equally right and execution match would be a coin flip, so such
    instances are dropped. Checked by re-running the query selecting the sort keys with LIMIT k+1.
    """
    if "LIMIT" not in sql.upper():  # cheap pre-check: parsing every candidate dominates build time
        return False
    tree = sqlglot.parse_one(sql, read="sqlite")
    if not isinstance(tree, exp.Select):
        return False
    order, limit = tree.args.get("order"), tree.args.get("limit")
    if order is None or limit is None:
        return False
    k = int(limit.expression.name)
    probe = tree.copy()
    probe.set("expressions", [o.this.copy() for o in order.expressions])
    probe.set("limit", exp.Limit(expression=exp.Literal.number(k + 1)))
    keys = con.execute(probe.sql(dialect="sqlite")).fetchall()
    return len(keys) > k and keys[k - 1] == keys[k]


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
