"""The generated training pool (`training.data.train_pool: generated`): built from the real built-in
SQLite files, disjoint from dev, a superset of train, and the errors when it cannot be built."""

from __future__ import annotations

import shutil
import sqlite3
from collections import Counter
from pathlib import Path

import pytest

from skyrl_tool_agent.config import ConfigError, UserInputError, load_config
from skyrl_tool_agent.data.builtin.domains import DOMAINS
from skyrl_tool_agent.data.builtin.pool import generated_train_pool, split_validation
from skyrl_tool_agent.data.tasks import db_path_for, load_tasks
from skyrl_tool_agent.pipeline import rl_train_tasks, run_eval_tasks, validation_tasks
from tests.fixtures.config_files import CONFIGS, REPO

DATA = REPO / "data" / "processed"


@pytest.fixture(scope="module")
def splits():
    return load_tasks(DATA / "train.json"), load_tasks(DATA / "dev.json")


@pytest.fixture(scope="module")
def pool(splits):
    return generated_train_pool(DATA / "databases", held_out=splits[1])


def test_pool_is_disjoint_from_dev_and_covers_train(pool, splits) -> None:
    train, dev = splits
    assert {t.gold_sql for t in pool}.isdisjoint({t.gold_sql for t in dev})
    assert {t.question for t in pool}.isdisjoint({t.question for t in dev})
    pool_pairs = {(t.question, t.gold_sql) for t in pool}
    train_pairs = {(t.question, t.gold_sql) for t in train}
    assert train_pairs <= pool_pairs  # train is one paraphrase per assignment
    assert len(pool) >= 5 * len(train)
    assert len(pool_pairs - train_pairs) >= 4 * len(train)  # questions the warm start never saw
    # Every template that has dev tasks still has training questions in the pool, and every difficulty occurs.
    assert {t.template_id for t in dev} <= {t.template_id for t in pool}
    assert set(Counter(t.difficulty for t in pool)) == {"easy", "medium", "hard"}
    assert len({t.task_id for t in pool}) == len(pool) and all(t.split == "train" for t in pool)


def test_pool_gold_queries_run_and_answer(pool) -> None:
    sample = pool[:: max(1, len(pool) // 200)]
    for task in sample:
        con = sqlite3.connect(f"file:{db_path_for(DATA / 'databases', task.db_id)}?mode=ro", uri=True)
        try:
            rows = con.execute(task.gold_sql).fetchall()
        finally:
            con.close()
        assert rows, task


def test_pool_is_deterministic(pool, splits) -> None:
    again = generated_train_pool(DATA / "databases", held_out=splits[1])
    assert [t.model_dump() for t in again] == [t.model_dump() for t in pool]


def test_rl_train_tasks_follows_the_knob(pool, splits) -> None:
    train, dev = splits
    config = load_config(CONFIGS, ["training.data.train_pool=file"])
    assert rl_train_tasks(config, train, dev, DATA / "databases") is train
    config = load_config(CONFIGS, ["training.data.train_pool=generated", "training.data.validation_tasks=50"])
    rl_pool = rl_train_tasks(config, train, dev, DATA / "databases")
    held = {t.gold_sql for t in validation_tasks(config, train, dev, DATA / "databases")}
    assert len(held) == 50
    assert rl_pool == [t for t in pool if t.gold_sql not in held]  # the pool less every paraphrase of validation


def test_validation_split_is_unseen_by_train_and_pool(pool, splits) -> None:
    train, dev = splits
    rest, val = split_validation(pool, train, 128, seed=42)
    val_sql = {t.gold_sql for t in val}
    assert len(val) == len(val_sql) == 128  # one question per held-out query
    assert val_sql.isdisjoint({t.gold_sql for t in rest})
    assert val_sql.isdisjoint({t.gold_sql for t in train}) and val_sql.isdisjoint({t.gold_sql for t in dev})
    assert len(rest) + sum(1 for t in pool if t.gold_sql in val_sql) == len(pool)
    assert set(Counter(t.difficulty for t in val)) == {"easy", "medium", "hard"}
    again_rest, again_val = split_validation(pool, train, 128, seed=42)
    assert again_val == val and again_rest == rest  # deterministic
    assert {t.gold_sql for t in split_validation(pool, train, 128, seed=7)[1]} != val_sql  # the seed picks
    with pytest.raises(ValueError, match="more queries than the pool's"):
        split_validation(pool, train, len(pool), seed=0)


def test_missing_or_foreign_databases_are_user_errors(splits, tmp_path: Path) -> None:
    train, dev = splits
    config = load_config(CONFIGS, ["training.data.train_pool=generated"])
    with pytest.raises(UserInputError, match=r"built-in database not found: .*\(training.data: the generated pool\)"):
        rl_train_tasks(config, train, dev, tmp_path / "nowhere")
    # Right file names, wrong contents: an empty SQLite database where the first domain's should be.
    root = tmp_path / "foreign"
    shutil.copytree(DATA / "databases", root)
    first = db_path_for(root, DOMAINS[0].db_id)
    first.unlink()
    sqlite3.connect(first).close()
    with pytest.raises(UserInputError, match=rf"is not the built-in {DOMAINS[0].db_id} database .*no such table"):
        rl_train_tasks(config, train, dev, root)


def test_generated_pool_needs_the_builtin_dataset() -> None:
    with pytest.raises(ConfigError) as info:
        load_config(CONFIGS, ["training.data.dataset=spider", "training.data.train_pool=generated"])
    message = str(info.value)
    assert "\n" not in message and "train_pool 'generated' needs dataset 'builtin'" in message


def test_eval_split_picks_what_a_run_evaluates(splits) -> None:
    train, dev = splits
    dev_run = load_config(CONFIGS)
    assert run_eval_tasks(dev_run, train, dev, DATA / "databases") == sorted(dev, key=lambda t: t.task_id)  # all 320
    tuning = load_config(CONFIGS, ["training.eval_split=validation", "training.eval_num_tasks=40"])
    tasks = run_eval_tasks(tuning, train, dev, DATA / "databases")
    assert tasks == validation_tasks(tuning, train, dev, DATA / "databases")[:40]
    assert {t.gold_sql for t in tasks}.isdisjoint({t.gold_sql for t in dev})
    spider = load_config(CONFIGS, ["training.eval_split=validation", "training.data.dataset=spider"])
    with pytest.raises(UserInputError, match="eval_split: validation needs the builtin dataset"):
        run_eval_tasks(spider, train, dev, DATA / "databases")
