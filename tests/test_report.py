"""report.html from a real evaluation and real training-rollout records (real MCP server, real
SQLite; see tests/fixtures/report_run.py) whose questions, answers, tool arguments and query
results carry HTML: everything is escaped, the page is self-contained, the viewers' markup is what
their script works on, the SQL diff and result rows are right (on the built-in databases too), the
sandbox's limits hold for report-time queries, and the questions newly solved/broken against a
baseline are listed. Then `evaluate.py --rollouts` and a real short training run, whose output
directory gets report.html with its rollouts. (In a real browser: tests/test_report_browser.py.)"""

from __future__ import annotations

import json
import logging
import re
import sqlite3
from pathlib import Path

import pytest

from skyrl_tool_agent.config import UserInputError
from skyrl_tool_agent.data.builtin.location import DB_DIR, builtin_data_dir
from skyrl_tool_agent.data.tasks import db_path_for, load_tasks
from skyrl_tool_agent.eval.compare import load_results, outcome_changes
from skyrl_tool_agent.reports import episodes
from skyrl_tool_agent.reports.episodes import ResultPreviewer, sql_diff, tool_names
from skyrl_tool_agent.reports.html import render_report
from skyrl_tool_agent.reports.rollouts import load_rollouts
from tests.fixtures.report_run import (
    XSS_QUESTION,
    XSS_SQL,
    XSS_TABLE,
    ReportRun,
    items,
    make_report,
    parse,
    viewer,
)


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> ReportRun:
    return make_report(tmp_path_factory.mktemp("report"))


def test_the_run_behind_the_report(report):
    records = report.run.records
    assert [r["solved"] for r in records] == [True, False, True, False]
    hostile = records[3]["samples"][0]
    assert hostile["tool_errors"] == 1 and any(XSS_TABLE in m["content"] for m in hostile["messages"] if m["role"] == "user")
    assert any("<script>alert(1)</script>" in m["content"] for m in hostile["messages"] if m["role"] == "user")
    rollouts = report.rollouts
    assert [r["step"] for r in rollouts] == [1] * 4 + [2] * 4
    assert [r["solved"] for r in rollouts] == [True, False, False, False, True, False, False, False]
    assert rollouts[0]["advantage"] > 0 > rollouts[2]["advantage"]  # shop-1: member 0 solved, member 1 not


def test_all_text_is_escaped(report):
    html = report.paths.report.read_text(encoding="utf-8")
    page = parse(html)
    tags = [tag for tag, _ in page.tags]
    assert tags.count("script") == 1  # ours; none from the data
    assert not [(t, a) for t, a in page.tags for name in a if name.startswith("on")]  # no event handlers at all
    # the difficulty plot and the error anatomy's
    assert [a["src"][:22] for t, a in page.tags if t == "img"] == ["data:image/png;base64,"] * 2
    text = "".join(page.text)
    for hostile in (XSS_QUESTION, XSS_SQL, XSS_TABLE, "xss <check>"):
        assert hostile in text  # shown to the reader as text ...
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html  # ... because it was escaped
    # The hostile SQL's result row (a cell holding a script tag) and the rollouts' copies of it too.
    rollouts = viewer(html, "rollouts")
    assert XSS_QUESTION in "".join(parse(rollouts).text) and "<script" not in rollouts
    rows = re.findall(r'<table class="rows">.*?</table>', viewer(html, "eval"), re.DOTALL)
    assert any("<td>&lt;script&gt;alert(1)&lt;/script&gt;</td>" in r for r in rows)


def test_hostile_reward_terms_and_names_are_escaped(report):
    records = json.loads(json.dumps(report.run.records))
    records[0]["samples"][0]["components"] = {"<b>brevity</b>": 0.5, "execution": 1.0}
    rollouts = [{**report.rollouts[0], "reward_terms": {"x\"><script>alert(3)</script>": 1.0}, "db_id": "<i>db</i>"}]
    html = render_report({**report.run.results, "name": "</title><script>alert(4)</script>"}, records,
                         rollouts=rollouts, db_root=report.db_root)
    assert html.count("<script") == 1 and "<b>brevity" not in html and "<i>db" not in html
    text = "".join(parse(html).text)
    assert "<b>brevity</b>" in text and 'x"><script>alert(3)</script>' in text and "</title><script>alert(4)</script>" in text
    assert "database not available" in text  # a db_id naming no database: said, not run


def test_page_is_self_contained(report):
    html = report.paths.report.read_text(encoding="utf-8")
    assert not re.search(r"""(src|href|action)\s*=\s*["']?\s*(https?:|//|ftp:)""", html, re.IGNORECASE)
    assert "<link" not in html and "@import" not in html and "url(" not in html and "<iframe" not in html
    assert not re.search(r"\bfetch\(|XMLHttpRequest|WebSocket|\.src\s*=", html)  # the script loads nothing
    assert report.run.results["files"]["report"] == str(report.paths.report)


def test_evaluation_viewer_markup(report):
    records = report.run.records
    html = report.paths.report.read_text(encoding="utf-8")
    episodes = items(viewer(html, "eval"))
    assert [(e["data-task"], e["data-failed"], e["id"]) for e in episodes] == [
        (r["task_id"], "0" if r["solved"] else "1", f"e{i}") for i, r in enumerate(records)]
    assert [float(e["data-reward"]) for e in episodes] == [r["samples"][0]["reward"] for r in records]
    assert {e["data-difficulty"] for e in episodes} == {"easy", "medium", "hard"} and {e["data-db"] for e in episodes} == {"shop"}
    body = next(a for t, a in parse(html).tags if t == "body")
    assert (body["data-total"], body["data-failed"]) == ("4", "2")
    controls = {a["name"]: a for t, a in parse(viewer(html, "eval")).tags if "data-ctl" in a}
    assert set(controls) == {"status", "db", "difficulty", "q", "sort"}
    difficulty = re.search(r'name="difficulty">(.*?)</select>', html, re.DOTALL).group(1)
    assert re.findall(r'value="([^"]*)"', difficulty) == ["", "easy", "medium", "hard"]
    text = "".join(parse(html).text)
    terms = report.run.results["reward_terms"]  # each term's mean, whatever terms the reward has
    assert terms and all(f"mean reward term: {name}{value:.3f}" in text for name, value in terms.items())
    assert "assistant → list_tables" in text and "tool results" in text
    assert text.count("System prompt") == 2  # once per viewer, not per episode


def test_rollouts_view(report):
    rollouts = report.rollouts
    section = viewer(report.paths.report.read_text(encoding="utf-8"), "rollouts")
    page = parse(section)
    episodes = items(section)
    assert len(episodes) == len(rollouts) == 8
    assert [(e["data-task"], e["data-step"]) for e in episodes] == [(r["task_id"], str(r["step"])) for r in rollouts]
    assert [float(e["data-advantage"]) for e in episodes] == [r["advantage"] for r in rollouts]
    assert [float(e["data-reward"]) for e in episodes] == [r["reward"] for r in rollouts]
    heads = re.findall(r'<div class="group-head" data-group="(\d+)">(.*?)</div>', section, re.DOTALL)
    assert [h[0] for h in heads] == ["1", "2"]
    assert " ".join(heads[0][1].split()).startswith("step 1 · 4 episodes · 1 solved · mean reward")
    # Each episode: its reward terms (whatever keys the record has), a collapsed conversation, the SQL panel.
    blocks = re.findall(r'<details class="item episode.*?</details>\s*</div></details>', section, re.DOTALL)
    assert len(blocks) == 8
    for block, record in zip(blocks, rollouts):
        terms = re.findall(r"<tr><td>([^<]*)</td><td>[^<]*</td></tr>", re.search(r'<table class="comp">.*?</table>', block, re.DOTALL).group(0))
        assert terms == list(record["reward_terms"]) and len(terms) >= 4
        assert '<details class="conv">' in block and f"{len(record['messages']) - 1} messages" in block
        assert block.count('<table class="rows">') == 2  # the final and the gold query's rows
    text = "".join(page.text)
    assert "advantage" in text and "used in the update" in text and "member 1" in text
    assert {a["name"] for t, a in page.tags if "data-ctl" in a} == {"status", "db", "q", "step-min", "step-max",
                                                                    "reward-min", "reward-max", "sort"}


def test_sql_diff_is_word_level_case_blind_and_escaped():
    def marked(diff, cls):
        return re.findall(rf'<span class="{cls}">(.*?)</span>', str(diff.html))

    diff = sql_diff("select name from customer where city = 'Lyon' ORDER BY name", "SELECT name FROM customer WHERE city = 'Paris'")
    assert marked(diff, "gold-only") == ["&#39;Paris&#39;"] and marked(diff, "final-only") == ["&#39;Lyon&#39;", "ORDER", "BY", "name"]
    assert not diff.same
    same = sql_diff("SELECT  T1.name FROM singer AS T1", "select t1.name from singer as t1")
    assert same.same and str(same.html) == "SELECT T1.name FROM singer AS T1"  # spaced as the final SQL, runs collapsed
    assert str(sql_diff("SELECT COUNT(*), max(a)\nFROM t", "SELECT count(*), MAX(a) FROM t").html) == "SELECT COUNT(*), max(a) FROM t"
    nothing = sql_diff(None, "SELECT a, b FROM t")
    assert marked(nothing, "gold-only") == ["SELECT", "a", ",", "b", "FROM", "t"] and not marked(nothing, "final-only")
    hostile = sql_diff("SELECT '</span><script>x</script>'", "SELECT 1")
    assert "<script>" not in str(hostile.html) and "&lt;/span&gt;&lt;script&gt;" in str(hostile.html)


def _builtin_db_root() -> Path:
    return builtin_data_dir() / DB_DIR


def test_result_rows_on_a_builtin_database(monkeypatch):
    """The first rows (and the row count) of the gold and a wrong query on a built-in database, as
    SQLite itself returns them."""
    task = next(t for t in load_tasks(builtin_data_dir() / "dev.json") if t.gold_sql.startswith("SELECT title FROM books WHERE pages >"))
    wrong = task.gold_sql.rsplit(">", 1)[0] + "> 300"
    monkeypatch.setattr(episodes, "RESULT_ROWS", 3)
    previewer = ResultPreviewer(_builtin_db_root())
    uri = f"file:{db_path_for(_builtin_db_root(), task.db_id)}?mode=ro"
    with sqlite3.connect(uri, uri=True) as conn:
        for sql in (task.gold_sql, wrong):
            expected = [list(r) for r in conn.execute(sql).fetchall()]
            preview = previewer.preview(task.db_id, sql)
            assert preview.columns == ["title"] and preview.rows == expected[:3] and preview.note is None
            assert preview.total == min(len(expected), 100) and preview.total_capped == (len(expected) > 100)
    panel = previewer.sql_panel(task.db_id, wrong, task.gold_sql)
    assert panel["gold_rows"].rows == previewer.preview(task.db_id, task.gold_sql).rows  # memoised, same
    assert re.findall(r'class="gold-only">(.*?)<', str(panel["diff"].html)) == [task.gold_sql.rsplit(" ", 1)[1]]
    assert "first 3 shown" in panel["final_rows"].summary


def test_report_queries_run_inside_the_sandbox_limits(tmp_path, monkeypatch):
    db_root = _builtin_db_root()
    path = db_path_for(db_root, "library")
    before = path.stat().st_mtime_ns, path.read_bytes()
    monkeypatch.setattr(episodes, "QUERY_TIMEOUT_S", 0.3)
    previewer = ResultPreviewer(db_root)
    denied = previewer.preview("library", "DELETE FROM books")
    assert denied.failed and "denied" in denied.summary
    assert "too_large" in previewer.preview("library", "SELECT randomblob(1000000000)").summary
    endless = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c"
    timed_out = previewer.preview("library", endless)
    assert timed_out.failed and "timeout" in timed_out.summary and previewer.spent_s < 3
    assert (path.stat().st_mtime_ns, path.read_bytes()) == before
    # No database: said in the page instead of rows; a spent budget: not run.
    assert "no database directory" in ResultPreviewer(None).preview("library", "SELECT 1").summary
    assert "does not exist" in ResultPreviewer(tmp_path).preview("library", "SELECT 1").summary
    monkeypatch.setattr(episodes, "TIME_BUDGET_S", 0.0)
    spent = ResultPreviewer(db_root)
    assert spent.preview("library", "SELECT 1").summary.startswith("not run") and "1 previews not run" in spent.describe()


def test_newly_solved_and_broken_against_a_baseline(report, tmp_path, monkeypatch):
    run = report.run
    flipped = {"shop-1": False, "shop-2": True, "shop-3": True, "shop-x": False}  # this run: T F T F
    base_dir = tmp_path / "base"
    base_dir.mkdir()
    (base_dir / "base_trajectories.jsonl").write_text(
        "".join(json.dumps({**r, "solved": flipped[r["task_id"]]}) + "\n" for r in run.records))
    results = {**run.results, "execution_accuracy": 0.5, "name": "base <run>",
               "files": {"trajectories": "elsewhere/base_trajectories.jsonl"}}  # relative to where it ran
    (base_dir / "base.json").write_text(json.dumps(results))
    monkeypatch.chdir(tmp_path)
    baseline = load_results(base_dir / "base.json")
    assert baseline["files"]["trajectories"] == str(base_dir / "base_trajectories.jsonl")

    html = render_report(run.results, run.records, baseline=baseline, db_root=report.db_root)
    lists = dict(re.findall(r'<div class="change-list" data-change="(\w+)">(.*?)</ul></div>', html, re.DOTALL))
    assert re.findall(r'<a href="#(e\d)">([^<]*)</a>', lists["pos"]) == [("e0", "shop-1")]
    assert re.findall(r'<a href="#(e\d)">([^<]*)</a>', lists["neg"]) == [("e1", "shop-2")]
    assert "Newly solved (1 of 4 questions)" in lists["pos"] and "Newly broken (1 of 4 questions)" in lists["neg"]
    text = "".join(parse(html).text)
    assert "Compared with the baseline (base <run>)" in text and "+0.000" in text
    # A baseline without per-question outcomes: the metrics, and a note instead of the lists.
    html = render_report(run.results, run.records, baseline={**run.results, "files": {}})
    assert "data-change" not in html and "Per-question outcomes of the baseline not found" in html
    # A training run's baseline: task ids and solved lists.
    changes = outcome_changes({"shop-1": False, "shop-3": False, "other": True}, run.records)
    assert [r["task_id"] for r in changes.newly_solved] == ["shop-1", "shop-3"] and not changes.newly_broken
    assert changes.compared == 2
    assert tool_names('<tool_call>{"name": "a", "arguments": {}}</tool_call> <tool_call>{oops</tool_call>') == ["a", "(malformed)"]


def test_load_rollouts_checks_its_file(report, tmp_path):
    good = [json.dumps(r) for r in report.rollouts[:2]]
    path = tmp_path / "rollouts.jsonl"
    with pytest.raises(UserInputError, match="rollouts file not found"):
        load_rollouts(path)
    path.write_text("\n".join([good[0], "{oops", good[1]]) + "\n")
    with pytest.raises(UserInputError, match="line 2 is not JSON"):
        load_rollouts(path)
    path.write_text("\n".join([good[0], '{"a": 1}']))
    with pytest.raises(UserInputError, match="line 2 is not a rollout record"):
        load_rollouts(path)
    path.write_text("\n".join([*good, good[0][:40]]))  # a run still writing its last line
    assert load_rollouts(path) == report.rollouts[:2]


def test_evaluate_cli_rollouts_flag(report, tmp_path, capsys):
    """`evaluate.py --rollouts`: the training rollouts view in the report; the rollouts' databases
    (the shop test db) are not in this evaluation's database directory, and the page says so."""
    from skyrl_tool_agent.commands.evaluate import main

    path = tmp_path / "rollouts.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in report.rollouts))
    with pytest.raises(SystemExit) as exit_info:
        main(["--policy", "oracle", "--rollouts", str(tmp_path / "missing.jsonl"), "--output-dir", str(tmp_path / "bad")])
    assert exit_info.value.code == 2 and capsys.readouterr().err.strip().splitlines()[-1].startswith("error: rollouts file not found")
    assert not (tmp_path / "bad").exists()
    main(["--policy", "oracle", "--limit", "3", "--rollouts", str(path), "--output-dir", str(tmp_path / "out")])
    html = (tmp_path / "out" / "results_report.html").read_text(encoding="utf-8")
    assert len(items(viewer(html, "eval"))) == 3 and len(items(viewer(html, "rollouts"))) == 8
    assert "shop/shop.sqlite does not exist" in viewer(html, "rollouts")
    assert "does not exist" not in viewer(html, "eval") and html.count('<table class="rows">') >= 6


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    from tests.fixtures.tiny_policy import shop_training_root

    return shop_training_root(tmp_path_factory.mktemp("train"), copies=2, sft_steps=10)


#: What a run writes after its first evaluation, after each evaluation and probe, and at its end.
LIVE_FILES = ("training_curves.png", "metrics_table.md", "report.html")


def test_training_run_writes_report_with_its_rollouts(tiny_model, tmp_path, caplog):
    """A real three-step GRPO run: its output directory gets report.html with the final evaluation's
    episodes, the comparison with the evaluation before training, and the rollouts it logged.

    While it runs (issue 58): the curves, the table and the report are there from the first
    evaluation on, rewritten after each probe (here at step 2), each saying the run's state; every
    rewrite replaces the file (a reader holding the old one reads it whole, never a file being
    written), and no temporary file is left behind."""
    from skyrl_tool_agent.config import load_config
    from skyrl_tool_agent.jobs.train import run_training

    root, model_dir = tiny_model
    out = tmp_path / "run"
    sets = {
        "model.name_or_path": model_dir, "model.device": "cpu", "model.lora.r": 4, "model.lora.alpha": 8,
        "training.data.train_file": root / "train.json", "training.data.dev_file": root / "dev.json",
        "training.data.db_root": root / "dbs", "training.data.train_pool": "file", "training.mode": "lora",
        "training.max_steps": 3, "training.tasks_per_step": 2, "training.checkpoint_every": 0, "training.eval_every": 0,
        "training.eval_num_tasks": 3, "training.eval_samples": 0, "training.probe_tasks": 2, "training.probe_every": 2,
        "training.probe_held_out_tasks": 0, "training.rollouts_every": 1, "training.rollout_groups_per_step": 1,
        "training.wandb.mode": "disabled", "training.output_dir": out, "grpo.group_size": 2, "grpo.max_turns": 3,
        "grpo.max_new_tokens_per_turn": 32, "grpo.max_total_tokens": 1000,
    }
    seen: dict[int, dict[str, bytes]] = {}  # step -> each live file's bytes as that step's end found them
    held = []  # (open file, the bytes it had): what a reader who opened it then still reads

    def progress(kind, value):
        if kind != "step":
            return
        assert not [p.name for p in out.iterdir() if ".tmp" in p.name]
        seen[value["step"]] = {name: (out / name).read_bytes() for name in LIVE_FILES}
        for name in LIVE_FILES:
            held.append((open(out / name, "rb"), seen[value["step"]][name]))

    try:
        with caplog.at_level(logging.INFO, logger="skyrl_tool_agent"):
            summary = run_training(load_config(overrides=[f"{k}={v}" for k, v in sets.items()]), progress=progress)
        for f, then in held:
            assert f.read() == then, f.name  # replaced, not written over: the old file is whole
    finally:
        for f, _ in held:
            f.close()
    final = {name: (out / name).read_bytes() for name in LIVE_FILES}
    for files in (*seen.values(), final):
        png = files["training_curves.png"]
        assert png.startswith(b"\x89PNG") and png.endswith(b"IEND\xaeB`\x82")  # whole pictures
        assert files["report.html"].rstrip().endswith(b"</html>")
    # Step 1 (no probe, no evaluation): the files written after the first evaluation and probe.
    assert b"# GRPO run: step 0 of 3, 0.0 min of GRPO, running" in seen[1]["metrics_table.md"]
    assert b"step 0 of 3, 0.0 min of GRPO, running" in seen[1]["report.html"]
    assert b"evaluation before training" in seen[1]["report.html"] and b'id="run"' in seen[1]["report.html"]
    # Step 2's probe rewrote them; nothing was written at step 1.
    assert seen[2] != seen[1] and re.search(rb"step 2 of 3, [0-9.]+ min of GRPO, running", seen[2]["report.html"])
    assert b"| metric | before GRPO | step 0 |" in seen[2]["metrics_table.md"]
    assert b"stopped: max_steps (3) reached" in final["metrics_table.md"] and b"| after GRPO |" in final["metrics_table.md"]
    assert b"stopped: max_steps (3) reached" in final["report.html"] and b"evaluation after step 3" in final["report.html"]
    assert not [p.name for p in out.iterdir() if ".tmp" in p.name]
    # W&B disabled: no Weave; one line says where the evaluations would have gone and what to run later.
    [weave_line] = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Weave:")]
    assert weave_line.startswith("Weave: W&B is disabled, so this run's evaluations are not traced"), weave_line
    assert "Weave Evaluations run-step-<N> in project skyrl-tool-agent" in weave_line
    assert f"skyrl-tool-agent eval --policy model --model-path {out / 'final'} --split dev --limit 3 --seed 42 " \
           "--name run-final" in weave_line
    html = final["report.html"].decode("utf-8")
    rollouts = load_rollouts(out / "rollouts.jsonl")
    assert [(r["step"], r["group_member"]) for r in rollouts] == [(s, m) for s in (1, 2, 3) for m in (0, 1)]  # one whole group
    assert [e["data-task"] for e in items(viewer(html, "rollouts"))] == [r["task_id"] for r in rollouts]
    evaluated = items(viewer(html, "eval"))
    assert [e["data-failed"] == "0" for e in evaluated] == [bool(s) for s in summary.after["solved"]]
    results = json.loads((out / "eval_final.json").read_text())
    assert results["execution_accuracy"] == pytest.approx(summary.after["execution_accuracy"]) and results["step"] == 3
    text = "".join(parse(html).text)
    assert "Compared with the baseline (before training)" in text and "warning:" not in text
    ex_rows = re.findall(r"<tr><td>EX (\w+)</td><td>([^<]*)</td>", html)
    assert ex_rows and all(base != "-" for _, base in ex_rows)  # per difficulty from the `solved` lists
    lists = dict(re.findall(r'<div class="change-list" data-change="(\w+)">(.*?)</ul></div>', html, re.DOTALL))
    outcomes = list(zip([e["data-task"] for e in evaluated], summary.before["solved"], summary.after["solved"]))
    for cls, changed in (("pos", [t for t, b, a in outcomes if a and not b]), ("neg", [t for t, b, a in outcomes if b and not a])):
        assert re.findall(r'<a href="#e\d+">([^<]*)</a>', lists[cls]) == changed


def test_a_training_evaluation_is_a_weave_evaluation_of_its_episodes(report, monkeypatch, caplog):
    """Issue 58: what a training run with W&B online sends to Weave for each of its evaluations,
    run here with Weave local (no network): the Evaluation of the episodes the trainer already ran,
    scored by `eval`'s scorers, agrees with the evaluation's own record. Then online for real
    without a network: weave.init fails, one warning, no second try, and the run goes on."""
    from skyrl_tool_agent.eval.weave_training import TrainingWeave, evaluation_name, replay_evaluation
    from tests.fixtures.report_run import TASKS

    results, trajectories = report.run.results, report.run.trajectories
    summary = replay_evaluation(TASKS, trajectories, run_name="run-a", step=3, model_path=None, sql=True)
    assert summary["execution_match"]["correct"]["true_fraction"] == pytest.approx(results["execution_accuracy"])
    assert summary["exact_match"]["correct"]["true_fraction"] == pytest.approx(results["exact_match"])
    assert evaluation_name("run-a", 3) == "run-a-step-3"

    monkeypatch.setenv("WANDB_API_KEY", "k" * 40)
    monkeypatch.delenv("WEAVE_DISABLED", raising=False)
    monkeypatch.setenv("WANDB_BASE_URL", "http://127.0.0.1:9")  # nothing listens: no network, wherever this runs
    weave = TrainingWeave(mode="online", wandb_mode="online", project="someone/proj", run_name="run-a", sql=True,
                          later="")
    with caplog.at_level(logging.WARNING):
        assert weave.log(TASKS, trajectories, 0) is None and weave.mode == "disabled"
        assert weave.log(TASKS, trajectories, 3) is None
    assert [r.getMessage().split(" (")[0] for r in caplog.records if "Weave" in r.getMessage()] == [
        "Weave disabled for this evaluation"]
