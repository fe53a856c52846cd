"""A run followed from a log file: a real 2-step GRPO run of a tiny model through the real CLI,
stdout and stderr into a file (not a terminal), W&B offline.

- evaluations log done/total and an ETA (no silence while they run);
- log lines are never wrapped (a long path stays on its line);
- no bitsandbytes `kernels` notice; one line says where W&B writes offline and how to sync it;
- the checkpoint stores the minutes of the time budget spent (that the clock goes on from them
  across `--resume PATH` is checked by tests/test_trainer.py's interrupted runs, resumed);
- the resume hint names the interpreter that ran the command.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from skyrl_tool_agent.config import EnvConfig
from skyrl_tool_agent.data.tasks import save_tasks
from skyrl_tool_agent.env.pools import EnvRuntime
from tests.fixtures.config_files import REPO
from tests.fixtures.tiny_db import SHOP_TASKS, make_shop_db
from tests.fixtures.tiny_policy import build_tiny_model_dir


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("a_directory_with_a_long_name_so_that_paths_pass_eighty_columns")
    make_shop_db(root / "dbs")
    save_tasks(SHOP_TASKS, root / "tasks.json")
    rt = EnvRuntime(EnvConfig(), root / "dbs")
    try:
        model_dir = build_tiny_model_dir(rt, SHOP_TASKS, root / "model", sft_steps=0)
    finally:
        rt.close()
    return root, model_dir


def _train(root: Path, model_dir: Path, out: Path, log: Path, *extra: str) -> int:
    sets = {"model.name_or_path": model_dir, "model.device": "cpu", "model.lora.r": 4, "model.lora.alpha": 8,
            "training.data.train_file": root / "tasks.json", "training.data.dev_file": root / "tasks.json",
            "training.data.db_root": root / "dbs", "training.data.train_pool": "file", "training.max_steps": 2,
            "training.tasks_per_step": 2, "training.checkpoint_every": 1, "training.keep_checkpoints": 2,
            "training.eval_every": 0, "training.eval_num_tasks": 3, "training.probe_tasks": 0, "training.probe_held_out_tasks": 0, "training.time_budget_minutes": 30,
            "training.wandb.mode": "offline", "training.rollout_groups_per_step": 1, "grpo.group_size": 2, "grpo.max_turns": 2,
            "grpo.max_new_tokens_per_turn": 16}
    args = [a for k, v in sets.items() for a in ("--set", f"{k}={v}")]
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "COLUMNS", "WANDB_MODE")}
    env.update(TOKENIZERS_PARALLELISM="false", WEAVE_DISABLED="true", WANDB_SILENT="true")
    with log.open("w") as f:
        return subprocess.run([sys.executable, "-m", "skyrl_tool_agent.commands.main", "train", "--mode", "lora",
                               "--output-dir", str(out), *args, *extra], cwd=REPO, env=env, stdout=f,
                              stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, timeout=300).returncode


def test_a_run_can_be_followed_from_its_log(data, tmp_path):
    root, model_dir = data
    out = tmp_path / "run"
    first_log = tmp_path / "first.log"
    assert _train(root, model_dir, out, first_log) == 0, first_log.read_text()[-3000:]
    log = first_log.read_text()
    # Both evaluations (before and after) report their progress, with an ETA.
    # 3 tasks, greedy and training.eval_samples (2) each: 9 episodes per evaluation, before and after
    assert log.count("INFO evaluation 9/9 (100%), ") == 2 and "ETA 0 s" in log, log
    # Not wrapped: each long line is whole.
    assert f"INFO checkpoint saved: {out}/checkpoints/step-000001\n" in log, log
    assert "kernels" not in log and "gemm_4bit" not in log
    [wandb_line] = [line for line in log.splitlines() if "W&B offline" in line]
    # Weave: one line, where the evaluations would have gone and how to put the model there later
    [weave_line] = [line for line in log.splitlines() if "Weave:" in line]
    assert "Weave: W&B is offline, so this run's evaluations are not traced; online they would be Weave " \
           "Evaluations run-step-<N> in project skyrl-tool-agent; to put the trained model there later: " \
           f"WANDB_API_KEY=<key> skyrl-tool-agent eval --policy model --model-path {out / 'final'} --split dev " \
           "--limit 3 --seed 42 --name run-final" in weave_line, weave_line
    run_dir = next((out / "wandb").glob("offline-run-*"))
    assert f"upload with `wandb sync {run_dir}`" in wandb_line, wandb_line
    spent = json.loads((out / "checkpoints" / "step-000001" / "trainer_state.json").read_text())["elapsed_s"]
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert spent == pytest.approx(rows[1]["time/elapsed_s"], abs=5.0) and spent > 0
    assert [r["step"] for r in rows] == [0, 1, 2]

    # rollouts.jsonl keeps whole GRPO groups (here 1 of the 2 per step), and report.html shows each side by side.
    rollouts = [json.loads(line) for line in (out / "rollouts.jsonl").read_text().splitlines()]
    assert [(r["step"], r["group"], r["group_member"]) for r in rollouts] == [(1, 0, 0), (1, 0, 1), (2, 0, 0), (2, 0, 1)]
    for step in (1, 2):
        group = [r for r in rollouts if r["step"] == step]
        assert len({r["task_id"] for r in group}) == 1 and all("execution" in r["reward_terms"] for r in group)
        assert sum(r["advantage"] for r in group) == pytest.approx(0.0, abs=1e-5)  # centred within the group
    html = (out / "report.html").read_text()
    assert 'GRPO groups side by side (2)' in html and "<th>member 0</th><th>member 1</th>" in html


def test_the_resume_hint_names_this_interpreter():
    from skyrl_tool_agent.commands.train import resume_command

    assert resume_command(["--max-steps", "2", "--resume", "x"], "skyrl-tool-agent train") == shlex.join(
        [sys.executable, "-m", "skyrl_tool_agent.commands.main", "train", "--max-steps", "2", "--resume", "auto"])
    assert resume_command(["--max-steps", "2"], None).startswith(shlex.quote(sys.executable) + " ")
