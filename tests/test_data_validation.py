"""Task files are checked when they load, through the real CLI processes (eval and train):

- every kind of bad record (a missing or unknown field, non-UTF-8 bytes, an unknown db_id, a db_id
  that resolves outside the database root by `..` or by a symlink, a missing database file, gold
  SQL that fails, gold SQL that runs past env.sql_timeout_s, a question or gold over its size cap,
  a duplicate task_id) is refused before anything runs: exit 2, one `error:` line naming the file
  and the record; train writes nothing into its output directory;
- `--skip-bad-records` runs the good records and reports each bad one on its own line.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

from tests.fixtures.cli_in_process import cli_in_process
from tests.fixtures.config_files import REPO

GOOD = {"task_id": "t-0", "db_id": "shop", "question": "How many items?", "gold_sql": "SELECT count(*) FROM items",
        "difficulty": "easy"}
SLOW = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c"
#: record index -> (record, the words its error line must hold)
BAD: list[tuple[dict, str]] = [
    ({k: v for k, v in GOOD.items() if k != "question"}, "missing field 'question'"),
    ({**GOOD, "colour": "red"}, "unknown field 'colour'"),
    ({**GOOD, "question": "NON_UTF8"}, "field 'question' holds bytes that are not UTF-8"),
    ({**GOOD, "db_id": "nope"}, "unknown db_id 'nope'"),
    ({**GOOD, "db_id": "../outside"}, "db_id '../outside' resolves outside the database root"),
    ({**GOOD, "db_id": "link"}, "db_id 'link' resolves outside the database root"),
    ({**GOOD, "db_id": "empty"}, "database file missing: "),
    ({**GOOD, "gold_sql": "SELECT * FROM no_such_table"}, "gold SQL fails (SQL error: no such table: no_such_table) on shop"),
    ({**GOOD, "gold_sql": SLOW}, "gold SQL runs over 0.5 s on shop"),
    ({**GOOD, "question": "x" * 4_001}, "question of 4,001 characters (at most 4,000)"),
    ({**GOOD, "gold_sql": "SELECT 1" + " " * 20_000}, "gold of 20,008 characters (at most 20,000)"),
    ({**GOOD}, "task_id 't-0' used by an earlier record"),
]


def _database(path: Path) -> None:
    path.parent.mkdir(parents=True)
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE items (id INTEGER PRIMARY KEY, name TEXT)")
        conn.executemany("INSERT INTO items(name) VALUES (?)", [("a",), ("b",)])
    conn.close()


def _data(tmp_path: Path) -> tuple[Path, Path]:
    """(task file, database root) with GOOD as record 0 and BAD after it."""
    root = tmp_path / "dbs"
    _database(root / "shop" / "shop.sqlite")
    _database(tmp_path / "outside" / "outside.sqlite")  # what ../outside would reach
    _database(tmp_path / "elsewhere" / "link.sqlite")
    (root / "link").symlink_to(tmp_path / "elsewhere")  # a symlink out of the root
    (root / "empty").mkdir()
    records = [GOOD, *(dict(r, task_id=f"t-{i + 1}") if r["task_id"] != "t-0" or "used by" not in why else r
                       for i, (r, why) in enumerate(BAD))]
    data = json.dumps(records, indent=1).encode("utf-8").replace(b"NON_UTF8", b"caf\xe9")  # a Latin-1 byte
    tasks = tmp_path / "tasks.json"
    tasks.write_bytes(data)
    return tasks, root


def _cli(*args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(WANDB_MODE="offline", WEAVE_DISABLED="true", TOKENIZERS_PARALLELISM="false", COLUMNS="300")
    return subprocess.run([sys.executable, "-m", "skyrl_tool_agent.commands.main", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)


def test_bad_records_are_refused_before_anything_runs(tmp_path, capsys):
    """`eval` refuses through a process of its own, `train` through its `main` in this process
    (`cli_in_process`: the same status and line), then `eval --skip-bad-records` runs."""
    tasks, root = _data(tmp_path)
    data = ["--set", f"training.data.train_file={tasks}", "--set", f"training.data.dev_file={tasks}",
            "--set", f"training.data.db_root={root}", "--set", "env.sql_timeout_s=0.5"]
    start = time.monotonic()
    refused = _cli("eval", "--policy", "oracle", "--output-dir", str(tmp_path / "eval"), *data)
    assert refused.returncode == 2, refused.stderr[-2000:]
    [line] = refused.stderr.strip().splitlines()
    assert line == (f"error: {tasks}: record 1 (t-1): missing field 'question' (and {len(BAD) - 1} more bad records); "
                    "fix the data, or pass --skip-bad-records to leave bad records out"), line
    assert not (tmp_path / "eval").exists()
    out = tmp_path / "run"
    code, _, stderr = cli_in_process(["train", "--output-dir", str(out), "--max-steps", "2", *data], capsys)
    assert code == 2 and stderr.strip().splitlines()[-1] == line, stderr[-2000:]
    assert not out.exists() or not any(out.iterdir())

    skipped = _cli("eval", "--policy", "oracle", "--skip-bad-records", "--output-dir", str(tmp_path / "eval"), *data)
    assert skipped.returncode == 0, skipped.stderr[-3000:]
    log = skipped.stdout + skipped.stderr
    for index, (_, why) in enumerate(BAD, start=1):
        assert f"skipped {tasks}: record {index} " in log and why in log, (index, why, log[-4000:])
    assert f"--skip-bad-records: left out {len(BAD)} bad records" in log
    results = json.loads((tmp_path / "eval" / "results.json").read_text())
    assert results["n"] == 1 and results["execution_accuracy"] == 1.0
    assert results["skipped"] == len(BAD) and results["skipped_reasons"] == {"bad_record": len(BAD)}
    print(f"\n3 commands (2 launched) in {time.monotonic() - start:.1f} s")


def test_a_gold_query_is_checked_again_once_its_database_changed(tmp_path):
    """The splits' gold check runs a query that passed once only again when the database changed
    (`eval.splits.gold_check` keeps what passed in this process, by the file as it was)."""
    from skyrl_tool_agent.eval.splits import gold_check

    db = tmp_path / "shop.sqlite"
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TABLE items (name TEXT)")
    conn.close()
    check = gold_check()
    assert check(db, "SELECT name FROM items") is None
    assert check(db, "SELECT name FROM items") is None  # kept: not run again
    time.sleep(0.01)  # a change time of its own even where the clock is coarse
    with sqlite3.connect(db) as conn:
        conn.execute("ALTER TABLE items RENAME TO goods")
    conn.close()
    assert "no such table: items" in (check(db, "SELECT name FROM items") or "")
