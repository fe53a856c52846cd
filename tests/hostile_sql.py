"""A generated corpus of hostile SQL inputs for the sandbox tests (not a test module itself).

`make_hostile_db(dir)` builds the target database (plus a second file to ATTACH); `hostile_corpus()`
returns (category, sql) pairs: writes, DDL, ATTACH, PRAGMA writes, transactions, VACUUM (INTO),
load_extension, internal virtual tables (sqlite_stmt shows other callers' SQL), runaway queries,
size bombs (printf/trim single-operation bombs too), encoding garbage, multiple statements. Base statements
are multiplied by meaning-preserving mutations (case, comments, whitespace, trailing semicolons),
so each one must still be refused for the reason it was written for.
"""

from __future__ import annotations

import hashlib
import random
import sqlite3
from pathlib import Path

TABLES = ("singer", "concert", "singer_in_concert")

#: Categories whose every input must be refused as "denied" (not merely fail to parse).
DENIED = frozenset({"write", "ddl", "attach", "pragma", "transaction", "vacuum", "internal"})
#: Categories whose every input must be refused (SandboxError of any kind).
MUST_FAIL = DENIED | {"extension", "escape", "multi", "size", "encoding", "redos"}
#: Categories that may run (a capped result) or be refused, but must respect the deadline.
MAY_RUN = frozenset({"runaway", "garbage"})


def tree_state(directory: Path) -> dict[str, str]:
    """sha256 of every file under `directory`, by relative path (new files show up as new keys)."""
    return {
        str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(directory.rglob("*"))
        if p.is_file()
    }


def make_hostile_db(directory: Path) -> Path:
    """`directory/target.sqlite` (three small related tables) and `directory/other.sqlite`."""
    directory.mkdir(parents=True, exist_ok=True)
    db = directory / "target.sqlite"
    conn = sqlite3.connect(db)
    conn.executescript(
        """
        PRAGMA synchronous = OFF;  -- test data: no fsync needed
        CREATE TABLE singer(singer_id INTEGER PRIMARY KEY, name TEXT NOT NULL, country TEXT, age INT);
        CREATE TABLE concert(concert_id INTEGER PRIMARY KEY, title TEXT, year INT);
        CREATE TABLE singer_in_concert(concert_id INT REFERENCES concert(concert_id),
                                       singer_id INT REFERENCES singer(singer_id),
                                       PRIMARY KEY (concert_id, singer_id));
        CREATE INDEX singer_country ON singer(country);
        CREATE VIEW older AS SELECT name FROM singer WHERE age > 40;
        """
    )
    conn.executemany(
        "INSERT INTO singer VALUES (?,?,?,?)",
        [(i, f"singer {i}", ["France", "Peru", "Japan"][i % 3], 20 + i) for i in range(1, 41)],
    )
    conn.executemany("INSERT INTO concert VALUES (?,?,?)", [(i, f"concert {i}", 2000 + i) for i in range(1, 11)])
    conn.executemany(
        "INSERT INTO singer_in_concert VALUES (?,?)", [(c, s) for c in range(1, 11) for s in range(c, c + 4)]
    )
    # Text that is not valid UTF-8, as some real databases hold.
    conn.execute("INSERT INTO singer VALUES (100, CAST(x'4dfc6c6c6572ff' AS TEXT), 'Germany', 50)")
    conn.commit()
    conn.close()
    other = sqlite3.connect(directory / "other.sqlite")
    other.execute("CREATE TABLE secret(x)")
    other.commit()
    other.close()
    return db


def _base(directory: Path) -> list[tuple[str, str]]:
    d = directory
    out: list[tuple[str, str]] = []
    add = out.append
    for t in TABLES:
        add(("write", f"INSERT INTO {t} DEFAULT VALUES"))
        add(("write", f"INSERT INTO {t} SELECT * FROM {t}"))
        add(("write", f"INSERT OR REPLACE INTO {t} SELECT * FROM {t}"))
        add(("write", f"REPLACE INTO {t} SELECT * FROM {t} LIMIT 1"))
        add(("write", f"UPDATE {t} SET rowid = rowid"))
        add(("write", f"UPDATE OR IGNORE {t} SET rowid = rowid + 1000 WHERE 1"))
        add(("write", f"DELETE FROM {t}"))
        add(("write", f"DELETE FROM {t} WHERE rowid IN (SELECT rowid FROM {t} LIMIT 1) RETURNING *"))
        add(("write", f"WITH x AS (SELECT 1) DELETE FROM {t}"))
        add(("write", f"WITH x(a) AS (SELECT 1) INSERT INTO {t}(rowid) SELECT a + 100000 FROM x"))
        add(("ddl", f"DROP TABLE {t}"))
        add(("ddl", f"DROP TABLE IF EXISTS {t}"))
        add(("ddl", f"ALTER TABLE {t} RENAME TO {t}_old"))
        add(("ddl", f"ALTER TABLE {t} ADD COLUMN pwned TEXT"))
        add(("ddl", f"CREATE INDEX idx_{t}_pwn ON {t}(rowid)"))
        add(("ddl", f"CREATE TEMP TABLE tmp_{t} AS SELECT * FROM {t}"))
        add(("ddl", f"CREATE TEMP VIEW tv_{t} AS SELECT * FROM {t}"))
        add(("ddl", f"CREATE TEMP TRIGGER tr_{t} AFTER DELETE ON {t} BEGIN SELECT 1; END"))
        add(("ddl", f"CREATE TRIGGER trg_{t} AFTER INSERT ON {t} BEGIN DELETE FROM {t}; END"))
        add(("ddl", f"CREATE TABLE copy_{t} AS SELECT * FROM {t}"))
        add(("ddl", f"REINDEX {t}"))
        add(("ddl", f"ANALYZE {t}"))
    for stmt in (
        "CREATE TABLE pwned(x)",
        "CREATE TEMP TABLE pwned(x)",
        "CREATE TEMPORARY TABLE pwned AS SELECT 1",
        "CREATE VIEW v_pwned AS SELECT 1",
        "CREATE VIRTUAL TABLE vt USING fts5(a)",
        "CREATE VIRTUAL TABLE temp.vt USING rtree(id, a, b)",
        "DROP VIEW older",
        "DROP INDEX singer_country",
        "REINDEX",
        "ANALYZE",
        "ANALYZE sqlite_master",
        "UPDATE sqlite_master SET sql = 'x'",
        "WITH x AS (SELECT 1) UPDATE sqlite_master SET sql = 'x'",
        "WITH x AS (SELECT 1) INSERT INTO sqlite_master SELECT * FROM sqlite_master",
        "INSERT INTO sqlite_master VALUES ('table','x','x',0,'CREATE TABLE x(a)')",
        "DELETE FROM sqlite_master",
        "CREATE TABLE temp.t(x)",
        "CREATE INDEX temp.i ON singer(name)",
    ):
        add(("ddl", stmt))
    for target in (d / "other.sqlite", d / "new_file.sqlite", ":memory:", "", f"file:{d / 'uri.sqlite'}?mode=rwc"):
        add(("attach", f"ATTACH DATABASE '{target}' AS pwn"))
        add(("attach", f"ATTACH '{target}' AS main2"))
    add(("attach", "DETACH DATABASE main"))
    add(("attach", "DETACH temp"))
    add(("escape", "SELECT * FROM other.secret"))  # not attached: an error, never data
    add(("escape", f"SELECT * FROM '{d / 'other.sqlite'}'.secret"))
    add(("escape", "SELECT * FROM temp.sqlite_master WHERE 0 UNION ALL SELECT * FROM main.sqlite_master WHERE x"))
    for pragma in (
        "journal_mode = WAL",
        "journal_mode = DELETE",
        "journal_mode = OFF",
        "journal_mode = MEMORY",
        "main.journal_mode = TRUNCATE",
        "journal_mode",
        "writable_schema = 1",
        "writable_schema = ON",
        "writable_schema = RESET",
        "query_only = 0",
        "query_only = OFF",
        "user_version = 42",
        "application_id = 7",
        "schema_version = 99",
        "locking_mode = EXCLUSIVE",
        "synchronous = OFF",
        "foreign_keys = ON",
        "temp_store = FILE",
        "temp_store_directory = '/tmp'",
        "cache_size = -100000",
        "mmap_size = 268435456",
        "page_size = 512",
        "auto_vacuum = FULL",
        "wal_checkpoint(TRUNCATE)",
        "incremental_vacuum",
        "optimize",
        "shrink_memory",
        "case_sensitive_like = 1",
        "recursive_triggers = ON",
        "trusted_schema = ON",
        "cell_size_check = ON",
        "legacy_alter_table = ON",
        "hard_heap_limit = 1",
        "soft_heap_limit = 1",
        "threads = 8",
        "integrity_check",
        "quick_check",
        "database_list",
        "compile_options",
        "data_version",
        "busy_timeout = 100000",
        "encoding = 'UTF-16'",
        "secure_delete = ON",
        "max_page_count = 1",
        "defer_foreign_keys = ON",
        "reverse_unordered_selects = ON",
        "analysis_limit = 1",
        "temp.journal_mode = WAL",
    ):
        add(("pragma", f"PRAGMA {pragma}"))
    for stmt in (
        "BEGIN",
        "BEGIN IMMEDIATE",
        "BEGIN EXCLUSIVE",
        "BEGIN DEFERRED TRANSACTION",
        "COMMIT",
        "END",
        "ROLLBACK",
        "SAVEPOINT sp1",
        "RELEASE sp1",
        "ROLLBACK TO sp1",
    ):
        add(("transaction", stmt))
    for target in ("vac.sqlite", d / "vac_abs.sqlite", d / "sub" / "x.sqlite", f"file:{d / 'vac_uri.sqlite'}"):
        add(("vacuum", f"VACUUM INTO '{target}'"))
        add(("vacuum", f"VACUUM main INTO '{target}'"))
    add(("vacuum", "VACUUM"))
    add(("vacuum", "VACUUM main"))
    add(("vacuum", "VACUUM temp"))
    for lib in ("/lib/x86_64-linux-gnu/libc.so.6", "libsqlitefunctions", "./evil.so", ""):
        add(("extension", f"SELECT load_extension('{lib}')"))
        add(("extension", f"SELECT load_extension('{lib}', 'sqlite3_extension_init')"))
        add(("extension", f"SELECT name FROM singer WHERE load_extension('{lib}') IS NULL"))
    for stmt in (
        "SELECT * FROM sqlite_stmt",
        "SELECT sql FROM main.sqlite_stmt WHERE busy",
        "SELECT count(*) FROM sqlite_stmt",
        "SELECT name FROM singer WHERE EXISTS (SELECT 1 FROM sqlite_stmt)",
        "SELECT * FROM dbstat",
        "SELECT sum(pgsize) FROM dbstat('main')",
    ):
        add(("internal", stmt))
    add(("extension", "SELECT fts3_tokenizer('simple')"))
    add(("extension", "SELECT writefile('/tmp/pwned', 'x')"))  # not compiled in: an error either way
    add(("extension", "SELECT readfile('/etc/passwd')"))
    # Runaway work (must stop at the deadline); a few of each shape, since each costs a timeout.
    add(("runaway", "WITH RECURSIVE r(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM r) SELECT count(*) FROM r"))
    add(("runaway", "WITH RECURSIVE r(i) AS (SELECT 1 UNION ALL SELECT i FROM r) SELECT max(i) FROM r"))
    add(("runaway", "WITH RECURSIVE r(s) AS (SELECT 'a' UNION ALL SELECT s || 'a' FROM r) SELECT count(*) FROM r"))
    add(("runaway", "SELECT count(*) FROM singer a, singer b, singer c, singer d, singer e, singer f"))
    add(("runaway", "SELECT * FROM singer a, singer b, singer c, singer d ORDER BY random()"))
    add(("runaway", "SELECT a.name FROM singer a, singer b, singer c, singer d, singer e"))  # rows capped
    add(("runaway", "SELECT sum(length(hex(randomblob(1000)))) FROM singer a, singer b, singer c, singer d"))
    add(
        (
            "runaway",
            "WITH RECURSIVE r(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM r LIMIT 100000000) "
            "SELECT count(*) FROM r a JOIN r b ON a.i = b.i",
        )
    )
    # Superlinear built-ins at the largest value size: one VM operation the deadline cannot split.
    big = "replace(hex(zeroblob(16000)), '0', 'a')"  # 32,000 characters
    add(("runaway", f"SELECT instr({big}, substr({big}, 1, 16000) || 'b')"))
    add(("runaway", f"SELECT length(replace({big}, substr({big}, 1, 16000) || 'b', 'x'))"))
    add(
        (
            "runaway",
            f"SELECT length(trim({big}, (SELECT group_concat(char(i + 256), '') FROM "
            "(WITH RECURSIVE r(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM r LIMIT 2700) SELECT i FROM r)) || 'a'))",
        )
    )
    # Size bombs: each must be refused by a limit, not allocated.
    for n in (10**6, 10**8, 10**9, 2**31 - 1, 2**62):
        add(("size", f"SELECT randomblob({n})"))
        add(("size", f"SELECT zeroblob({n})"))
        add(("size", f"SELECT length(zeroblob({n}))"))
        add(("size", f"SELECT hex(randomblob({n} / 2))"))
    add(("size", "SELECT replace(hex(zeroblob(40000)), '0', 'aa')"))
    # One VM operation of 2**31 steps in SQLite 3.40 (13 s), whatever the length limit.
    for fmt in ("'%.*c', 2147483647", "'%.2147483647c'", "'%!.*c', 2147483647", "'%*.*c', 1, 6442450943"):
        add(("size", f"SELECT length(printf({fmt}, 'x'))"))
        add(("size", f"SELECT length(format({fmt}, name)) FROM singer LIMIT 3"))
    add(("size", "SELECT group_concat(hex(randomblob(10000))) FROM singer a, singer b"))
    add(("size", "SELECT 'x' || '" + "A" * 1_000_000 + "'"))  # a 1 MB literal
    add(("size", "SELECT 1 WHERE 1 IN (" + ",".join(["1"] * 60_000) + ")"))
    add(("size", "SELECT " + "(" * 5000 + "1" + ")" * 5000))
    add(("size", "SELECT " + "+".join(["1"] * 30_000)))
    add(("size", "SELECT " + ",".join(["1"] * 3000)))
    add(("size", "SELECT name FROM singer WHERE name LIKE '" + "%a" * 1000 + "'"))
    add(("size", "SELECT name FROM singer WHERE name GLOB '" + "*a" * 1000 + "'"))
    add(("size", " UNION ALL ".join(["SELECT 1"] * 600)))
    # Encoding garbage and control characters.
    for sql in (
        "SELECT 1\x00",
        "\x00SELECT 1",
        "SELECT '\x00'",
        "SELECT name FROM singer WHERE name = 'a\x00b'",
        "SELECT '\ud800'",
        "SELECT '\udcff\udcfe'",
        "SELECT 1 -- \udc80",
        "SELECT \udcffname FROM singer",
        "\ud83dSELECT 1",
    ):
        add(("encoding", sql))
    # Inputs that would make a backtracking regex (the sandbox's statement checks) take forever.
    add(("redos", " " * 90_000 + "x"))
    add(("redos", "SELECT 1;" + " " * 90_000 + "x"))
    add(("redos", "SELECT 1; " + "/* a */ -- b\n ;" * 5_000 + "x"))
    add(("redos", "\n-- c" * 20_000 + "("))
    add(("redos", "/*" + "*" * 90_000 + "x */ DROP TABLE singer"))
    add(("redos", "SELECT '" + ";" * 30_000 + "'; SELECT 2"))
    # Several statements.
    for t in TABLES:
        add(("multi", f"SELECT 1; DROP TABLE {t}"))
        add(("multi", f"SELECT ';'; DELETE FROM {t}"))
        add(("multi", f"SELECT 1 /* ; */; UPDATE {t} SET rowid = rowid"))
    add(("multi", "SELECT 1; SELECT 2"))
    add(("multi", f"SELECT 1; ATTACH '{d / 'other.sqlite'}' AS o"))
    add(("multi", "SELECT 1; PRAGMA writable_schema = 1"))
    add(("multi", "SELECT 1;" * 2000))
    add(("multi", "; ".join(f"SELECT {i}" for i in range(500))))
    add(("multi", "SELECT 1; -- x\n SELECT 2"))
    add(("multi", "SELECT '';'; SELECT 2"))
    return out


def _mutations(sql: str, rng: random.Random) -> list[str]:
    """Meaning-preserving variants: case, comments, whitespace, trailing semicolons."""
    out = [
        sql.lower(),
        "  \n\t" + sql + "  ",
        "/* hi */ " + sql,
        sql + ";",
        sql + " ; -- trailing",
        "-- a comment\n" + sql,
    ]
    words = sql.split(" ")
    if len(words) > 1 and len(sql) < 5000 and "'" not in sql:
        out.append(" /**/ ".join(words))
        out.append(" ".join(w.upper() if rng.random() < 0.5 else w.lower() for w in words))
    return out


def _garbage(rng: random.Random, n: int) -> list[tuple[str, str]]:
    """Random token soup and random bytes decoded as Latin-1 (valid str, nonsense SQL)."""
    tokens = ["SELECT", "FROM", "singer", "WHERE", "(", ")", "'", '"', ";", ",", "*", "--", "/*", "*/", "1",
              "name", "DROP", "INSERT", "PRAGMA", "ATTACH", "x'00'", "||", "=", "AND", "[", "]", "`", "\n"]
    out = []
    for _ in range(n):
        out.append(("garbage", " ".join(rng.choice(tokens) for _ in range(rng.randint(1, 25)))))
        out.append(("garbage", bytes(rng.randrange(256) for _ in range(rng.randint(1, 80))).decode("latin-1")))
    return out


def hostile_corpus(directory: Path, *, seed: int = 0) -> list[tuple[str, str]]:
    """(category, sql) pairs: every base input, its mutations (not for runaway ones), and garbage."""
    rng = random.Random(seed)
    corpus: list[tuple[str, str]] = []
    for category, sql in _base(directory):
        corpus.append((category, sql))
        if category not in ("runaway", "size", "redos") and len(sql) < 20_000:
            corpus.extend((category, m) for m in _mutations(sql, rng))
    corpus.extend(_garbage(rng, 150))
    return corpus
