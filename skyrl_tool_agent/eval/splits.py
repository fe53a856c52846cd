"""Which tasks are train, pool, validation and dev: the one place every command asks.

For a config (`training.data`, `env.task_family`, `training.seed`):

* **train** -- the training file (`train_file`, Spider's train): the warm start's supervised data,
  and what GRPO samples with `train_pool: file`;
* **dev** -- `dev_file` (Spider's dev): only ever reported, never tuned on;
* **pool** -- with `train_pool: generated`, what GRPO samples: every slot assignment of the built-in
  templates not in dev (`data.builtin.pool`), less the validation queries;
* **validation** -- the yardstick for curves and tuning: `validation_tasks` unseen queries of the
  generated pool (built-in data); for Spider, which has no generator, a fixed 64-task dev subset
  drawn with another seed than the reported evaluation's;
* **test** -- the built-in data's clean in-family test: `test_tasks` tasks of the same templates on
  databases the generator builds with another seed, none sharing a question or a gold query with
  train, pool, validation or dev (`data.builtin.test_split`); never trained on, never tuned on;
* **run_eval** -- what a training run evaluates (`training.eval_split`, `eval_num_tasks`).

A task file is checked as it loads (`data.validation`): a bad record is one `error:` line, unless
`skip_bad_records` leaves it out (`bad_record`). Spider's official files drop questions whose
database is missing (`missing_database`) or whose gold query SQLite cannot prepare
(`gold_sql_error`), with a warning, since the reward raises on a failing gold query.
"""

from __future__ import annotations

import logging
import sqlite3
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from skyrl_tool_agent.config import Config, UserInputError
from skyrl_tool_agent.config.base import expand_path
from skyrl_tool_agent.data.batching import fixed_subset
from skyrl_tool_agent.data.databases import file_state
from skyrl_tool_agent.data.frontier import FRONTIER_FILE, read_frontier
from skyrl_tool_agent.data.tasks import Task, db_path_for
from skyrl_tool_agent.data.validation import GOLD_TIMEOUT_S, GoldCheck, load_checked_tasks
from skyrl_tool_agent.env.families import resolve_family

logger = logging.getLogger(__name__)

#: The splits read from a file.
FileSplit = Literal["train", "dev"]
#: The splits a command may name (the evaluate command's --split).
Split = Literal["train", "dev", "validation", "test"]
#: Tasks in Spider's validation split (a dev subset: Spider has no generated pool).
SPIDER_VALIDATION_TASKS = 64
#: How the build-data hint reads in a missing-file error.
_BUILD_HINT = "run `skyrl-tool-agent build-data` (or python training/scripts/build_data.py in a checkout)"


@dataclass
class SplitFile:
    """The usable tasks of one file split, and how many were left out, by reason."""

    tasks: list[Task]
    skipped_reasons: dict[str, int] = field(default_factory=dict)

    @property
    def skipped(self) -> int:
        return sum(self.skipped_reasons.values())


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


#: Gold queries that ran clean in this process, by the database file as it was then (inode, size,
#: change times), the query and its limit: a process that loads the same task files again checks
#: each query once (a test worker loaded the built-in splits 56 times in 7 test files, 44 s of its
#: 105 s). A database changed since is a new key; a failure is never kept, so it is run again.
_GOLD_PASSED: set[tuple[object, ...]] = set()


def gold_check(timeout_s: float = GOLD_TIMEOUT_S) -> GoldCheck:
    """A `data.validation.GoldCheck`: the gold query run once, as the reward runs it
    (`rewards.limits.run_bounded`: sandboxed, read-only, `timeout_s`)."""
    from mcp_tools.sandbox import SandboxError
    from skyrl_tool_agent.rewards.limits import run_bounded

    def check(db_path: Path, sql: str) -> str | None:
        state = file_state(db_path)  # None: run_bounded says what is wrong with it
        key = None if state is None else (state, sql, timeout_s)
        if key in _GOLD_PASSED:
            return None
        try:
            run_bounded(db_path, sql, timeout_s=timeout_s, max_rows=None)
        except SandboxError as exc:
            if exc.kind == "timeout":
                return f"runs over {timeout_s:g} s"
            return f"fails ({' '.join(str(exc).split())[:200]})"
        if key is not None:
            _GOLD_PASSED.add(key)
        return None

    return check


class TaskSplits:
    """The tasks of `config` by role (module docstring). File splits load, checked, on first use
    (an evaluation of dev never reads train); the derived ones are computed once."""

    def __init__(self, config: Config, *, skip_bad_records: bool = False) -> None:
        self.config = config
        self.skip_bad_records = skip_bad_records
        self.uses_databases = resolve_family(config.env.task_family).uses_databases
        #: Where the tasks' databases are (training.data.db_root, or the dataset's default).
        self.db_root: Path = config.training.data.resolved_db_root()
        self._files: dict[str, SplitFile] = {}
        self._pool_and_validation: tuple[list[Task], list[Task]] | None = None
        self._test: list[Task] | None = None

    @classmethod
    def load(cls, config: Config, *, skip_bad_records: bool = False) -> TaskSplits:
        """The splits with both files loaded now: a run's data errors come before anything starts."""
        splits = cls(config, skip_bad_records=skip_bad_records)
        splits.file("train"), splits.file("dev")
        return splits

    # ---------------------------------------------------------------- the files
    def file(self, name: FileSplit) -> SplitFile:
        """The train or dev file's usable tasks (loaded and checked once)."""
        if name not in self._files:
            self._files[name] = self._load(name)
        return self._files[name]

    @property
    def train(self) -> list[Task]:
        return self.file("train").tasks

    @property
    def dev(self) -> list[Task]:
        return self.file("dev").tasks

    def _check_db_root(self) -> None:
        if self.uses_databases and not self.db_root.is_dir():
            raise UserInputError(f"database root not found: {self.db_root} (training.data.db_root)")

    def _load(self, name: FileSplit) -> SplitFile:
        from skyrl_tool_agent.data.builtin.location import builtin_data_dir

        data = self.config.training.data
        if data.dataset == "builtin":
            builtin_data_dir()  # built into the cache on first use (a wheel install has no data/processed)
        if data.dataset == "spider":
            from skyrl_tool_agent.data.spider import load_spider, split_file

            root = expand_path(data.spider_root)
            try:
                split_file(root, name)
            except FileNotFoundError as exc:
                raise UserInputError(f"Spider not found at {root} (training.data.spider_root): {exc}") from exc
            self._check_db_root()
            loaded = load_spider(root, name)
            tasks, reasons = loaded.tasks, ({"missing_database": loaded.skipped} if loaded.skipped else {})
            broken = gold_sql_errors(tasks, self.db_root) if self.uses_databases else {}
            if broken:
                logger.warning("skipping %d Spider %s questions whose gold SQL fails on its database: %s", len(broken),
                               name, "; ".join(f"{k}: {v}" for k, v in sorted(broken.items())))
                tasks = [t for t in tasks if t.task_id not in broken]
                reasons["gold_sql_error"] = len(broken)
            return SplitFile(tasks, reasons)
        self._check_db_root()
        path = data.resolved_train_file() if name == "train" else data.resolved_dev_file()
        try:
            tasks, bad = load_checked_tasks(path, db_root=self.db_root if self.uses_databases else None,
                                              skip_bad_records=self.skip_bad_records,
                                              gold_check=gold_check(self.config.env.sql_timeout_s))
        except FileNotFoundError as exc:
            raise UserInputError(f"{exc} (training.data.{name}_file); {_BUILD_HINT}") from exc
        except ValueError as exc:  # BadRecordsError is a UserInputError already; a file that is no JSON list is not
            raise UserInputError(str(exc)) from exc
        return SplitFile(tasks, {"bad_record": len(bad)} if bad else {})

    # ---------------------------------------------------------- derived splits
    def pool_and_validation(self) -> tuple[list[Task], list[Task]]:
        """(generated pool without validation, validation split) of the built-in dataset: every slot
        assignment not in dev, minus `training.data.validation_tasks` unseen queries held out."""
        if self._pool_and_validation is None:
            from skyrl_tool_agent.data.builtin.pool import generated_train_pool, split_validation

            if self.config.training.data.dataset != "builtin":
                raise UserInputError("the generated pool and its validation split need the builtin dataset")
            data = self.config.training.data
            try:
                pool = generated_train_pool(self.db_root, held_out=self.dev)
                self._pool_and_validation = split_validation(pool, self.train, data.validation_tasks,
                                                             seed=self.config.training.seed)
            except (FileNotFoundError, ValueError) as exc:
                raise UserInputError(f"{exc} (training.data: the generated pool)") from exc
        return self._pool_and_validation

    def validation(self) -> list[Task]:
        """The held-out yardstick for curves and tuning (module docstring)."""
        if self.config.training.data.dataset == "builtin":
            return self.pool_and_validation()[1]
        return fixed_subset(self.dev, SPIDER_VALIDATION_TASKS, seed=self.config.training.seed + 1)

    def test(self) -> list[Task]:
        """The test split (module docstring; builtin only): its databases are under `test_db_root()`."""
        from skyrl_tool_agent.data.builtin.test_split import generated_test_split, test_db_root

        if self._test is None:
            if self.config.training.data.dataset != "builtin":
                raise UserInputError("the test split needs the builtin dataset (its generator)")
            pool, validation = self.pool_and_validation()
            try:
                self._test = generated_test_split(test_db_root(), [*self.train, *pool, *validation, *self.dev],
                                                  self.config.training.data.test_tasks)
            except (FileNotFoundError, ValueError) as exc:
                raise UserInputError(f"{exc} (training.data.test_tasks: the test split)") from exc
        return self._test

    def validation_at_hand(self) -> list[Task] | None:
        """`validation()` where this run has it without generating anything more; None for the
        built-in data's training file (the pool is then never generated)."""
        t = self.config.training
        if t.data.dataset != "builtin" or train_pool_kind(self.config) != "file" or t.eval_split == "validation":
            return self.validation()
        return None

    def rl_train(self) -> list[Task]:
        """The tasks GRPO samples (`training.data.train_pool`): the training file's, the generated
        pool less the validation split, or that pool's frontier (`frontier`)."""
        which = train_pool_kind(self.config)
        if which == "file":
            return self.train
        pool = self.pool_and_validation()[0]
        return self.frontier(pool) if which == "frontier" else pool

    def frontier(self, pool: list[Task]) -> list[Task]:
        """The pool tasks with mixed sampled outcomes in the embedded model's frontier.json, which
        must have been measured on the weights this run starts from (`data.frontier`)."""
        from skyrl_tool_agent.policy.manifest import model_weights_sha256

        model = self.config.model
        if not model.is_embedded():
            raise UserInputError("training.data.train_pool: frontier needs the embedded model (its frontier.json); "
                                 "for another model use generated")
        model_dir = model.resolved_embedded_dir()
        try:
            sha = model_weights_sha256(model_dir)
        except ValueError as exc:
            raise UserInputError(f"train_pool frontier: {exc}") from None
        mixed = read_frontier(model_dir / FRONTIER_FILE, model_sha256=sha).mixed(self.config.training.data.frontier_tasks)
        tasks = [t for t in pool if t.task_id in mixed]
        if not tasks:
            raise UserInputError(f"{model_dir / FRONTIER_FILE} names no task of this pool with mixed outcomes "
                                 "(measured on another pool? measure it anew with build-model --frontier)")
        logger.info("train_pool frontier: %d of %d pool tasks (mixed outcomes at the start, %s)", len(tasks),
                    len(pool), model_dir / FRONTIER_FILE)
        return tasks

    def run_eval(self) -> list[Task]:
        """What a training run evaluates (`training.eval_split`): a fixed, stratified subset of
        `eval_num_tasks` dev tasks (all of them by default), or the validation split's first ones."""
        t = self.config.training
        if t.eval_split == "validation":
            if t.data.dataset != "builtin":
                raise UserInputError("training.eval_split: validation needs the builtin dataset (its generated pool)")
            return self.validation()[: t.eval_num_tasks]
        return fixed_subset(self.dev, t.eval_num_tasks, seed=t.seed)


def train_pool_kind(config: Config) -> Literal["file", "generated", "frontier"]:
    """`training.data.train_pool` resolved: auto takes the frontier when the embedded model has
    a frontier.json (measured by `build-model --frontier`)."""
    model = config.model
    available = model.is_embedded() and (model.resolved_embedded_dir() / FRONTIER_FILE).is_file()
    return config.training.data.resolved_train_pool(frontier_available=available)


@dataclass
class EvalTaskSet:
    """The tasks an evaluation runs, where their databases are, and what was left out.

    `skipped`: questions of the split that cannot run, `skipped_reasons` by reason
    (missing_database, gold_sql_error, bad_record); `available`: questions that can run, before `--limit`.
    """

    tasks: list[Task]
    db_root: Path
    dataset: str
    split: str
    skipped: int = 0
    available: int = 0
    skipped_reasons: dict[str, int] = field(default_factory=dict)


def load_eval_tasks(config: Config, split: Split = "dev", *, limit: int | None = None, seed: int = 0,
                    skip_bad_records: bool = False) -> EvalTaskSet:
    """The `split` of `config`'s data (`TaskSplits`), or a seeded stratified subset of `limit` of them
    (`fixed_subset`: two runs compare); a missing file is a `UserInputError` naming it."""
    if limit is not None and limit < 1:
        raise UserInputError(f"--limit must be >= 1, got {limit}")
    splits = TaskSplits(config, skip_bad_records=skip_bad_records)
    db_root = splits.db_root
    # validation and test are generated (nothing left out of them); test on databases of its own
    if split == "test":
        from skyrl_tool_agent.data.builtin.test_split import test_db_root

        chosen, db_root = SplitFile(splits.test()), test_db_root()
    else:
        chosen = SplitFile(splits.validation()) if split == "validation" else splits.file(split)
    tasks = chosen.tasks if limit is None else fixed_subset(chosen.tasks, limit, seed=seed)
    return EvalTaskSet(tasks, db_root, config.training.data.dataset, split, chosen.skipped, len(chosen.tasks),
                       dict(chosen.skipped_reasons))
