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
