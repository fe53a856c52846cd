"""report.html from a real evaluation (real MCP server, real SQLite) whose questions, answers,
tool arguments and query results carry HTML: everything is escaped, the page is self-contained,
and the markup the failed-only filter works on is right. Then the page in a real headless browser
(Debian chromium; those tests skip where it is not installed): it renders (not blank, styled), its
script runs, and the failed-only filter hides exactly the solved episodes (report.html#failed
opens with the filter on)."""

from __future__ import annotations

import base64
import re
import shutil
import subprocess
import tempfile
from html.parser import HTMLParser
from pathlib import Path

import pytest

from skyrl_tool_agent.config import EnvConfig
from skyrl_tool_agent.data.tasks import Task
from skyrl_tool_agent.env.chat_format import format_answer, format_tool_call
from skyrl_tool_agent.env.pools import EnvRuntime
from skyrl_tool_agent.eval.evaluate import EvalOptions, EvaluationRun, OutputPaths, run_evaluation, write_outputs
from skyrl_tool_agent.eval.report import render_report, tool_names
from skyrl_tool_agent.rollout.agents import AgentTurn
from skyrl_tool_agent.rollout.collector import CollectorSettings
from tests.fixtures.tiny_db import SHOP_TASKS, make_shop_db

XSS_QUESTION = 'Which <b>customers</b> & "friends" live in </pre><script>alert("q")</script>?'
XSS_SQL = "SELECT '<script>alert(1)</script>' AS x"
XSS_TABLE = "</pre><img src=x onerror=alert(2)>"
TASKS = [
    *SHOP_TASKS,
    Task(task_id="shop-x", db_id="shop", question=XSS_QUESTION, gold_sql="SELECT name FROM customer WHERE city = 'Paris'",
         difficulty="hard"),
]
SCRIPTS = {
    "shop-1": [format_tool_call("list_tables", {"db_id": "shop"}), format_answer(SHOP_TASKS[0].gold_sql)],
    "shop-2": [format_answer(XSS_SQL)],  # wrong, and its result is HTML
    "shop-3": [format_answer(SHOP_TASKS[2].gold_sql)],
    # a tool call whose argument (and so the error message) is HTML, then a wrong answer
    "shop-x": [format_tool_call("describe_table", {"db_id": "shop", "table": XSS_TABLE}),
               format_tool_call("execute_sql", {"db_id": "shop", "sql": XSS_SQL}), format_answer("SELECT 1")],
}


class ScriptAgent:
    async def act(self, requests):
        return [AgentTurn(text=SCRIPTS[r.task.task_id][min(r.turn, len(SCRIPTS[r.task.task_id]) - 1)]) for r in requests]


def make_report(root: Path) -> tuple[EvaluationRun, OutputPaths]:
    """A real evaluation with two solved and two failed episodes, written under `root`."""
    make_shop_db(root / "dbs")
    runtime = EnvRuntime(EnvConfig.exploring(), root / "dbs")  # scripts explore
    try:
        run = run_evaluation(TASKS, runtime, ScriptAgent(), CollectorSettings(max_turns=4), EvalOptions(name="xss <check>"),
                             metadata={"dataset": "shop", "split": "dev"})
    finally:
        runtime.close()
    return run, write_outputs(run, OutputPaths.beside(root / "out" / "results.json"))


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> tuple[EvaluationRun, OutputPaths]:
    return make_report(tmp_path_factory.mktemp("report"))


class _Page(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.text: list[str] = []
        self.script = False

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))
        self.script = tag == "script"

    def handle_endtag(self, tag):
        self.script = False

    def handle_data(self, data):
        if not self.script:
            self.text.append(data)


def parse(html: str) -> _Page:
    page = _Page()
    page.feed(html)
    return page


def test_the_run_behind_the_report(report):
    run, _ = report
    assert [r["solved"] for r in run.records] == [True, False, True, False]
    hostile = run.records[3]["samples"][0]
    assert hostile["tool_errors"] == 1 and any(XSS_TABLE in m["content"] for m in hostile["messages"] if m["role"] == "user")
    assert any("<script>alert(1)</script>" in m["content"] for m in hostile["messages"] if m["role"] == "user")


def test_all_text_is_escaped(report):
    _, paths = report
    html = paths.report.read_text(encoding="utf-8")
    page = parse(html)
    tags = [tag for tag, _ in page.tags]
    assert tags.count("script") == 1  # ours; none from the data
    assert not any(tag in ("b", "img") and "src" in attrs and attrs["src"] == "x" for tag, attrs in page.tags)
    assert not [(t, a) for t, a in page.tags for name in a if name.startswith("on")]  # no event handlers at all
    assert [a["src"][:22] for t, a in page.tags if t == "img"] == ["data:image/png;base64,"]
    text = "".join(page.text)
    for hostile in (XSS_QUESTION, XSS_SQL, XSS_TABLE, "xss <check>"):
        assert hostile in text  # shown to the reader as text ...
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html  # ... because it was escaped


def test_page_is_self_contained(report):
    run, paths = report
    html = paths.report.read_text(encoding="utf-8")
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", html)
    assert "<link" not in html and "@import" not in html
    img = next(a["src"] for t, a in parse(html).tags if t == "img")
    assert base64.b64decode(img.split(",", 1)[1]) == paths.difficulty_png.read_bytes()
    assert run.results["files"]["report"] == str(paths.report)


def test_episode_markup_for_the_filter(report):
    run, paths = report
    page = parse(paths.report.read_text(encoding="utf-8"))
    episodes = [a for t, a in page.tags if t == "details" and "episode" in (a.get("class") or "")]
    assert [(e["data-task"], e["data-failed"]) for e in episodes] == [
        (r["task_id"], "0" if r["solved"] else "1") for r in run.records]
    body = next(a for t, a in page.tags if t == "body")
    assert (body["data-total"], body["data-failed"]) == ("4", "2")
    assert {e["data-difficulty"] for e in episodes} == {"easy", "medium", "hard"}
    options = [a.get("value") for t, a in page.tags if t == "option"]
    assert options == ["", "easy", "medium", "hard"]


def test_report_details(report):
    run, _ = report
    html = render_report(run.results, run.records, baseline={**run.results, "execution_accuracy": 0.25})
    text = "".join(parse(html).text)
    assert "Compared with the baseline" in text and "+0.250" in text
    assert "assistant → list_tables" in text and "tool results" in text and "(no answer)" not in text
    assert text.count("System prompt") == 1  # shown once, not per episode
    assert "<img" not in html  # no PNG given: no broken image
    assert tool_names('<tool_call>{"name": "a", "arguments": {}}</tool_call> <tool_call>{oops</tool_call>') == ["a", "(malformed)"]


# ------------------------------------------------------------------ in a real browser
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="chromium not installed (apt-get install chromium)")

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def chromium(*args: str) -> subprocess.CompletedProcess:
    with tempfile.TemporaryDirectory() as profile:
        return subprocess.run([CHROMIUM, *FLAGS, f"--user-data-dir={profile}", *args],
                              capture_output=True, text=True, timeout=90, stdin=subprocess.DEVNULL)


@needs_chromium
def test_browser_screenshot_shows_the_rendered_page(report):
    from PIL import Image

    _, paths = report
    shot = paths.report.parent / "report.png"
    proc = chromium(f"--screenshot={shot}", "--window-size=1280,1600", paths.report.as_uri())
    assert shot.is_file(), proc.stderr[-2000:]
    image = Image.open(shot).convert("RGB")
    assert image.size == (1280, 1600)
    pixels = list(image.getdata())
    assert image.getpixel((640, 20)) == (0x24, 0x32, 0x4A)  # the header's CSS background: styles applied
    non_white = sum(1 for p in pixels if p != (255, 255, 255)) / len(pixels)
    assert non_white > 0.05, f"page looks blank ({non_white:.1%} non-white)"
    assert len(set(pixels)) > 200  # text, tables, the embedded plot


def _body_and_episodes(dom: str) -> tuple[dict, list[dict]]:
    page = parse(dom)
    body = next(a for t, a in page.tags if t == "body")
    episodes = [a for t, a in page.tags if t == "details" and "episode" in (a.get("class") or "")]
    return body, episodes


@needs_chromium
def test_browser_failed_filter(report):
    run, paths = report
    failed_ids = {r["task_id"] for r in run.records if not r["solved"]}
    assert 0 < len(failed_ids) < len(run.records)

    dom = chromium("--dump-dom", paths.report.as_uri()).stdout
    body, episodes = _body_and_episodes(dom)
    assert body.get("data-ready") == "1"  # the script ran to the end
    assert body["data-shown"] == str(len(run.records)) and not any("hidden" in e for e in episodes)

    dom = chromium("--dump-dom", paths.report.as_uri() + "#failed").stdout
    body, episodes = _body_and_episodes(dom)
    assert body["data-shown"] == str(len(failed_ids))
    assert {e["data-task"] for e in episodes if "hidden" not in e} == failed_ids
    assert re.search(r'id="only-failed"[^>]*>', dom)
    assert re.search(rf'<b id="shown-count">{len(failed_ids)}</b>', dom)

