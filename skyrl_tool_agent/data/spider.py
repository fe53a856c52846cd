"""Spider 1.0 importer: Spider JSON files -> `Task` records.

Layout read (the official Spider release, see ../shared/spider/PROVENANCE.md):

    <root>/dev.json                      db_id, question, query, sql (parsed), ...
    <root>/train_spider.json             same fields (used when present), else
    <root>/train_spider_compact.json     question, query, db_id only
    <root>/database/<db_id>/<db_id>.sqlite

Questions whose database file is missing (wta_1 in this copy: 62 dev questions) are skipped and
counted. Difficulty follows the official Spider hardness (`skyrl_tool_agent.data.hardness`): taken from
the record's parsed `sql` when the file ships it (dev.json does: exact), otherwise computed from the
query through sqlglot. The four levels are kept in `spider_hardness`; `difficulty` maps extra -> hard.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from skyrl_tool_agent.data.hardness import eval_hardness, spider_hardness, to_difficulty
from skyrl_tool_agent.data.tasks import Task, db_path_for

logger = logging.getLogger(__name__)

SpiderSplit = Literal["dev", "train"]

# Files tried in order for each split.
_SPLIT_FILES: dict[str, tuple[str, ...]] = {
    "dev": ("dev.json",),
    "train": ("train_spider.json", "train_spider_compact.json"),
}


@dataclass
class SpiderLoadResult:
    """Tasks of one Spider split plus what was left out because its database file is missing."""

    tasks: list[Task]
    skipped: int = 0
    skipped_db_ids: dict[str, int] = field(default_factory=dict)


def spider_db_root(root: str | Path) -> Path:
    """The `--db-root` for Spider tasks: `<root>/database`."""
    return Path(root) / "database"


def read_json_tolerant(path: str | Path) -> Any:
    """Parse a JSON file, replacing bytes that are not valid UTF-8 with U+FFFD instead of failing."""
    path = Path(path)
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        logger.warning("%s: replacing bytes that are not valid UTF-8 with U+FFFD", path)
        text = raw.decode("utf-8", errors="replace")
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not valid JSON ({exc})") from exc


def split_file(root: str | Path, split: SpiderSplit) -> Path:
    """The JSON file holding `split` under `root` (FileNotFoundError naming the tried paths)."""
    if split not in _SPLIT_FILES:
        raise ValueError(f"unknown Spider split {split!r}; expected one of {sorted(_SPLIT_FILES)}")
    candidates = [Path(root) / name for name in _SPLIT_FILES[split]]
    for path in candidates:
        if path.is_file():
            return path
    raise FileNotFoundError(f"Spider {split} file not found; tried {', '.join(map(str, candidates))}")


def _hardness_of(record: dict[str, Any]) -> str:
    sql = record.get("sql")
    if isinstance(sql, dict):
        try:
            return eval_hardness(sql)
        except (KeyError, IndexError, TypeError) as exc:  # malformed parse: fall back to sqlglot
            logger.warning("bad parsed 'sql' for %r (%s); using sqlglot", record.get("query"), exc)
    return spider_hardness(record["query"])


def load_spider(root: str | Path, split: SpiderSplit) -> SpiderLoadResult:
    """Load a whole Spider split as tasks in file order, skipping (and counting, per database) the
    questions without a database file. `task_id` is `spider-<split>-<index in the file>`, so ids
    stay stable when questions are skipped."""
    path = split_file(root, split)
    records = read_json_tolerant(path)
    if not isinstance(records, list):
        raise ValueError(f"{path}: expected a JSON list of questions")
    db_root = spider_db_root(root)
    present: dict[str, bool] = {}
    tasks: list[Task] = []
    skipped: Counter[str] = Counter()
    for index, record in enumerate(records):
        db_id = str(record["db_id"])
        if db_id not in present:
            present[db_id] = db_path_for(db_root, db_id).is_file()
        if not present[db_id]:
            skipped[db_id] += 1
            continue
        level = _hardness_of(record)
        tasks.append(Task(
            task_id=f"spider-{split}-{index:04d}",
            db_id=db_id,
            question=" ".join(str(record["question"]).split()),
            gold_sql=str(record["query"]).strip(),
            difficulty=to_difficulty(level),  # type: ignore[arg-type]
            source="spider",
            split=split,
            spider_hardness=level,  # type: ignore[arg-type]
        ))
    if skipped:
        logger.warning("Spider %s: skipped %d questions whose database file is missing: %s",
                       split, sum(skipped.values()), dict(sorted(skipped.items())))
    return SpiderLoadResult(
        tasks=tasks, skipped=sum(skipped.values()), skipped_db_ids=dict(sorted(skipped.items()))
    )
