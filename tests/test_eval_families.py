"""`eval` for every task family, through the real CLI process and the family's real MCP server.

- configs/examples/inventory.yaml (the shipped non-SQL family): its own oracle answers all 12 tasks
  through the inventory server's tools, and every output (printed table, results.json, the
  per-question JSONL, report.html) speaks of accuracy and ground truth, never of SQL;
- the same family named as `module:object` (`env.task_family`), compared with the first run:
  columns named after the runs, and the paired-bootstrap interval of the change.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

from tests.fixtures.cli_in_process import cli_in_process
from tests.fixtures.config_files import CONFIGS, REPO

SQL_WORDS = re.compile(r"execution|exact.match|valid.SQL|gold.SQL|gold_sql|\bEX\b")


def _eval(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(WANDB_MODE="offline", WEAVE_DISABLED="true", TOKENIZERS_PARALLELISM="false", COLUMNS="200")
    return subprocess.run([sys.executable, "-m", "skyrl_tool_agent.commands.main", "eval", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)


def test_eval_runs_a_non_sql_family_in_its_own_words(tmp_path, monkeypatch, capsys):
    first = _eval("--config", str(CONFIGS / "examples" / "inventory.yaml"), "--policy", "oracle",
                  "--output-dir", str(tmp_path / "oracle-a"))
    assert first.returncode == 0, first.stderr[-3000:]
    results = json.loads((tmp_path / "oracle-a" / "results.json").read_text())
    assert (results["family"], results["headline"], results["policy"]) == ("inventory", "accuracy", "oracle")
    assert results["n"] == 12 and results["skipped"] == 0 and results["accuracy"] == 1.0
    assert results["mean_tool_calls"] >= 1.0  # the family's oracle used the server's tools
    assert all(g["accuracy"] == 1.0 for g in results["by_difficulty"].values()) and results["by_db"] == {}
    records = (tmp_path / "oracle-a" / "results_trajectories.jsonl").read_text()
    assert '"ground_truth": "3146.5"' in records
    report = (tmp_path / "oracle-a" / "results_report.html").read_text()
    assert "<th>accuracy</th>" in report and "ground truth" in report
    table = first.stdout[first.stdout.index("inventory-dev"):]
    assert " acc " in table
    for name, text in {"results.json": json.dumps(results), "report.html": report, "printed table": table}.items():
        assert not SQL_WORDS.search(text), (name, SQL_WORDS.search(text))

    # The second through the command's `main` in this process (`cli_in_process`: a launch would
    # only import torch again; the first was the launched one), as wide as the first's terminal.
    monkeypatch.setenv("COLUMNS", "200")
    code, out, stderr = cli_in_process(["eval", "--config", str(CONFIGS / "examples" / "inventory.yaml"), "--policy",
                                        "oracle", "--set", "env.task_family=skyrl_tool_agent.examples.inventory:FAMILY",
                                        "--output-dir", str(tmp_path / "oracle-b"),
                                        "--compare", str(tmp_path / "oracle-a" / "results.json")], capsys)
    assert code == 0, stderr[-3000:]
    assert re.search(r"oracle-a vs oracle-b", out) and re.search(r"metric\s+┃\s+oracle-a\s+┃\s+oracle-b", out), out
    assert "accuracy change (oracle-b - oracle-a): +0.0 points, 95% paired-bootstrap interval [+0.0, +0.0] over 12 " \
           "questions in both" in out, out
    assert not SQL_WORDS.search(out[out.index("inventory-dev"):]), out
