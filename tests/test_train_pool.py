"""The generated training pool (`training.data.train_pool: generated`): built from the real built-in
SQLite files, disjoint from dev, a superset of train, and the errors when it cannot be built."""

from __future__ import annotations

import logging
import shutil
import sqlite3
from collections import Counter
from pathlib import Path

import pytest

from skyrl_tool_agent.config import ConfigError, UserInputError, load_config
from skyrl_tool_agent.data.builtin.domains import DOMAINS
from skyrl_tool_agent.data.builtin.pool import generated_train_pool, split_validation
from skyrl_tool_agent.data.tasks import db_path_for, load_tasks
from skyrl_tool_agent.eval.splits import SplitFile, TaskSplits
from tests.fixtures.config_files import CONFIGS, REPO

DATA = REPO / "data" / "processed"


@pytest.fixture(scope="module")
def splits():
    return load_tasks(DATA / "train.json"), load_tasks(DATA / "dev.json")


def splits_of(config, train, dev, db_root: Path = DATA / "databases") -> TaskSplits:
    """`TaskSplits`' rules over tasks at hand (no file read)."""
    splits = TaskSplits(config)
    splits._files = {"train": SplitFile(train), "dev": SplitFile(dev)}
    splits.db_root = db_root
    return splits


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


def test_each_template_has_one_difficulty_whatever_fills_its_slots(pool) -> None:
    """The pool takes a template's difficulty from its first instance (`template_difficulty`): Spider's
    hardness, parsed from every distinct query of a spread of 1 in 4 templates, is one per template."""
    from skyrl_tool_agent.data.hardness import spider_hardness, to_difficulty

    templates = sorted({t.template_id for t in pool})[::4]
    queries: dict[str, set[str]] = {tid: set() for tid in templates}
    for task in pool:
        if task.template_id in queries:
            queries[task.template_id].add(task.gold_sql)
    for tid, sqls in queries.items():
        found = {to_difficulty(spider_hardness(sql)) for sql in sorted(sqls)[:6]}
        assert found == {next(t.difficulty for t in pool if t.template_id == tid)}, (tid, found)


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
    from skyrl_tool_agent.data.builtin import pool as pools

    pools._POOLS.clear()  # built again, not this process's copy
    again = generated_train_pool(DATA / "databases", held_out=splits[1])
    assert again is not pool and [t.model_dump() for t in again] == [t.model_dump() for t in pool]


def test_a_pool_is_built_once_a_process_until_its_databases_or_held_out_tasks_change(splits, tmp_path, caplog) -> None:
    """The same databases and held-out tasks: the pool built before (a list of its own); fewer tasks
    held out, or a database file rewritten since: built again."""
    shutil.copytree(DATA / "databases", tmp_path / "dbs")
    dev = splits[1]
    with caplog.at_level(logging.INFO, logger="skyrl_tool_agent.data.builtin.pool"):
        first = generated_train_pool(tmp_path / "dbs", held_out=dev)
        second = generated_train_pool(tmp_path / "dbs", held_out=dev)
        fewer_held_out = generated_train_pool(tmp_path / "dbs", held_out=dev[:-10])
        with sqlite3.connect(next((tmp_path / "dbs").glob("*/*.sqlite"))) as con:
            con.execute("PRAGMA user_version = 7")  # the file rewritten, its rows the same
        rewritten = generated_train_pool(tmp_path / "dbs", held_out=dev)
    builds = [r for r in caplog.records if r.getMessage().startswith("generated training pool")]
    assert len(builds) == 3, [r.getMessage() for r in builds]  # not for `second`
    assert second == first and second is not first
    assert len(fewer_held_out) > len(first) and rewritten == first


def test_rl_train_tasks_follows_the_knob(pool, splits) -> None:
    train, dev = splits
    config = load_config(CONFIGS, ["training.data.train_pool=file"])
    assert splits_of(config, train, dev, DATA / "databases").rl_train() is train
    config = load_config(CONFIGS, ["training.data.train_pool=generated", "training.data.validation_tasks=50"])
    rl_pool = splits_of(config, train, dev, DATA / "databases").rl_train()
    held = {t.gold_sql for t in splits_of(config, train, dev).validation()}
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
        splits_of(config, train, dev, tmp_path / "nowhere").rl_train()
    # Right file names, wrong contents: an empty SQLite database where the first domain's should be.
    root = tmp_path / "foreign"
    shutil.copytree(DATA / "databases", root)
    first = db_path_for(root, DOMAINS[0].db_id)
    first.unlink()
    sqlite3.connect(first).close()
    with pytest.raises(UserInputError, match=rf"is not the built-in {DOMAINS[0].db_id} database .*no such table"):
        splits_of(config, train, dev, root).rl_train()


def test_generated_pool_needs_the_builtin_dataset() -> None:
    with pytest.raises(ConfigError) as info:
        load_config(CONFIGS, ["training.data.dataset=spider", "training.data.train_pool=generated"])
    message = str(info.value)
    assert "\n" not in message and "train_pool 'generated' needs dataset 'builtin'" in message


def test_eval_split_picks_what_a_run_evaluates(splits) -> None:
    train, dev = splits
    dev_run = load_config(CONFIGS)
    assert splits_of(dev_run, train, dev).run_eval() == sorted(dev, key=lambda t: t.task_id)  # all 320
    tuning = load_config(CONFIGS, ["training.eval_split=validation", "training.eval_num_tasks=40"])
    tasks = splits_of(tuning, train, dev).run_eval()
    assert tasks == splits_of(tuning, train, dev).validation()[:40]
    assert {t.gold_sql for t in tasks}.isdisjoint({t.gold_sql for t in dev})
    spider = load_config(CONFIGS, ["training.eval_split=validation", "training.data.dataset=spider"])
    with pytest.raises(UserInputError, match="eval_split: validation needs the builtin dataset"):
        splits_of(spider, train, dev).run_eval()


def _spider_with_a_broken_gold_query(root: Path) -> None:
    """A Spider-layout root: dev with one question whose gold query SQLite cannot prepare."""
    import json

    from tests.fixtures.tiny_db import make_shop_db

    make_shop_db(root / "database")
    good = [{"db_id": "shop", "question": f"q{i}", "query": "SELECT count(*) FROM customer"} for i in range(3)]
    broken = {"db_id": "shop", "question": "q-broken", "query": "SELECT x FROM no_such_table"}
    (root / "dev.json").write_text(json.dumps([*good[:2], broken]))
    (root / "train_spider.json").write_text(json.dumps(good))


def test_training_and_evaluation_mean_the_same_tasks_by_a_split(tmp_path: Path) -> None:
    """One owner of the splits (`eval.splits`): the dev tasks a training run evaluates are the
    evaluate command's dev tasks. Training loaded its own splits before and kept a Spider question
    whose gold query cannot run, which the evaluate command left out (and the reward raises on)."""
    from skyrl_tool_agent.eval.splits import load_eval_tasks

    _spider_with_a_broken_gold_query(tmp_path)
    config = load_config(CONFIGS, ["training.data.dataset=spider", f"training.data.spider_root={tmp_path}"])
    run = TaskSplits.load(config)
    evaluated = load_eval_tasks(config, "dev")
    assert run.dev == run.run_eval() == evaluated.tasks and len(evaluated.tasks) == 2
    assert evaluated.skipped_reasons == {"gold_sql_error": 1}
    assert run.train == load_eval_tasks(config, "train").tasks
    builtin = load_config(CONFIGS, ["training.data.validation_tasks=16"])
    assert TaskSplits.load(builtin).validation() == load_eval_tasks(builtin, "validation").tasks


def test_the_test_split_is_new_to_every_other_split_and_the_same_for_every_seed() -> None:
    """Issue 58: the test split shares no question and no gold query with train, the pool (what
    the shipped start was trained on and GRPO samples), validation (what settings are chosen on)
    or dev; its gold queries answer on its own databases (another generator seed: other rows),
    it covers the templates and difficulties, and every run seed gets the same tasks. The pool and
    validation are what they were without it."""
    from skyrl_tool_agent.data.builtin.test_split import test_db_root
    from skyrl_tool_agent.eval.splits import load_eval_tasks

    config = load_config()
    splits = TaskSplits.load(config)
    pool, validation = splits.pool_and_validation()
    before = ([t.model_dump() for t in pool], [t.model_dump() for t in validation])
    test = splits.test()
    assert len(test) == config.training.data.test_tasks == 256
    assert ([t.model_dump() for t in pool], [t.model_dump() for t in validation]) == before
    for other in (splits.train, pool, validation, splits.dev):
        assert {t.question for t in test}.isdisjoint({t.question for t in other})
        assert {t.gold_sql for t in test}.isdisjoint({t.gold_sql for t in other})
    assert len({t.gold_sql for t in test}) == len({t.task_id for t in test}) == 256
    assert all(t.split == "test" and t.task_id.startswith("builtin-test-") for t in test)
    assert len({t.template_id for t in test}) >= 95 and set(Counter(t.difficulty for t in test)) == {"easy", "medium", "hard"}
    root = test_db_root()
    assert root != splits.db_root and sorted(p.name for p in root.iterdir()) == sorted(d.db_id for d in DOMAINS)
    for task in test[::16]:
        con = sqlite3.connect(f"file:{db_path_for(root, task.db_id)}?mode=ro", uri=True)
        try:
            assert con.execute(task.gold_sql).fetchall(), task
        finally:
            con.close()
    other_seed = TaskSplits.load(load_config(overrides=["training.seed=7"])).test()
    assert [t.model_dump() for t in other_seed] == [t.model_dump() for t in test]
    # `eval --split test` evaluates these tasks on their own databases.
    selected = load_eval_tasks(config, "test", limit=8)
    assert selected.db_root == root and {t.task_id for t in selected.tasks} <= {t.task_id for t in test}
