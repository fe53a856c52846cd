"""The one task record every layer shares, and its JSON file I/O.

A task file (`data/processed/train.json`, `dev.json`) is a JSON list of objects with exactly the
fields of `Task`. Databases live Spider-style at `<db_root>/<db_id>/<db_id>.sqlite`, so one MCP
server started with `--db-root` serves both the built-in data and Spider.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, ValidationError

from skyrl_tool_agent.data.json_input import JsonNestingError, loads_bounded

Difficulty = Literal["easy", "medium", "hard"]
SpiderHardness = Literal["easy", "medium", "hard", "extra"]


class Task(BaseModel):
    """One text-to-SQL question with its gold query."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    task_id: str = Field(description="Unique id, e.g. 'builtin-train-00017' or 'spider-dev-0042'.")
    db_id: str = Field(default="", description="Database id; the file is <db_root>/<db_id>/<db_id>.sqlite. "
                       "Empty for a task family without databases (env.task_family).")
    question: str = Field(description="Natural-language question shown to the policy.")
    gold_sql: str = Field(
        validation_alias=AliasChoices("gold_sql", "ground_truth"),
        description="Reference SQLite query; executes on the database. For another task family, its "
        "ground truth (what its verifier compares the answer with); task files may call it ground_truth.")
    difficulty: Difficulty = Field(description="Curriculum bucket (Spider 'extra' maps to 'hard').")
    source: str = Field(default="builtin", description="'builtin' or 'spider'.")
    split: str = Field(default="train", description="'train' or 'dev'.")
    spider_hardness: SpiderHardness | None = Field(
        default=None, description="Official Spider hardness, kept as-is (only for Spider tasks)."
    )
    template_id: str | None = Field(
        default=None, description="Generator template for built-in tasks (for per-template analysis)."
    )


def db_path_for(db_root: str | Path, db_id: str) -> Path:
    """Spider layout: `<db_root>/<db_id>/<db_id>.sqlite`."""
    return Path(db_root) / db_id / f"{db_id}.sqlite"


def task_user_message(db_id: str, question: str) -> dict[str, str]:
    """The first user turn of a task (the env adds the system prompt and schema); a task without a
    database (another task family) is its question alone."""
    if not db_id:
        return {"role": "user", "content": f"Question: {question}"}
    return {"role": "user", "content": f"Database: {db_id}\nQuestion: {question}"}


def field_problem(exc: ValidationError) -> str:
    """The first of pydantic's errors about a task record, in a few words: "missing field 'question'"."""
    error = exc.errors()[0]
    name = ".".join(str(p) for p in error.get("loc", ())) or "record"
    kind = error.get("type", "")
    if kind == "missing":
        return f"missing field '{name}'" + (" (or 'ground_truth')" if name == "gold_sql" else "")
    if kind == "extra_forbidden":
        return f"unknown field '{name}' (a task has {', '.join(Task.model_fields)})"
    return f"field '{name}': {error.get('msg', kind)}"


def parse_task_list(path: Path, text: str) -> list[Any]:
    """The JSON list of a task file; ValueError (one line, with the path, and the record when it can
    tell) when it is not JSON, is nested too deep to parse (Python's parser would end in a
    RecursionError) or is not a list."""
    try:
        raw = loads_bounded(text)
    except JsonNestingError as exc:
        where = f"record {exc.element}" if exc.element is not None else f"character {exc.offset:,}"
        raise ValueError(f"{path}: {where}: JSON nested more than {exc.limit} levels deep (a task record has 2); "
                         "the file cannot be read past it") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not valid JSON ({exc})") from exc
    if not isinstance(raw, list):
        raise ValueError(f"{path}: expected a JSON list of task objects")
    return raw


def load_tasks(path: str | Path) -> list[Task]:
    """Read a task file (JSON list). Raises FileNotFoundError / ValueError with the path in the
    message (and the record's index for a bad record). `data.validation` checks files in full."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"task file not found: {path}")
    raw = parse_task_list(path, path.read_text(encoding="utf-8"))
    tasks = []
    for index, item in enumerate(raw):
        try:
            tasks.append(Task.model_validate(item))
        except ValidationError as exc:
            raise ValueError(f"{path}: record {index}: {field_problem(exc)}") from None
    return tasks


def save_tasks(tasks: list[Task], path: str | Path) -> None:
    """Write tasks deterministically (stable key order, indent 1, trailing newline)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = [t.model_dump(mode="json") for t in tasks]
    path.write_text(json.dumps(payload, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
