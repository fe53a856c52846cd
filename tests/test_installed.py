"""The package as `pip install .` makes it, used from an empty directory: no checkout on the path.

`pip install --no-deps --target DIR .` builds and installs this project's wheel into DIR (the
dependencies come from the test's own environment: installing them again from an index is what
scripts/setup.sh does, minutes of downloads, and CI runs that). The console script is then run
from an empty working directory with DIR first on the path, so every file it needs (packaged
configs, the shipped model, the built-in data built into a fresh cache) must come from the
installed package. Its `train` is the quick start's main job (the shipped model, cut to two small
steps), so one launch checks both the installed package and the main job.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    target = tmp_path_factory.mktemp("site")
    done = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                           "--target", str(target), str(REPO)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return target


def _run(target: Path, cwd: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(PYTHONPATH=str(target), SKYRL_TOOL_AGENT_CACHE=str(cwd / "cache"), WANDB_MODE="offline",
               WEAVE_DISABLED="true", TOKENIZERS_PARALLELISM="false")
    return subprocess.run([str(target / "bin" / "skyrl-tool-agent"), *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow
def test_installed_main_job_trains_two_steps_and_evaluates_from_an_empty_directory(installed, tmp_path):
    """The quick start's main job (`train` with its defaults: the shipped model, its frontier, LoRA
    on CPU) from the installed package, cut to two small steps, a small evaluation (greedy and
    sampled, and the probe: 2 tasks each) and 64 tokens a turn: end to end, no timing asserted;
    then `eval` of what it trained. One run for both (they were two launches of the same main job)."""
    work = tmp_path / "empty"
    work.mkdir()
    version = _run(installed, work, "--version")
    assert version.returncode == 0 and version.stdout.startswith("skyrl-tool-agent "), version.stderr
    where = subprocess.run([sys.executable, "-c", "import skyrl_tool_agent, mcp_tools; print(skyrl_tool_agent.__file__);"
                            "print(mcp_tools.__file__)"], cwd=work, capture_output=True, text=True,
                           env={**os.environ, "PYTHONPATH": str(installed)})
    assert all(line.startswith(str(installed)) for line in where.stdout.split()), where.stdout  # not the checkout

    train = _run(installed, work, "train", "--mode", "lora", "--max-steps", "2", "--output-dir", "run",
                 "--set", "training.tasks_per_step=2", "--set", "grpo.group_size=2",
                 "--set", "training.eval_num_tasks=2", "--set", "training.wandb.mode=disabled",
                 "--set", "training.eval_samples=2", "--set", "training.probe_tasks=2",
                 "--set", "training.probe_held_out_tasks=2", "--set", "training.probe_every=2",
                 "--set", "training.data.test_tasks=2",  # the test split beside dev, on its own databases
                 "--set", "grpo.max_new_tokens_per_turn=64")  # half the CPU default: decoding is most of the run's time
    assert train.returncode == 0, train.stderr[-3000:] + train.stdout[-2000:]
    out = work / "run"
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2]
    assert all(r["episode/tasks"] == 2 for r in rows[1:])
    assert (out / "final" / "adapter_config.json").is_file()
    assert (work / "cache" / "builtin").is_dir()  # the built-in data came from the package, built into the cache
    record = json.loads((out / "before_after.json").read_text())
    assert record["stop_reason"] == "max_steps (2) reached"
    assert len(record["before"]["solved"]) == 2 and record["execution_accuracy_delta"]["n"] == 2
    # avg@2 beside greedy (two samples per task at the training temperature), with its paired interval
    assert record["before"]["sampled"]["k"] == 2 and len(record["after"]["sampled"]["per_task"]) == 2
    assert record["avg_at_k_delta"]["n"] == 2 and "avg@2 (T=1)" in train.stdout
    # the probe: the same 2 training tasks before training and at step 2 (the last), 2 held-out ones beside them
    assert [r["step"] for r in rows if "probe/execution_accuracy" in r] == [0, 2]
    assert [r["probe/held_out_tasks"] for r in rows if "probe/held_out_execution_accuracy" in r] == [2, 2]
    assert "training stopped: max_steps (2) reached" in train.stdout
    # the test split (training.test_eval): greedy and avg@2 before and after, paired, in the table and the record
    test = record["test"]
    assert json.loads((out / "before_test.json").read_text()) == test["before"] and len(test["after"]["solved"]) == 2
    assert test["execution_accuracy_delta"]["n"] == 2 and test["avg_at_k_delta"]["n"] == 2
    assert "Test split (in-family, never trained or tuned on), greedy (n=2)" in train.stdout
    assert "## The test split (2 tasks" in (out / "metrics_table.md").read_text()

    evaluate = _run(installed, work, "eval", "--policy", "model", "--model-path", "run/final", "--limit", "2",
                    "--output-dir", "ev")
    assert evaluate.returncode == 0, evaluate.stderr[-3000:]
    result = json.loads((work / "ev" / "results.json").read_text())
    assert result["n"] == 2 and 0.0 <= result["execution_accuracy"] <= 1.0
    assert {p.name for p in (work / "ev").iterdir()} >= {"results.json", "results_report.html"}
    assert sorted(p.name for p in work.iterdir()) == ["cache", "ev", "run"]  # nothing written elsewhere in cwd
