"""Task files checked when they load, before any training or evaluation starts.

Each problem is one line naming the file and the record (its 0-based index in the JSON list, and
its task_id when it has one):

- the record itself: a missing or unknown field, a value of the wrong type, bytes that are not
  UTF-8, a question over `QUESTION_MAX_CHARS` or a gold query / ground truth over `GOLD_MAX_CHARS`,
  a task_id used twice;
- for a family with databases (SQL): a db_id with no database under the database root ("unknown
  db_id"), a db_id whose file would lie outside the root once links are followed (`../x`, a
  symlink out), a database directory without its `.sqlite` file, and a gold query that fails or
  runs over its time limit (`gold_check`: one bounded execution per distinct query and database;
  `eval.splits.gold_check` runs it with `rewards.limits.run_bounded`, the reward's own
  sandboxed runner, which this layer cannot import).

`load_checked_tasks` raises `BadRecordsError` (a `UserInputError`: one `error:` line, exit 2) at
the first problem it finds, saying how many records are bad; with `skip_bad_records` it leaves
those records out instead and logs one warning per record. A file that is not a JSON list (or not
UTF-8 outside any record) cannot be skipped around: it is always an error.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from skyrl_tool_agent.config import UserInputError
from skyrl_tool_agent.config.base import default_of
from skyrl_tool_agent.config.env import EnvConfig
from skyrl_tool_agent.data.tasks import Task, db_path_for, field_problem

logger = logging.getLogger(__name__)

__all__ = ["GOLD_MAX_CHARS", "GOLD_TIMEOUT_S", "QUESTION_MAX_CHARS", "GoldCheck", "BadRecord", "BadRecordsError",
           "check_databases", "load_checked_tasks", "read_task_file"]

#: Longest question (characters): a prompt this long is a data error, not a question.
QUESTION_MAX_CHARS = 4_000
#: Longest gold query / ground truth (characters).
GOLD_MAX_CHARS = 20_000
#: Seconds one gold query may run when checked, when the caller gives none: `env.sql_timeout_s`'s
#: default, the reward's query limit (`eval.splits.gold_check` passes the configured one).
GOLD_TIMEOUT_S: float = default_of(EnvConfig, "sql_timeout_s")
#: (database file, gold query) -> None when it runs within its limit, else the problem in a few words.
GoldCheck = Callable[[Path, str], "str | None"]
#: What the escape hatch is called on the command lines.
SKIP_FLAG = "--skip-bad-records"


@dataclass(frozen=True)
class BadRecord:
    """One record that cannot be used, and why."""

    path: Path
    index: int
    task_id: str | None
    problem: str

    def line(self) -> str:
        who = f"record {self.index}" + (f" ({self.task_id})" if self.task_id else "")
        return f"{self.path}: {who}: {self.problem}"


class BadRecordsError(UserInputError):
    """Records that cannot be used; the message is the first, and how many there are."""

    def __init__(self, bad: Sequence[BadRecord]) -> None:
        more = f" (and {len(bad) - 1} more bad records)" if len(bad) > 1 else ""
        super().__init__(f"{bad[0].line()}{more}; fix the data, or pass {SKIP_FLAG} to leave bad records out")
        self.bad = list(bad)


def _non_utf8_field(item: Any) -> str | None:
    """The field of a record holding bytes that were not UTF-8 (decoded as lone surrogates), if any."""
    if not isinstance(item, dict):
        return None
    for key, value in item.items():
        for text in (key, value):
            if isinstance(text, str) and any("\udc80" <= ch <= "\udcff" for ch in text):
                return str(key)
    return None


def read_task_file(path: str | Path) -> tuple[list[Task], list[tuple[int, Task]], list[BadRecord]]:
    """(tasks, (index, task) of each, bad records) of a task file, checking each record on its
    own (fields, UTF-8, sizes, duplicate ids). Raises FileNotFoundError, or ValueError (one line,
    with the path) for a file that is not a JSON list."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"task file not found: {path}")
    text = path.read_bytes().decode("utf-8", errors="surrogateescape")
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not valid JSON ({exc})") from exc
    if not isinstance(raw, list):
        raise ValueError(f"{path}: expected a JSON list of task objects")
    good: list[tuple[int, Task]] = []
    bad: list[BadRecord] = []
    seen: set[str] = set()
    for index, item in enumerate(raw):
        task_id = item.get("task_id") if isinstance(item, dict) and isinstance(item.get("task_id"), str) else None

        def refuse(problem: str) -> None:
            bad.append(BadRecord(path, index, task_id, problem))  # noqa: B023 - used at once

        if not isinstance(item, dict):
            refuse(f"not a JSON object ({type(item).__name__})")
            continue
        if (field := _non_utf8_field(item)) is not None:
            refuse(f"field '{field}' holds bytes that are not UTF-8")
            continue
        try:
            task = Task.model_validate(item)
        except ValidationError as exc:
            refuse(field_problem(exc))
            continue
        if len(task.question) > QUESTION_MAX_CHARS:
            refuse(f"question of {len(task.question):,} characters (at most {QUESTION_MAX_CHARS:,})")
        elif len(task.gold_sql) > GOLD_MAX_CHARS:
            refuse(f"gold of {len(task.gold_sql):,} characters (at most {GOLD_MAX_CHARS:,})")
        elif task.task_id in seen:
            refuse(f"task_id {task.task_id!r} used by an earlier record")
        else:
            seen.add(task.task_id)
            good.append((index, task))
    return [t for _, t in good], good, bad


def check_databases(records: Iterable[tuple[Path, int, Task]], db_root: Path,
                    gold_check: GoldCheck | None = None) -> list[BadRecord]:
    """Problems of (file, index, task) records whose task names a database under `db_root`
    (module doc): db_id, where it resolves, its file, and (with `gold_check`) its gold query, run
    once per distinct (db_id, query)."""
    root = Path(db_root).resolve()
    bad: list[BadRecord] = []
    outcome: dict[tuple[str, str], str | None] = {}  # (db_id, gold) -> problem, one run per distinct query
    start = time.monotonic()
    for path, index, task in records:
        def refuse(problem: str) -> None:
            bad.append(BadRecord(path, index, task.task_id, problem))  # noqa: B023 - used at once

        if not task.db_id:
            refuse("no db_id, which task family 'sql' needs (another family? set env.task_family)")
            continue
        db_path = db_path_for(db_root, task.db_id)
        if not db_path.resolve().is_relative_to(root) or not (Path(db_root) / task.db_id).resolve().is_relative_to(root):
            refuse(f"db_id {task.db_id!r} resolves outside the database root {root}")
            continue
        if not (Path(db_root) / task.db_id).is_dir():
            refuse(f"unknown db_id {task.db_id!r}: no database {task.db_id}/ under {db_root}")
            continue
        if not db_path.is_file():
            refuse(f"database file missing: {db_path}")
            continue
        key = (task.db_id, task.gold_sql)
        if gold_check is not None and key not in outcome:
            problem = gold_check(db_path, task.gold_sql)
            outcome[key] = None if problem is None else f"gold SQL {problem} on {task.db_id}"
        if outcome.get(key) is not None:
            refuse(outcome[key])
    if outcome:
        logger.debug("checked %d gold queries in %.1f s", len(outcome), time.monotonic() - start)
    return bad


def load_checked_tasks(paths: Sequence[Path], *, db_root: Path | None, skip_bad_records: bool = False,
                       gold_check: GoldCheck | None = None) -> tuple[list[list[Task]], list[BadRecord]]:
    """The tasks of each file of `paths`, checked (module doc); `db_root` None = a family without
    databases (no database checks). A file named twice is read and checked once. Returns the
    tasks of each file and the bad records (left out; none unless `skip_bad_records`).

    Raises `BadRecordsError` on the first bad record unless `skip_bad_records`, which leaves the bad
    records out and logs each (one warning line per record, then a count)."""
    per_file: dict[Path, tuple[list[tuple[int, Task]], list[BadRecord]]] = {}
    for path in paths:
        if path not in per_file:
            _, indexed, bad = read_task_file(path)
            per_file[path] = (indexed, bad)
    bad_all = [b for _, bad in per_file.values() for b in bad]
    if db_root is not None:
        bad_all += check_databases(((p, i, t) for p, (indexed, _) in per_file.items() for i, t in indexed), db_root,
                                   gold_check)
    bad_all.sort(key=lambda b: (paths.index(b.path), b.index))
    if bad_all and not skip_bad_records:
        raise BadRecordsError(bad_all)
    dropped = {(b.path, b.index) for b in bad_all}
    for b in bad_all:
        logger.warning("skipped %s", b.line())
    if bad_all:
        logger.warning("%s: left out %d bad records", SKIP_FLAG, len(bad_all))
    return [[t for i, t in per_file[p][0] if (p, i) not in dropped] for p in paths], bad_all
