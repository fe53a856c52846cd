"""Built-in text-to-SQL dataset: determinism, database shape, gold SQL execution, split hygiene."""

from __future__ import annotations

import hashlib
import re
import sqlite3
from collections import Counter
from pathlib import Path

import pytest
import sqlglot
from sqlglot import exp

from skyrl_tool_agent.data.builtin import build_builtin
from skyrl_tool_agent.data.builtin.domains import DOMAINS
from skyrl_tool_agent.data.builtin.generate import Instance, split_template
from skyrl_tool_agent.data.tasks import Task, db_path_for, load_tasks

REPO_ROOT = Path(__file__).resolve().parents[1]
COMMITTED = REPO_ROOT / "data" / "processed"


@pytest.fixture(scope="module")
def fresh(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("builtin_a")
    build_builtin(out, seed=0)
    return out


@pytest.fixture(scope="module")
def dataset(fresh: Path) -> Path:
    """The committed data/processed when present (what training reads), else a fresh build."""
    return COMMITTED if (COMMITTED / "train.json").is_file() else fresh


@pytest.fixture(scope="module")
def tasks(dataset: Path) -> dict[str, list[Task]]:
    return {split: load_tasks(dataset / f"{split}.json") for split in ("train", "dev")}


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _ro(path: Path) -> sqlite3.Connection:
    return sqlite3.connect(f"file:{path}?mode=ro", uri=True)


def test_rebuild_is_byte_identical(fresh: Path, tmp_path: Path) -> None:
    build_builtin(tmp_path, seed=0)
    for name in ("train.json", "dev.json"):
        assert (tmp_path / name).read_bytes() == (fresh / name).read_bytes(), name
    dbs = sorted(fresh.glob("databases/*/*.sqlite"))
    assert len(dbs) == len(DOMAINS)
    for db in dbs:
        assert _sha256(db) == _sha256(tmp_path / db.relative_to(fresh)), db.name


def test_committed_data_is_up_to_date(fresh: Path) -> None:
    if not (COMMITTED / "train.json").is_file():
        pytest.skip("data/processed not built; run python training/scripts/build_data.py")
    for name in ("train.json", "dev.json"):
        assert (COMMITTED / name).read_bytes() == (fresh / name).read_bytes(), f"{name} is stale: rebuild it"
    for db in sorted(fresh.glob("databases/*/*.sqlite")):
        committed = COMMITTED / db.relative_to(fresh)
        # compare contents, not bytes: the file header records the SQLite library version
        with _ro(db) as a, _ro(committed) as b:
            assert list(a.iterdump()) == list(b.iterdump()), f"{committed} is stale: rebuild it"


def test_a_different_seed_gives_different_data(fresh: Path, tmp_path: Path) -> None:
    build_builtin(tmp_path, seed=1)
    assert (tmp_path / "train.json").read_bytes() != (fresh / "train.json").read_bytes()


def test_databases_have_realistic_schemas(dataset: Path) -> None:
    db_ids = sorted(p.name for p in (dataset / "databases").iterdir())
    assert len(db_ids) >= 8
    iso = re.compile(r"^\d{4}-\d{2}-\d{2}$")
    for db_id in db_ids:
        with _ro(db_path_for(dataset / "databases", db_id)) as con:
            tables = [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")]
            assert 3 <= len(tables) <= 5, db_id
            n_fks = n_nulls = n_dates = 0
            for table in tables:
                assert 20 <= con.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0] <= 200, (db_id, table)
                cols = con.execute(f"PRAGMA table_info({table})").fetchall()
                assert [c[2] for c in cols if c[5] == 1] == ["INTEGER"], (db_id, table)  # INTEGER PRIMARY KEY
                assert all(re.fullmatch(r"[a-z][a-z0-9_]*", c[1]) for c in cols), (db_id, table)
                n_fks += len(con.execute(f"PRAGMA foreign_key_list({table})").fetchall())
                for c in cols:
                    n_nulls += con.execute(f"SELECT COUNT(*) FROM {table} WHERE {c[1]} IS NULL").fetchone()[0]
                    sample = con.execute(f"SELECT {c[1]} FROM {table} WHERE {c[1]} IS NOT NULL LIMIT 1").fetchone()
                    n_dates += bool(sample and isinstance(sample[0], str) and iso.match(sample[0]))
            assert con.execute("PRAGMA foreign_key_check").fetchall() == [], db_id
            assert n_fks >= 2 and n_nulls > 0 and n_dates > 0, (db_id, n_fks, n_nulls, n_dates)


def test_task_records(tasks: dict[str, list[Task]]) -> None:
    train, dev = tasks["train"], tasks["dev"]
    assert len(train) >= 1000 and len(dev) >= 200
    for split, items in tasks.items():
        assert [t.task_id for t in items] == [f"builtin-{split}-{i:05d}" for i in range(len(items))]
        assert {t.split for t in items} == {split} and {t.source for t in items} == {"builtin"}
        assert all(t.template_id and t.template_id.startswith(f"{t.db_id}.") for t in items)
        counts = Counter(t.difficulty for t in items)
        assert set(counts) == {"easy", "medium", "hard"}
        assert min(counts.values()) >= 0.15 * len(items), counts
    # dev holds out slot values of the same templates
    assert {t.template_id for t in dev} <= {t.template_id for t in train}


def test_no_question_shared_between_splits(tasks: dict[str, list[Task]]) -> None:
    train_q = [t.question for t in tasks["train"]]
    dev_q = [t.question for t in tasks["dev"]]
    assert len(set(train_q)) == len(train_q) and len(set(dev_q)) == len(dev_q)
    assert not set(train_q) & set(dev_q)


def test_every_gold_sql_executes_and_most_are_non_empty(dataset: Path, tasks: dict[str, list[Task]]) -> None:
    connections: dict[str, sqlite3.Connection] = {}
    non_empty = total = 0
    try:
        for task in tasks["train"] + tasks["dev"]:
            if task.db_id not in connections:
                connections[task.db_id] = _ro(db_path_for(dataset / "databases", task.db_id))
            rows = connections[task.db_id].execute(task.gold_sql).fetchall()
            total += 1
            non_empty += any(v is not None for row in rows for v in row)
    finally:
        for con in connections.values():
            con.close()
    assert non_empty / total >= 0.90


def test_sql_is_canonical_and_values_are_copied_from_the_question(tasks: dict[str, list[Task]]) -> None:
    template_sql = {f"{d.db_id}.{t.local_id}": t.sql for d in DOMAINS for t in d.templates}
    for task in tasks["train"] + tasks["dev"]:
        sql = task.gold_sql
        tree = sqlglot.parse_one(sql, read="sqlite")
        assert '"' not in sql, sql
        bare = re.sub(r"'[^']*'", "''", sql)
        assert not re.search(r"\b(select|from|where|join|group by|order by|limit|as|and|desc)\b", bare), sql
        if " JOIN " in sql:
            assert " AS T1 " in sql, sql
        limits = {id(lim.expression) for lim in tree.find_all(exp.Limit)}
        for literal in tree.find_all(exp.Literal):
            if id(literal) in limits:
                continue  # "the three longest books" -> LIMIT 3
            if literal.is_string:
                assert f"'{literal.this.rstrip('%')}'" in task.question, (task.question, sql)
            elif not re.search(rf"(?<![\w.{{]){re.escape(literal.this)}(?![\w.}}])", template_sql[task.template_id]):
                # a number that is not a constant of the template came from a slot: it must be in the question
                assert re.search(rf"(?<![\w.]){re.escape(literal.this)}(?![\w]|\.\d)", task.question), (task.question, sql)


def test_templates_are_well_formed() -> None:
    assert len(DOMAINS) >= 8
    assert len({d.db_id for d in DOMAINS}) == len(DOMAINS)
    for domain in DOMAINS:
        assert 15 <= len(domain.templates) <= 40, domain.db_id
        assert len({t.local_id for t in domain.templates}) == len(domain.templates)
        for template in domain.templates:
            template.check()
            assert 2 <= len(template.questions) <= 3, template.local_id
            assert len(set(template.questions)) == len(template.questions), template.local_id


def _groups(n: int) -> list[list[Instance]]:
    return [[Instance("t", "db", f"q{i} {p}", f"sql{i}") for p in "ab"] for i in range(n)]


def test_split_template_holds_out_values() -> None:
    import random

    train, dev = split_template(_groups(20), random.Random(0), train_n=9, dev_n=2)
    assert len(train) == 9 and len(dev) == 2
    assert not {i.gold_sql for i in train} & {i.gold_sql for i in dev}
    # a template without slots has one instance: all paraphrases go to train, none to dev
    train, dev = split_template(_groups(1), random.Random(0), train_n=9, dev_n=2)
    assert [i.question for i in train] == ["q0 a", "q0 b"] and dev == []
    # too few values to hold any out
    train, dev = split_template(_groups(3), random.Random(0), train_n=9, dev_n=2)
    assert len(train) == 3 and dev == []
