"""Task files checked when they load, before any training or evaluation starts.

Each problem is one line naming the file and the record (its 0-based index in the JSON list, and
its task_id when it has one):

- the file: JSON nested deeper than `json_input.MAX_JSON_NESTING` is refused before it is parsed
  (naming the record it is in), since Python's parser would recurse into a RecursionError;
- the record itself: a missing or unknown field, a value of the wrong type, bytes that are not
  UTF-8, a field over its size (`FIELD_MAX_CHARS`: a question over `QUESTION_MAX_CHARS`, a gold
  query / ground truth over `GOLD_MAX_CHARS`, any other field over `IDENTIFIER_MAX_CHARS`), a
  control character in an identifier (task_id, source, split, template_id: they end up in log
  lines and file names), a task_id used twice;
- for a family with databases (SQL): a db_id the SQLite server would not serve
  (`data.databases.DatabaseRoot`, the server's own listing): no such database under the database
  root ("unknown db_id"), one whose file would lie outside the root (an absolute path, `../x`, a
  symlink out), a NUL byte, a name too long for a file, a database directory without its
  `.sqlite` file; and a gold query that fails or runs over its time limit (`gold_check`: one
  bounded execution per distinct query and database; `eval.splits.gold_check` runs it with
  `rewards.limits.run_bounded`, the reward's own sandboxed runner, which this layer cannot import).

`load_checked_tasks` raises `BadRecordsError` (a `UserInputError`: one `error:` line, exit 2) at
the first problem it finds, saying how many records are bad; with `skip_bad_records` it leaves
those records out instead and logs one warning per record. A file that is not a JSON list (or not
UTF-8 outside any record, or nested too deep to parse) cannot be skipped around: it is always an
error.
"""

from __future__ import annotations

import logging
import time
import unicodedata
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from skyrl_tool_agent.config import UserInputError
from skyrl_tool_agent.config.base import default_of
from skyrl_tool_agent.config.env import EnvConfig
from skyrl_tool_agent.data.databases import DatabaseRoot, UnservedDatabaseError, shown_name
from skyrl_tool_agent.data.tasks import Task, field_problem, parse_task_list

logger = logging.getLogger(__name__)

__all__ = ["FIELD_MAX_CHARS", "GOLD_MAX_CHARS", "GOLD_TIMEOUT_S", "IDENTIFIER_MAX_CHARS", "QUESTION_MAX_CHARS", "GoldCheck",
           "BadRecord", "BadRecordsError", "check_databases", "load_checked_tasks", "read_task_file"]

#: Longest question (characters): a prompt this long is a data error, not a question.
QUESTION_MAX_CHARS = 4_000
#: Longest gold query / ground truth (characters).
GOLD_MAX_CHARS = 20_000
#: Longest value of every other field (characters): ids and labels are a few dozen (a 50 MB
#: `source` was accepted, and a 4 kB db_id reached the file system).
IDENTIFIER_MAX_CHARS = 200
#: Longest value of each field (characters); a field not named here has `IDENTIFIER_MAX_CHARS`.
FIELD_MAX_CHARS: dict[str, int] = {"question": QUESTION_MAX_CHARS, "gold_sql": GOLD_MAX_CHARS}
#: Fields that name things (in log lines, messages, file names): no control characters in them.
#: db_id is checked as the server resolves it (`data.databases`), not here.
_IDENTIFIERS = ("task_id", "source", "split", "template_id")
#: How a field is called in messages, where that differs from its name.
_FIELD_WORDS = {"gold_sql": "gold"}
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
        shown = self.task_id if self.task_id and self.task_id.isprintable() and len(self.task_id) <= 60 else (
            self.task_id and shown_name(self.task_id))  # a hostile task_id stays short and on one line
        who = f"record {self.index}" + (f" ({shown})" if shown else "")
        return f"{self.path}: {who}: {self.problem}"


class BadRecordsError(UserInputError):
    """Records that cannot be used; the message is the first, and how many there are."""

    def __init__(self, bad: Sequence[BadRecord]) -> None:
        more = f" (and {len(bad) - 1} more bad records)" if len(bad) > 1 else ""
        super().__init__(f"{bad[0].line()}{more}; fix the data, or pass {SKIP_FLAG} to leave bad records out")


def _non_utf8_field(item: Any) -> str | None:
    """The field of a record holding bytes that were not UTF-8 (decoded as lone surrogates), if any."""
    if not isinstance(item, dict):
        return None
    for key, value in item.items():
        for text in (key, value):
            if isinstance(text, str) and any("\udc80" <= ch <= "\udcff" for ch in text):
                return str(key)
    return None


#: Unicode categories refused in identifiers: controls (NUL, newline, escape), format characters
#: (right-to-left overrides, zero-width joiners: text that reads as something else) and the line
#: and paragraph separators.
_CONTROL_CATEGORIES = frozenset({"Cc", "Cf", "Zl", "Zp"})


def _control_character(text: str) -> int | None:
    """Position of the first control, format or separator character of `text`, if any."""
    if text.isprintable():  # the common case, in C: no character of category C* or Z* but the space
        return None
    return next((i for i, ch in enumerate(text) if unicodedata.category(ch) in _CONTROL_CATEGORIES), None)


def _field_problem(task: Task) -> str | None:
    """The first field of a valid-typed record over its size, or an identifier with a control character."""
    for name in Task.model_fields:
        value = getattr(task, name)
        if not isinstance(value, str):
            continue
        cap = FIELD_MAX_CHARS.get(name, IDENTIFIER_MAX_CHARS)
        if len(value) > cap:
            return f"{_FIELD_WORDS.get(name, name)} of {len(value):,} characters (at most {cap:,})"
        if name in _IDENTIFIERS and (at := _control_character(value)) is not None:
            return f"field '{name}' holds a control character (U+{ord(value[at]):04X} at position {at})"
    return None


def read_task_file(path: str | Path) -> tuple[list[tuple[int, Task]], list[BadRecord]]:
    """((index, task) of each good record, bad records) of a task file, checking each record on its
    own (fields, UTF-8, sizes, identifiers, duplicate ids). Raises FileNotFoundError, or ValueError
    (one line, with the path) for a file that is not a JSON list or nests too deep to be read."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"task file not found: {path}")
    raw = parse_task_list(path, path.read_bytes().decode("utf-8", errors="surrogateescape"))
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
        if (problem := _field_problem(task)) is not None:
            refuse(problem)
        elif task.task_id in seen:
            refuse(f"task_id {task.task_id!r} used by an earlier record")
        else:
            seen.add(task.task_id)
            good.append((index, task))
    return good, bad


def check_databases(path: Path, records: Iterable[tuple[int, Task]], db_root: Path,
                    gold_check: GoldCheck | None = None) -> list[BadRecord]:
    """Problems of the (index, task) records of file `path` whose task names a database under
    `db_root` (module doc): db_id, where it resolves, its file, and (with `gold_check`) its gold
    query, run once per distinct (db_id, query)."""
    databases = DatabaseRoot(db_root)
    bad: list[BadRecord] = []
    outcome: dict[tuple[str, str], str | None] = {}  # (db_id, gold) -> problem, one run per distinct query
    start = time.monotonic()
    for index, task in records:
        def refuse(problem: str) -> None:
            bad.append(BadRecord(path, index, task.task_id, problem))  # noqa: B023 - used at once

        if not task.db_id:
            refuse("no db_id, which task family 'sql' needs (another family? set env.task_family)")
            continue
        try:
            db_path = databases.path(task.db_id)
        except UnservedDatabaseError as exc:
            refuse(str(exc))
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


def load_checked_tasks(path: Path, *, db_root: Path | None, skip_bad_records: bool = False,
                       gold_check: GoldCheck | None = None) -> tuple[list[Task], list[BadRecord]]:
    """The tasks of the file at `path`, checked (module doc); `db_root` None = a family without
    databases (no database checks). Returns the tasks and the bad records (left out; none unless
    `skip_bad_records`).

    Raises `BadRecordsError` on the first bad record unless `skip_bad_records`, which leaves the bad
    records out and logs each (one warning line per record, then a count)."""
    indexed, bad = read_task_file(path)
    if db_root is not None:
        bad += check_databases(path, indexed, db_root, gold_check)
    bad.sort(key=lambda b: b.index)
    if bad and not skip_bad_records:
        raise BadRecordsError(bad)
    for b in bad:
        logger.warning("skipped %s", b.line())
    if bad:
        logger.warning("%s: left out %d bad records", SKIP_FLAG, len(bad))
    dropped = {b.index for b in bad}
    return [t for i, t in indexed if i not in dropped], bad
