"""Which questions an evaluation runs: a split of the built-in data or of Spider, optionally a
deterministic stratified subset (`--limit`), with the count of questions left out.

Questions left out: those whose database file is missing (Spider's wta_1, ...) and those whose gold
query SQLite cannot even prepare (three in Spider train: a missing table, ORDER BY before
INTERSECT). The reward raises on a failing gold query, which would stop the whole run, so such
questions are found first (`EXPLAIN`, which compiles without running) and counted.
"""

from __future__ import annotations

import logging
import sqlite3
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from skyrl_tool_agent.config import DataConfig, UserInputError
from skyrl_tool_agent.config.base import expand_path
from skyrl_tool_agent.data.batching import fixed_subset
from skyrl_tool_agent.data.tasks import Task, db_path_for
from skyrl_tool_agent.data.validation import GOLD_TIMEOUT_S, GoldCheck, load_checked_tasks

logger = logging.getLogger(__name__)

Split = Literal["dev", "train"]


@dataclass
class EvalTaskSet:
    """The tasks to evaluate, where their databases are, and what was left out.

    `skipped`: questions of the split that cannot run, `skipped_reasons` by reason
    (missing_database, gold_sql_error); `available`: questions that can run, before `--limit`.
    """

    tasks: list[Task]
    db_root: Path
    dataset: str
    split: str
    skipped: int = 0
    available: int = 0
    skipped_reasons: dict[str, int] = field(default_factory=dict)


def gold_sql_errors(tasks: Sequence[Task], db_root: Path) -> dict[str, str]:
    """task_id -> SQLite's error for gold queries that do not compile on their database (EXPLAIN:
    prepared, not run; a read-only connection per database)."""
    by_db: dict[str, list[Task]] = defaultdict(list)
    for task in tasks:
        by_db[task.db_id].append(task)
    errors: dict[str, str] = {}
    for db_id, group in by_db.items():
        path = db_path_for(db_root, db_id)
        if not path.is_file():
            errors.update((t.task_id, f"database file not found: {path}") for t in group)
            continue
        conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
        try:
            for task in group:
                try:
                    conn.execute(f"EXPLAIN {task.gold_sql}")
                except sqlite3.Error as exc:
                    errors[task.task_id] = str(exc)
        finally:
            conn.close()
    return errors


def gold_check(timeout_s: float = GOLD_TIMEOUT_S) -> GoldCheck:
    """A `data.validation.GoldCheck`: the gold query run once, as the reward runs it
    (`rewards.limits.run_bounded`: sandboxed, read-only, `timeout_s`)."""
    from mcp_tools.sandbox import SandboxError
    from skyrl_tool_agent.rewards.limits import run_bounded

    def check(db_path: Path, sql: str) -> str | None:
        try:
            run_bounded(db_path, sql, timeout_s=timeout_s, max_rows=None)
        except SandboxError as exc:
            if exc.kind == "timeout":
                return f"runs over {timeout_s:g} s"
            return f"fails ({' '.join(str(exc).split())[:200]})"
        return None

    return check


def load_eval_tasks(data: DataConfig, split: Split = "dev", *, limit: int | None = None, seed: int = 0,
                    uses_databases: bool = True, skip_bad_records: bool = False,
                    gold_timeout_s: float = GOLD_TIMEOUT_S) -> EvalTaskSet:
    """The `split` of `data.dataset` (files and database root resolved as in training).

    `uses_databases`: the task family's (`TaskFamily.uses_databases`); a family without databases
    (e.g. the inventory example) has no database root to check and no gold query to run.
    A task file is checked as it loads (`data.validation`): a bad record is a `BadRecordsError`
    (one line, before anything runs) unless `skip_bad_records`, which leaves it out and counts it
    (`skipped_reasons["bad_record"]`). Spider keeps its own rule: the official files' few broken
    questions are skipped with a warning. `gold_timeout_s`: a gold query's limit (`env.sql_timeout_s`,
    the scoring runs' own).

    `limit`: a stratified-by-difficulty subset of that size chosen by `data.batching.fixed_subset`
    (deterministic for a seed; the same limit and seed give the same questions, so two runs compare).
    Missing files are `UserInputError`s naming the path.
    """
    from skyrl_tool_agent.data.builtin.location import ensure_builtin_data

    ensure_builtin_data(data.dataset)
    db_root = data.resolved_db_root()
    skipped = file_skipped = 0
    if data.dataset == "spider":
        from skyrl_tool_agent.data.spider import load_spider, split_file

        root = expand_path(data.spider_root)
        try:
            split_file(root, split)
        except FileNotFoundError as exc:
            raise UserInputError(f"Spider not found at {root} (--spider-root): {exc}") from exc
        loaded = load_spider(root, split)
        tasks, skipped = loaded.tasks, loaded.skipped
    else:
        path = data.resolved_train_file() if split == "train" else data.resolved_dev_file()
        if uses_databases and not db_root.is_dir():
            raise UserInputError(f"database root not found: {db_root}")
        try:
            [tasks], bad = load_checked_tasks([path], db_root=db_root if uses_databases else None,
                                              skip_bad_records=skip_bad_records,
                                              gold_check=gold_check(gold_timeout_s))
        except FileNotFoundError as exc:
            raise UserInputError(f"{exc}; run `skyrl-tool-agent build-data` (or python training/scripts/build_data.py in a checkout)") from exc
        except ValueError as exc:
            raise UserInputError(str(exc)) from exc
        file_skipped = len(bad)
    if uses_databases and not db_root.is_dir():
        raise UserInputError(f"database root not found: {db_root}")
    reasons = {"missing_database": skipped} if skipped else {}
    if file_skipped:
        reasons["bad_record"] = file_skipped
        skipped += file_skipped
    broken = gold_sql_errors(tasks, db_root) if uses_databases and data.dataset == "spider" else {}
    if broken:
        logger.warning("skipping %d questions whose gold SQL fails on its database: %s", len(broken),
                       "; ".join(f"{k}: {v}" for k, v in sorted(broken.items())))
        tasks = [t for t in tasks if t.task_id not in broken]
        reasons["gold_sql_error"] = len(broken)
        skipped += len(broken)
    available = len(tasks)
    if limit is not None:
        if limit < 1:
            raise UserInputError(f"--limit must be >= 1, got {limit}")
        tasks = fixed_subset(tasks, limit, seed=seed)
    return EvalTaskSet(tasks, db_root, data.dataset, split, skipped, available, reasons)
