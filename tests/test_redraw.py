"""Constants redrawn from the database (`warmstart.redraw`), on real built-in tasks and their real
SQLite files: the question and the gold query change together, the new query keeps gold's
skeleton (only the constants differ: `eval.anatomy.skeleton`), runs and returns rows; a constant
the question does not state is never touched; every draw of a seed repeats."""

from __future__ import annotations

import json
import random

import pytest

from mcp_tools.sandbox import QueryResult
from skyrl_tool_agent.data.tasks import Task
from skyrl_tool_agent.eval.anatomy import skeleton
from skyrl_tool_agent.rewards.limits import run_bounded
from skyrl_tool_agent.warmstart.build import oracle_episodes
from skyrl_tool_agent.warmstart.redraw import redraw_constants, stated_constants
from tests.conftest import BUILTIN_DATA

DEV = [Task(**r) for r in json.loads((BUILTIN_DATA / "dev.json").read_text())]


def db(task: Task):
    return BUILTIN_DATA / "databases" / task.db_id / f"{task.db_id}.sqlite"


def rows(task: Task) -> QueryResult:
    return run_bounded(db(task), task.gold_sql, timeout_s=5.0, max_rows=None)


def task(question: str, gold: str, db_id: str = "library") -> Task:
    return Task(task_id="t", db_id=db_id, question=question, gold_sql=gold, difficulty="easy")


@pytest.mark.parametrize("original", [
    task("List the titles of books longer than 713 pages.", "SELECT title FROM books WHERE pages > 713"),
    task("How many books are in the 'Fantasy' genre?", "SELECT COUNT(*) FROM books WHERE genre = 'Fantasy'"),
    task("List the 'Biography' books published before 2003.",
         "SELECT title FROM books WHERE genre = 'Biography' AND published_year < 2003"),
    task("List the loan dates of the book 'The Hidden Machine'.", "SELECT T2.loan_date FROM books AS T1 JOIN loans AS T2 "
         "ON T1.book_id = T2.book_id WHERE T1.title = 'The Hidden Machine'"),
])
def test_question_and_gold_change_together_and_the_answer_is_recomputed(original: Task) -> None:
    redrawn = redraw_constants(original, db(original), random.Random(3))
    assert redrawn is not None and redrawn.task_id == "t~redrawn"
    constants = stated_constants(original)
    assert constants
    for c in constants:  # the old constant is gone from both, a new one of its column stands in both
        assert c.text not in redrawn.question and c.sql not in redrawn.gold_sql
    new = {c.text for c in stated_constants(redrawn)}
    assert len(new) == len(constants) and all(text in redrawn.question for text in new)
    assert skeleton(redrawn.gold_sql) == skeleton(original.gold_sql)  # only the constants differ
    assert rows(redrawn).row_count > 0  # the new gold query runs and answers something


def test_a_constant_the_question_does_not_state_is_left_alone() -> None:
    unstated = task("Which book is the longest?", "SELECT title FROM books WHERE pages > 700")
    assert stated_constants(unstated) == [] and redraw_constants(unstated, db(unstated), random.Random(0)) is None
    twice = task("Books over 700 pages, or 700 pages exactly?", "SELECT title FROM books WHERE pages >= 700")
    assert stated_constants(twice) == []  # the question states it twice: which one is the constant?


def test_most_dev_tasks_can_be_redrawn_and_each_draw_repeats_for_its_seed() -> None:
    redrawn = [redraw_constants(t, db(t), random.Random(7)) for t in DEV[:80]]
    assert sum(r is not None for r in redrawn) >= 60
    again = [redraw_constants(t, db(t), random.Random(7)) for t in DEV[:80]]
    assert redrawn == again
    changed = [(t, r) for t, r in zip(DEV, redrawn) if r is not None]
    assert all(r.question != t.question and r.gold_sql != t.gold_sql for t, r in changed)


# ---------------------------------------------------------------------------- the build's epochs
TRAIN = [Task(**r) for r in json.loads((BUILTIN_DATA / "train.json").read_text())]


@pytest.fixture(scope="module")
def runtime():
    from skyrl_tool_agent.config import Config
    from skyrl_tool_agent.env.pools import EnvRuntime

    rt = EnvRuntime(Config().env, BUILTIN_DATA / "databases")
    yield rt
    rt.close()


def epochs(runtime, tasks: list[Task], held_out_sql: set[str] | None = None):
    from transformers import AutoTokenizer

    from skyrl_tool_agent.config import SHIPPED_EMBEDDED_DIR, Config
    from skyrl_tool_agent.jobs.build_model import oracle_collector_settings
    from skyrl_tool_agent.warmstart.build import RedrawnEpochs

    return RedrawnEpochs(runtime, tasks, oracle_collector_settings(Config()),
                         AutoTokenizer.from_pretrained(SHIPPED_EMBEDDED_DIR), seed=0, held_out_sql=held_out_sql or set())


def test_each_epoch_trains_on_new_constants_and_every_example_still_executes(runtime) -> None:
    """The build's examples (`RedrawnEpochs`, what `supervised_finetune` packs each epoch) on real
    train.json tasks: from one epoch to the next most tasks' questions and gold queries change
    together, each redrawn query runs on its database and returns rows, the oracle episode trained
    on runs the new query and answers with its recomputed rows, and an epoch rebuilt gives the
    same examples (a resumed build)."""
    tasks = TRAIN[::50][:24]
    build = epochs(runtime, tasks)
    first, first_tasks = build(0), build.draw(0)  # a draw is a function of (seed, epoch): what build trained on
    second, second_tasks = build(1), build.draw(1)
    assert len(first) == len(second) == len(tasks)  # the oracle solved every redrawn task
    moved = [(a, b) for a, b in zip(first_tasks, second_tasks) if a.gold_sql != b.gold_sql]
    assert len(moved) >= len(tasks) // 2
    for a, b in moved:
        assert a.question != b.question and skeleton(a.gold_sql) == skeleton(b.gold_sql)
    assert first != second  # the token ids trained on differ between the epochs
    for task in second_tasks:
        if task.task_id.endswith("~redrawn"):
            assert rows(task).row_count > 0
    # the oracle episode of a redrawn task runs the new query (its answer is the new query's rows)
    conversations = oracle_episodes(runtime, second_tasks, build.settings)
    for task in second_tasks:
        text = json.dumps(conversations[task.task_id])
        assert json.dumps(task.gold_sql)[1:-1] in text and json.dumps(task.question)[1:-1] in text
    assert build(1) == second and build.draw(1) == second_tasks  # the same epoch, the same draw


def test_a_redraw_never_becomes_a_held_out_query(runtime) -> None:
    """A pool query with its constants redrawn can land on a validation or dev query: such a draw
    is never trained on (tried again, else the task stays as it is)."""
    tasks = TRAIN[::50][:24]
    free = epochs(runtime, tasks).draw(0)
    held = {t.gold_sql for t in free if t.task_id.endswith("~redrawn")}
    assert held
    guarded = epochs(runtime, tasks, held_out_sql=held).draw(0)
    assert not {t.gold_sql for t in guarded if t.task_id.endswith("~redrawn")} & held
