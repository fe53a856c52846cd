"""The error anatomy (`eval.anatomy`) on real queries against the built-in airline database:

- every category is hit by a query a policy could write, run in the reward's sandbox on the real
  SQLite file, and the order of the categories decides the overlaps (a wrong constant that empties
  the result is the constant's fault; a wrong join column is a wrong join);
- a correct answer and an unscored episode have no category;
- through a whole evaluation (a scripted agent over the real MCP server): the results' counts, each
  sample's category, the PNG, report.html's section; with a baseline, the paired intervals;
- the training record: `greedy_evaluation` carries the anatomy, `finish_run`'s deltas and the
  before/after table's rows follow it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from skyrl_tool_agent.config import EnvConfig
from skyrl_tool_agent.data.tasks import Task
from skyrl_tool_agent.env.chat_format import format_answer, format_tool_call
from skyrl_tool_agent.env.pools import EnvRuntime
from skyrl_tool_agent.eval.anatomy import (
    CATEGORIES,
    PredictionRunner,
    anatomy_changes,
    anatomy_counts,
    classify_answer,
    classify_episode,
    skeleton,
)
from skyrl_tool_agent.eval.compare import anatomy_comparison
from skyrl_tool_agent.eval.evaluate import EvalOptions, run_evaluation
from skyrl_tool_agent.reports.evaluation import OutputPaths, write_outputs
from skyrl_tool_agent.eval.metrics import eval_metrics
from skyrl_tool_agent.rollout.agents import Agent, AgentTurn, ScriptedAgent
from skyrl_tool_agent.rollout.collector import CollectorSettings
from skyrl_tool_agent.rollout.trajectory import EpisodeResult
from tests.conftest import BUILTIN_DATA

DB_ROOT = BUILTIN_DATA / "databases"
GOLD_PRICE = "SELECT flight_number FROM flights WHERE price > 300"
GOLD_FLIGHT = "SELECT departure_date FROM flights WHERE flight_number = 'SK616'"
GOLD_JOIN = ("SELECT T1.flight_number FROM flights AS T1 JOIN airports AS T2 ON T1.origin_airport_id = "
             "T2.airport_id WHERE T2.city = 'Paris'")

#: (final SQL, gold SQL, category): real mistakes, each run on the airline database.
CASES = [
    # the copy error: gold's skeleton, one constant wrong (rows still come back)
    ("SELECT flight_number FROM flights WHERE price > 330", GOLD_PRICE, "literal_only"),
    # a wrong constant that empties the result is still the constant's fault
    ("SELECT departure_date FROM flights WHERE flight_number = 'SK617'", GOLD_FLIGHT, "literal_only"),
    # aliases and case differ, the constant too: still gold's skeleton
    ("select t.flight_number from FLIGHTS as t where t.price > 310", GOLD_PRICE, "literal_only"),
    # another structure that returns nothing
    ("SELECT flight_number FROM flights WHERE price > 300 AND duration_minutes < 0", GOLD_PRICE, "empty_result"),
    # the condition on another column
    ("SELECT flight_number FROM flights WHERE duration_minutes > 300", GOLD_PRICE, "wrong_column"),
    # another table
    ("SELECT code FROM airports", "SELECT city FROM airports WHERE country = 'Japan'", "wrong_aggregate_or_condition"),
    ("SELECT name FROM passengers", "SELECT city FROM airports", "wrong_table_or_join"),
    # the join on the wrong key: a wrong join, not a wrong column
    (GOLD_JOIN.replace("T1.origin_airport_id", "T1.destination_airport_id"), GOLD_JOIN, "wrong_table_or_join"),
    # a subquery in a condition reads another table: a condition, not a table
    ("SELECT flight_number FROM flights WHERE price > 300 AND flight_id NOT IN (SELECT flight_id FROM bookings)",
     GOLD_PRICE, "wrong_aggregate_or_condition"),
    # the aggregate
    ("SELECT max(price) FROM flights WHERE price > 300", "SELECT count(*) FROM flights WHERE price > 300",
     "wrong_aggregate_or_condition"),
    # a condition left out
    ("SELECT flight_number FROM flights", GOLD_PRICE, "wrong_aggregate_or_condition"),
    # SQLite refuses it / sqlglot cannot parse it
    ("SELECT flight_no FROM flights WHERE price > 300", GOLD_PRICE, "not_executable"),
    ("SELEC flight_number FRM flights", GOLD_PRICE, "not_executable"),
    # gold itself, judged wrong (nothing in the query explains it)
    ("select FLIGHT_NUMBER from flights where price > 300", GOLD_PRICE, "other"),
]


@pytest.fixture(scope="module")
def runner() -> PredictionRunner:
    return PredictionRunner(DB_ROOT)


@pytest.mark.parametrize(("final_sql", "gold_sql", "expected"), CASES)
def test_each_real_mistake_gets_its_category(runner: PredictionRunner, final_sql: str, gold_sql: str,
                                             expected: str) -> None:
    result = EpisodeResult(task_id="t", db_id="airline", final_sql=final_sql)
    assert classify_episode(result, gold_sql, runner) == expected


def test_the_same_column_name_of_the_other_table_is_a_wrong_column(runner: PredictionRunner) -> None:
    # From the start's dev answers: `name` of departments for `name` of projects. Its bare name is
    # gold's (the clause sets of rewards.partial call the two equal), its constant too.
    gold = ("SELECT T1.name FROM projects AS T1 JOIN departments AS T2 ON T1.department_id = T2.department_id "
            "WHERE T2.name = 'Research'")
    final = gold.replace("SELECT T1.name", "SELECT T2.name")
    result = EpisodeResult(task_id="t", db_id="company_hr", final_sql=final)
    assert runner.run("company_hr", final).rows == 1
    assert classify_episode(result, gold, runner) == "wrong_column"


def test_every_category_is_covered() -> None:
    covered = {c for _, _, c in CASES} | {"no_answer", "tool_misuse", "retyped"}  # retyped: the test below
    assert covered == set(CATEGORIES)


def test_an_answer_other_than_the_right_query_it_ran_is_retyped(tmp_path: Path) -> None:
    """The start's commonest slip on new databases: it runs the right query through the real MCP
    server, then writes another as its answer. Only a tested query that returns gold's result makes
    the answer `retyped`; the last query the server answered is the tested one."""
    wrong = "SELECT flight_number FROM flights WHERE price > 330"
    broken = "SELECT flight_number FROM flights WHERE price > 300 AND"
    scripts = {  # task a-1 (gold: GOLD_PRICE), turn by turn
        "ran gold, answered a wrong constant": [_run(GOLD_PRICE), format_answer(wrong)],
        "ran gold, answered a broken query": [_run(GOLD_PRICE), format_answer(broken)],
        "ran gold, then a failing query, answered wrong": [_run(GOLD_PRICE), _run("SELECT nope FROM flights"),
                                                            format_answer(wrong)],
        "ran a wrong query, answered another": [_run(wrong.replace("330", "310")), format_answer(wrong)],
        "ran the wrong query it answered": [_run(wrong), format_answer(" " + wrong.lower() + ";")],
        "ran gold, then the wrong one it answered": [_run(GOLD_PRICE), _run(wrong), format_answer(wrong)],
        "ran gold, answered gold": [_run(GOLD_PRICE), format_answer(GOLD_PRICE)],
    }
    runtime = EnvRuntime(EnvConfig(), DB_ROOT)
    try:
        results = {name: run_evaluation(TASKS[:1], runtime, ScriptedAgent(lambda r, t=turns: t),
                                        CollectorSettings(max_turns=4), EvalOptions()).records[0]["samples"][0]
                   for name, turns in scripts.items()}
    finally:
        runtime.close()
    assert {name: r["error_category"] for name, r in results.items()} == {
        "ran gold, answered a wrong constant": "retyped",
        "ran gold, answered a broken query": "retyped",
        "ran gold, then a failing query, answered wrong": "retyped",
        "ran a wrong query, answered another": "literal_only",
        "ran the wrong query it answered": "literal_only",
        "ran gold, then the wrong one it answered": "literal_only",
        "ran gold, answered gold": None,
    }
    assert results["ran gold, then a failing query, answered wrong"]["last_query"] == GOLD_PRICE
    assert results["ran gold, then the wrong one it answered"]["last_query"] == wrong
    # without a database to run the tested query on, nothing is called retyped
    assert PredictionRunner(None).tested_right("airline", GOLD_PRICE, wrong, GOLD_PRICE) is False


def _run(sql: str) -> str:
    return format_tool_call("execute_sql", {"sql": sql})


def test_the_database_decides_what_sqlglot_cannot(runner: PredictionRunner) -> None:
    # Parses, so only the database says it does not run; returns nothing, so only the database says so.
    assert runner.run("airline", "SELECT flight_no FROM flights").rows is None
    assert runner.run("airline", "SELECT flight_number FROM flights WHERE price < 0").rows == 0
    assert runner.run("airline", GOLD_PRICE).rows == 1  # one row fetched is enough to know
    # the literal-only case above that empties the result does empty it (so the order decides)
    assert runner.run("airline", "SELECT departure_date FROM flights WHERE flight_number = 'SK617'").rows == 0
    unknown = classify_answer("SELECT flight_no FROM flights WHERE price > 300", GOLD_PRICE, None)
    assert unknown == "wrong_column"  # without the database: sqlglot's verdict alone
    assert runner.run("no_such_db", GOLD_PRICE).unknown


def test_no_answer_and_tool_misuse() -> None:
    assert classify_episode(EpisodeResult(task_id="t", db_id="airline", done_reason="max_turns"), GOLD_PRICE,
                            PredictionRunner(DB_ROOT)) == "no_answer"
    assert classify_answer(None, GOLD_PRICE, format_errors=2) == "tool_misuse"
    assert classify_answer(None, GOLD_PRICE, tool_errors=1) == "tool_misuse"


def test_solved_and_unscored_episodes_have_no_category(runner: PredictionRunner) -> None:
    solved = EpisodeResult(task_id="t", db_id="airline", final_sql=GOLD_PRICE, solved=True)
    lost = EpisodeResult(task_id="t", db_id="airline", final_sql=None, done_reason="error")
    assert classify_episode(solved, GOLD_PRICE, runner) is None
    assert classify_episode(lost, GOLD_PRICE, runner) is None


def test_skeleton_masks_constants_then_columns() -> None:
    assert skeleton("SELECT title FROM books WHERE pages > 713 LIMIT 3") == "SELECT title FROM books WHERE pages > ? LIMIT ?"
    assert skeleton("SELECT title FROM books WHERE pages > 713", columns=True) == "SELECT _c FROM books WHERE _c > ?"
    assert skeleton("SELECT T2.name FROM a AS T1 JOIN b AS T2 ON T1.id = T2.aid", columns=True) == \
        "SELECT _c FROM a JOIN b ON _c = _c"
    assert skeleton("not sql at all") is None


def test_counts_and_paired_changes() -> None:
    before = ["literal_only", "literal_only", None, "empty_result", "literal_only", None]
    after = [None, "literal_only", None, "empty_result", "wrong_column", None]
    solved_b, solved_a = [0, 0, 1, 0, 0, 1], [1, 0, 1, 0, 0, None]  # the last task unscored after
    counts = anatomy_counts(before, scored=6)
    assert counts["counts"]["literal_only"] == 3 and counts["wrong"] == 4
    assert counts["rates"]["literal_only"] == pytest.approx(0.5)
    changes = anatomy_changes(before, solved_b, after, solved_a)
    literal = changes["literal_only"]
    assert literal.n == 5 and literal.unscored == 1  # the unscored pair is left out
    assert literal.delta == pytest.approx(-2 / 5)
    assert literal.low <= literal.delta <= literal.high
    assert changes["wrong_column"].delta == pytest.approx(1 / 5)


# ---------------------------------------------------------------- through a whole evaluation
TASKS = [
    Task(task_id="a-1", db_id="airline", question="Flights dearer than 300?", gold_sql=GOLD_PRICE, difficulty="easy"),
    Task(task_id="a-2", db_id="airline", question="When does SK616 leave?", gold_sql=GOLD_FLIGHT, difficulty="easy"),
    Task(task_id="a-3", db_id="airline", question="Flights from Paris?", gold_sql=GOLD_JOIN, difficulty="medium"),
    Task(task_id="a-4", db_id="airline", question="How many flights over 300?",
         gold_sql="SELECT count(*) FROM flights WHERE price > 300", difficulty="medium"),
]


class AnswerAgent(Agent):
    """Answers each task with a fixed final query (None: a malformed tool call, then nothing)."""

    def __init__(self, answers: dict[str, str | None]) -> None:
        self.answers = answers

    async def act(self, requests):
        out = []
        for r in requests:
            sql = self.answers[r.task.task_id]
            text = format_answer(sql) if sql is not None else "<tool_call>{not json</tool_call>"
            out.append(AgentTurn(text))
        return out


def _evaluate(runtime: EnvRuntime, answers: dict[str, str | None], out: Path, baseline=None) -> dict:
    settings = CollectorSettings(max_turns=2, concurrency=4)
    run = run_evaluation(TASKS, runtime, AnswerAgent(answers), settings, EvalOptions(name="anatomy"))
    paths = write_outputs(run, OutputPaths.beside(out / "results.json"), baseline=baseline, db_root=DB_ROOT)
    return json.loads(paths.results.read_text())


def test_an_evaluation_reports_why_answers_are_wrong(tmp_path: Path) -> None:
    runtime = EnvRuntime(EnvConfig(), DB_ROOT)
    try:
        before = _evaluate(runtime, {"a-1": "SELECT flight_number FROM flights WHERE price > 330",
                                     "a-2": "SELECT departure_date FROM flights WHERE flight_number = 'SK617'",
                                     "a-3": GOLD_JOIN, "a-4": None}, tmp_path / "before")
        after = _evaluate(runtime, {"a-1": GOLD_PRICE, "a-2": "SELECT departure_date FROM flights",
                                    "a-3": GOLD_JOIN, "a-4": None}, tmp_path / "after", baseline=before)
    finally:
        runtime.close()
    anatomy = before["error_anatomy"]
    assert anatomy["counts"]["literal_only"] == 2 and anatomy["counts"]["tool_misuse"] == 1
    assert anatomy["wrong"] == 3 and anatomy["scored"] == 4
    records = [json.loads(line) for line in Path(before["files"]["trajectories"]).read_text().splitlines()]
    assert [r["samples"][0]["error_category"] for r in records] == ["literal_only", "literal_only", None, "tool_misuse"]
    assert Path(before["files"]["errors_png"]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    html = Path(after["files"]["report"]).read_text()
    assert 'id="errors"' in html and "literal only (wrong constant)" in html
    assert "Why answers are wrong, anatomy vs this run" in html  # the comparison's table
    after_records = [json.loads(line) for line in Path(after["files"]["trajectories"]).read_text().splitlines()]
    rows = {row.category: row for row in anatomy_comparison(before, after_records)}
    assert (rows["literal_only"].base, rows["literal_only"].current) == (2, 0)
    assert rows["literal_only"].change.delta == pytest.approx(-0.5)
    assert (rows["wrong_aggregate_or_condition"].base, rows["wrong_aggregate_or_condition"].current) == (0, 1)
    assert eval_metrics(before)["eval/errors/literal_only"] == pytest.approx(0.5)  # W&B and metrics.jsonl


def test_a_training_runs_greedy_record_carries_the_anatomy_into_before_after(capsys, tmp_path: Path) -> None:
    from skyrl_tool_agent.config import Config
    from skyrl_tool_agent.eval.greedy import greedy_evaluation
    from skyrl_tool_agent.eval.anatomy import anatomy_deltas
    from skyrl_tool_agent.reports.tables import RunSummary
    from skyrl_tool_agent.reports.tables import anatomy_rows, print_before_after, write_model_card

    settings = CollectorSettings(max_turns=2, concurrency=4)
    runtime = EnvRuntime(EnvConfig(), DB_ROOT)
    try:
        before = greedy_evaluation(AnswerAgent({"a-1": "SELECT flight_number FROM flights WHERE price > 330",
                                                "a-2": "SELECT departure_date FROM flights WHERE flight_number = 'SK617'",
                                                "a-3": GOLD_JOIN, "a-4": None}), runtime, TASKS, settings).record
        after = greedy_evaluation(AnswerAgent({"a-1": GOLD_PRICE, "a-2": GOLD_FLIGHT, "a-3": GOLD_JOIN, "a-4": None}),
                                  runtime, TASKS, settings).record
    finally:
        runtime.close()
    assert before["error_categories"] == ["literal_only", "literal_only", None, "tool_misuse"]
    assert after["error_anatomy"]["counts"]["literal_only"] == 0 and after["error_anatomy"]["wrong"] == 1
    deltas = anatomy_deltas(before, after)
    assert deltas["literal_only"]["delta"] == pytest.approx(-0.5) and deltas["tool_misuse"]["delta"] == 0.0
    rows = {label: (b, a) for label, b, a, _ in anatomy_rows(before, after, deltas)}
    assert rows["literal only (wrong constant)"] == ("2", "0") and rows["wrong in all"] == ("3", "1")
    summary = RunSummary(before, after, steps=3, seconds=60.0, output_dir=Path("out"), anatomy_delta=deltas)
    print_before_after(summary)
    assert "Why answers are wrong" in capsys.readouterr().out
    record = {"before": before, "after": after, "steps": 3, "stop_reason": "max_steps", "training_minutes": 1.0,
              "error_anatomy_delta": deltas}
    card = write_model_card(tmp_path, Config(), record).read_text()
    assert "| literal only (wrong constant) | 2 | 0 | -50.0 [" in card  # the model card's table
    assert anatomy_deltas({"solved": [1]}, after) is None  # an evaluation without the anatomy: no deltas
