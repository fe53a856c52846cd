"""Issue 28: faults of a real training run never become scores, and every fault of its output
directory, checkpoint state or resume ends in one `error:` line with exit 2.

Real 2-step LoRA trainings of a tiny Qwen2 over real MCP servers and real SQLite files.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fixtures.tiny_policy import shop_training_root



@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    return shop_training_root(tmp_path_factory.mktemp("run"))


def _sets(root: Path, model_dir: Path, db_root: Path | None = None, **extra) -> dict:
    return {
        "model.name_or_path": model_dir, "model.device": "cpu", "model.lora.r": 4, "model.lora.alpha": 8,
        "training.data.train_file": root / "train.json", "training.data.dev_file": root / "dev.json",
        "training.data.db_root": db_root or root / "dbs", "training.data.train_pool": "file",
        "training.max_steps": 2, "training.tasks_per_step": 2, "training.checkpoint_every": 1,
        "training.eval_every": 0, "training.eval_num_tasks": 3, "training.eval_samples": 0, "training.probe_tasks": 0, "training.probe_held_out_tasks": 0, "training.learning_rate": 0.01,
        "training.wandb.mode": "disabled", "training.seed": 7, "training.mode": "lora",
        "grpo.group_size": 2, "grpo.max_turns": 4, "grpo.max_new_tokens_per_turn": 40,
        "grpo.max_total_tokens": 1200, "grpo.filter_uniform_groups": False, "env.collector.max_episode_retries": 0,
        **extra,
    }


class OracleBackend:
    """The local backend with the SQL oracle as the sampler (it answers, so its episodes are scored
    against the databases; the tiny policy rarely answers). Updates, logging, evaluation, the
    before/after files and the model card are the real pipeline's."""

    def __init__(self) -> None:
        from skyrl_tool_agent.distributed.local import LocalBackend

        self._local = LocalBackend()
        self.ctx = self._local.ctx

    def build_trainer(self, config, runtime, loader, eval_tasks, out):
        import asyncio

        from skyrl_tool_agent.grpo.trainer import GRPOTrainer
        from skyrl_tool_agent.policy.qwen import QwenPolicy
        from skyrl_tool_agent.rollout.agents import OracleAgent
        from skyrl_tool_agent.rollout.collector import TrajectoryCollector

        class OracleTrainer(GRPOTrainer):
            def collect(self, tasks, group_size, params, settings=None, on_episode_done=None):  # type: ignore[override]
                collector = TrajectoryCollector(self.runtime, OracleAgent(), tokenizer=self.policy.tokenizer,
                                                settings=settings or self.collector_settings)
                return asyncio.run(collector.collect(tasks, group_size, on_episode_done=on_episode_done))

        policy = QwenPolicy.from_config(config.model, mode=config.training.mode)
        return OracleTrainer(config, policy, runtime, loader, eval_tasks, output_dir=out)


def _overrides(sets: dict) -> list[str]:
    return [f"{k}={v}" for k, v in sets.items()]


@pytest.fixture(scope="module")
def broken_run(setup, tmp_path_factory):
    """A real 2-step training (oracle sampler) whose databases become unreadable after step 1, in an
    output directory holding a stale run lock (a pid that is gone). Returns (out, db_root, summary)."""
    import shutil

    from skyrl_tool_agent.config import load_config
    from skyrl_tool_agent.grpo.run_lock import LOCK_FILE
    from skyrl_tool_agent.jobs.train import run_training

    root, model_dir = setup
    base = tmp_path_factory.mktemp("broken")
    db_root = base / "dbs"
    shutil.copytree(root / "dbs", db_root)
    out = base / "out"
    out.mkdir()
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    import socket

    (out / LOCK_FILE).write_text(json.dumps({"pid": int(gone.stdout), "host": socket.gethostname()}) + "\n")

    def break_databases(kind: str, metrics: dict) -> None:
        if kind == "step" and metrics["step"] == 1:
            for db in db_root.rglob("*.sqlite"):
                db.write_bytes(b"not a database at all " * 500)

    summary = run_training(load_config(overrides=_overrides(_sets(root, model_dir, db_root,
                                                                  **{"training.output_dir": out}))),
                           progress=break_databases, backend=OracleBackend())
    return out, db_root, summary


def test_databases_broken_after_step_1_are_never_scored_as_wrong(broken_run, capsys):
    """Finding 1: the databases become unreadable after step 1. Step 2 and the final evaluation are
    infrastructure errors: no reward/mean of 0, no EX 0.000 after, no "-25 points" interval, and
    the before/after table, before_after.json and the model card say how many episodes were scored."""
    from skyrl_tool_agent.reports.tables import print_before_after

    out, _, summary = broken_run
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    step2 = next(r for r in rows if r["step"] == 2)
    assert step2["train/scored"] == 0 and step2["train/infra_errors"] == 4
    assert step2["reward/mean"] is None and step2["train/execution_accuracy"] is None
    record = json.loads((out / "before_after.json").read_text())
    assert record["before"]["scored"] == 3 and record["before"]["execution_accuracy"] == 1.0
    assert record["after"]["scored"] == 0
    assert record["after"]["infra_errors"] == 3 and record["after"]["execution_accuracy"] is None
    assert record["after"]["solved"] == [None, None, None]
    assert record["execution_accuracy_delta"] is None  # nothing scored both times: no interval
    card = (out / "final" / "README.md").read_text()
    assert "| execution_accuracy |" in card and "| unscored |" in card and "| infra_errors | 0 | 3 |" in card
    assert "not measured" in card
    capsys.readouterr()
    print_before_after(summary)
    shown = capsys.readouterr().out
    assert "unscored" in shown and "not measured" in shown and "-0." not in shown


def test_paired_interval_leaves_unscored_tasks_out():
    from skyrl_tool_agent.eval.stats import NothingScored, paired_bootstrap

    d = paired_bootstrap([1, 0, 1, 1], [1, None, None, 1])
    assert (d.n, d.unscored, d.before, d.after, d.delta) == (2, 2, 1.0, 1.0, 0.0)
    assert (d.low, d.high) == (0.0, 0.0)
    with pytest.raises(NothingScored):
        paired_bootstrap([1, 1], [None, None])


def test_a_stale_run_lock_is_taken_over_and_released(broken_run):
    """Finding 6: the run above found a lock of a dead pid, took it over, and removed it at the end."""
    from skyrl_tool_agent.grpo.run_lock import LOCK_FILE

    out, _, _ = broken_run
    assert (out / "before_after.json").is_file() and not (out / LOCK_FILE).exists()


def _train_main(argv: list[str], capsys) -> tuple[int, str]:
    from skyrl_tool_agent.commands.train import main

    capsys.readouterr()
    with pytest.raises(SystemExit) as exited:
        main(argv)
    return exited.value.code, capsys.readouterr().err


def _argv(sets: dict, out: Path, *extra: str) -> list[str]:
    return ["--output-dir", str(out), *[a for k, v in sets.items() for a in ("--set", f"{k}={v}")], *extra]


def _expect_one_error_line(code: int, err: str) -> str:
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err[-3000:]
    return lines[0]


def test_a_second_run_on_a_live_runs_directory_is_refused(setup, tmp_path, capsys):
    """Finding 6: a lock held by a live process (this one): one `error:` line, exit 2, nothing written."""
    import socket

    from skyrl_tool_agent.grpo.run_lock import LOCK_FILE

    root, model_dir = setup
    out = tmp_path / "busy"
    out.mkdir()
    lock = json.dumps({"pid": os.getpid(), "host": socket.gethostname()}) + "\n"
    (out / LOCK_FILE).write_text(lock)
    code, err = _train_main(_argv(_sets(root, model_dir), out), capsys)
    line = _expect_one_error_line(code, err)
    assert "in use by another run" in line and f"pid {os.getpid()}" in line
    assert sorted(p.name for p in out.iterdir()) == [LOCK_FILE] and (out / LOCK_FILE).read_text() == lock


def _craft(out: Path, edit) -> None:
    from skyrl_tool_agent.grpo.checkpoint import STATE_FILE, latest_checkpoint, write_manifest

    ckpt = latest_checkpoint(out / "checkpoints")
    state = json.loads((ckpt / STATE_FILE).read_text())
    (ckpt / STATE_FILE).write_text(json.dumps(edit(state)) + "\n")
    write_manifest(ckpt)  # crafted, not damaged: the manifest agrees


CRAFTED = {
    "missing loader": (lambda s: {"step": s["step"]}, "no data-loader state", {}),
    "step as text": (lambda s: {**s, "step": "three"}, "has step 'three'", {}),
    "garbage loader": (lambda s: {**s, "loader": {"version": s["loader"]["version"], "junk": 1}}, "data-loader state", {}),
    "step 10**12": (lambda s: {**s, "step": 10**12}, "has step 1000000000000", {}),
    # refused before anything is loaded, by the checkpoint's recorded config (naming the knob)
    "max_steps changed": (lambda s: s, "training.max_steps is 3 in this launch but 2 in the checkpoint's run",
                          {"training.max_steps": 3}),
    "seed changed": (lambda s: s, "training.seed is 8 in this launch but 7 in the checkpoint's run",
                     {"training.seed": 8}),
}


@pytest.mark.parametrize("case", list(CRAFTED))
def test_checkpoint_state_faults_are_one_line(case, setup, broken_run, tmp_path, capsys):
    """Finding 8: a crafted trainer_state.json or a resume with another max_steps or seed: one
    `error:` line, exit 2; the run directory stays as it was."""
    import shutil

    root, model_dir = setup
    edit, expected, changes = CRAFTED[case]
    out = tmp_path / "run"
    shutil.copytree(broken_run[0], out)
    _craft(out, edit)
    before = sorted(str(p.relative_to(out)) for p in out.rglob("*"))
    code, err = _train_main(_argv(_sets(root, model_dir, **changes), out, "--resume", "auto"), capsys)
    line = _expect_one_error_line(code, err)
    assert expected in line, line
    assert sorted(str(p.relative_to(out)) for p in out.rglob("*")) == before


def test_disk_full_during_training_is_one_line_and_keeps_the_finished_checkpoint(setup, tmp_path, capsys,
                                                                                 monkeypatch):
    """Finding 8: the output disk fills up during step 2 (ENOSPC on every write there): one `error:`
    line, exit 2, and step 1's checkpoint is intact for the resume."""
    import errno

    from skyrl_tool_agent.grpo import checkpoint as ckpt_module
    from skyrl_tool_agent.grpo.run_logging import RunLogger

    root, model_dir = setup
    out = tmp_path / "full"
    real_log = RunLogger.log

    def log(self, metrics):
        if metrics.get("step") == 2:
            raise OSError(errno.ENOSPC, "No space left on device", str(out / "metrics.jsonl"))
        return real_log(self, metrics)

    monkeypatch.setattr(RunLogger, "log", log)
    code, err = _train_main(_argv(_sets(root, model_dir), out), capsys)
    line = _expect_one_error_line(code, err)
    assert "No space left on device" in line and "--resume auto" in line
    latest = ckpt_module.latest_checkpoint(out / "checkpoints")
    assert latest is not None and latest.name == "step-000001"
    ckpt_module.verify_checkpoint(latest)


def test_an_empty_dev_file_is_one_line(setup, tmp_path, capsys):
    """Finding 8: an empty dev file was a KeyError traceback after the first evaluation."""
    root, model_dir = setup
    (tmp_path / "dev.json").write_text("[]\n")
    sets = _sets(root, model_dir, **{"training.data.dev_file": tmp_path / "dev.json"})
    code, err = _train_main(_argv(sets, tmp_path / "out"), capsys)
    assert "no tasks to evaluate" in _expect_one_error_line(code, err)
