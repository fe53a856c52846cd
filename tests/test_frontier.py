"""The frontier (`training.data.train_pool: frontier`): measured by `build-model --frontier` on a
copy of the shipped model through the real MCP env, written beside the weights, read back with
its checks, and the tasks GRPO then trains on are exactly the pool's mixed-outcome ones."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from skyrl_tool_agent.config import SHIPPED_EMBEDDED_DIR, UserInputError, load_config
from skyrl_tool_agent.data.frontier import FRONTIER_FILE, Frontier, read_frontier
from skyrl_tool_agent.eval.splits import TaskSplits
from skyrl_tool_agent.data.loader import build_loader
from skyrl_tool_agent.jobs.build_model import build_frontier
from skyrl_tool_agent.policy.manifest import model_weights_sha256


@pytest.fixture(scope="module")
def measured(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    model_dir = tmp_path_factory.mktemp("frontier") / "embedded"
    shutil.copytree(SHIPPED_EMBEDDED_DIR, model_dir, ignore=shutil.ignore_patterns(FRONTIER_FILE))
    config = load_config(overrides=[f"model.embedded_dir={model_dir}", "training.data.validation_tasks=8",
                                    "grpo.max_new_tokens_per_turn=32"])  # short episodes: the file's form is tested
    summary = build_frontier(config, num_tasks=4, samples=2, command="test")  # 4: the pool test needs them
    return model_dir, summary


def frontier_config(model_dir: Path, *more: str):
    return load_config(overrides=[f"model.embedded_dir={model_dir}", "training.data.validation_tasks=8",
                                  "training.data.train_pool=frontier", *more])


def test_measured_counts_are_per_pool_task_and_keyed_by_the_weights(measured) -> None:
    model_dir, summary = measured
    frontier = read_frontier(model_dir / FRONTIER_FILE, model_sha256=model_weights_sha256(model_dir))
    splits = TaskSplits.load(frontier_config(model_dir))
    pool_ids = {t.task_id for t in splits.pool_and_validation()[0]}
    assert len(frontier.counts) == 4 and set(frontier.counts) <= pool_ids  # validation and dev never measured
    assert all(0 <= c <= 2 for c in frontier.counts.values())
    assert (frontier.samples, frontier.temperature, frontier.command) == (2, 1.0, "test")
    assert summary["tasks"] == 4 and summary["mixed"] + summary["never"] + summary["always"] == 4


def test_the_frontier_pool_is_exactly_the_mixed_tasks(measured) -> None:
    model_dir, _ = measured
    path = model_dir / FRONTIER_FILE
    record = json.loads(path.read_text())
    ids = sorted(record["counts"])
    record["counts"] = {ids[0]: 1, ids[1]: 0, ids[2]: 2, ids[3]: 1}  # two mixed, one never, one always
    scripted = model_dir.parent / "scripted"
    shutil.copytree(model_dir, scripted)
    (scripted / FRONTIER_FILE).write_text(json.dumps(record))
    config = frontier_config(scripted, "training.tasks_per_step=2", "training.seed=3")
    tasks = TaskSplits.load(config).rl_train()
    assert sorted(t.task_id for t in tasks) == [ids[0], ids[3]]
    # training.data.frontier_tasks: the ones nearest a pass rate of 1/2 (here equal: the first by id)
    assert [t.task_id for t in TaskSplits.load(frontier_config(scripted, "training.data.frontier_tasks=1")).rl_train()] == [ids[0]]
    # revisited: the loader goes on drawing the same two tasks, epoch after epoch
    loader = build_loader(config, tasks)
    drawn = [t.task_id for _ in range(4) for t in loader.next_batch()]
    assert len(drawn) == 8 and set(drawn) == {ids[0], ids[3]}


def test_a_frontier_of_other_weights_or_a_damaged_one_is_one_line(measured, tmp_path: Path) -> None:
    model_dir, _ = measured
    good = json.loads((model_dir / FRONTIER_FILE).read_text())
    cases = {
        "measured on other weights": {**good, "model_sha256": "0" * 64},
        "not an integer in": {**good, "counts": {"builtin-pool-00001": 3}},
        "not a frontier file": {**good, "format": 99},
    }
    for expected, record in cases.items():
        copy = tmp_path / expected.replace(" ", "_")
        shutil.copytree(model_dir, copy)
        (copy / FRONTIER_FILE).write_text(json.dumps(record))
        with pytest.raises(UserInputError, match=expected) as info:
            TaskSplits.load(frontier_config(copy)).rl_train()
        assert "\n" not in str(info.value)
    (copy / FRONTIER_FILE).unlink()
    with pytest.raises(UserInputError, match="build-model --frontier"):
        TaskSplits.load(frontier_config(copy)).rl_train()


def test_mixed_means_some_but_not_all_solved() -> None:
    frontier = Frontier(samples=4, temperature=1.0, model_sha256="x", counts={"a": 0, "b": 1, "c": 3, "d": 4, "e": 2})
    assert frontier.mixed() == {"b", "c", "e"}
    assert frontier.mixed(1) == {"e"} and frontier.mixed(2) == {"b", "e"}  # nearest 1/2 first, then by id
    frontier.counts.pop("e")
    assert frontier.summary() == {"tasks": 4, "mixed": 2, "never": 1, "always": 1, "pass@1": 0.5}


def test_auto_trains_on_the_frontier_only_where_one_was_measured(measured, tmp_path: Path) -> None:
    from skyrl_tool_agent.eval.splits import train_pool_kind

    model_dir, _ = measured
    assert train_pool_kind(load_config()) == "frontier"  # the shipped model ships its frontier.json
    assert train_pool_kind(load_config(overrides=[f"model.embedded_dir={model_dir}"])) == "frontier"
    bare = tmp_path / "bare"
    shutil.copytree(model_dir, bare, ignore=shutil.ignore_patterns(FRONTIER_FILE))
    assert train_pool_kind(load_config(overrides=[f"model.embedded_dir={bare}"])) == "generated"
    assert train_pool_kind(load_config(overrides=[f"model.name_or_path={bare}"])) == "generated"  # not the embedded one
    assert train_pool_kind(load_config(overrides=["training.data.train_file=x.json"])) == "file"
