"""GRPOTrainer end to end on a tiny model: real rollouts through real MCP servers, real updates,
checkpoints, and a `kill -9` + `--resume auto` that reaches the same metrics as an uninterrupted run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from skyrl_tool_agent.config import EnvConfig
from skyrl_tool_agent.data.tasks import save_tasks
from skyrl_tool_agent.env.pools import EnvRuntime
from tests.fixtures.tiny_db import SHOP_TASKS, make_shop_db
from tests.fixtures.tiny_policy import build_tiny_model_dir

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "training" / "scripts" / "train_grpo.py"
STEPS = 4  # enough for two interruptions that each leave a step to resume


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("run")
    db_root = root / "dbs"
    make_shop_db(db_root)
    save_tasks(SHOP_TASKS, root / "train.json")
    save_tasks(SHOP_TASKS, root / "dev.json")
    rt = EnvRuntime(EnvConfig(), db_root)
    try:
        model_dir = build_tiny_model_dir(rt, SHOP_TASKS * 4, root / "model")
    finally:
        rt.close()
    return root, model_dir


def _config_args(root: Path, model_dir: Path) -> list[str]:
    sets = {
        "model.name_or_path": model_dir, "model.device": "cpu", "model.lora.r": 4, "model.lora.alpha": 8,
        "training.data.train_file": root / "train.json", "training.data.dev_file": root / "dev.json",
        "training.data.db_root": root / "dbs", "training.data.train_pool": "file", "training.max_steps": STEPS, "training.tasks_per_step": 2,
        "training.checkpoint_every": 1, "training.eval_every": 0, "training.eval_num_tasks": 3,
        "training.eval_samples": 0, "training.probe_tasks": 0, "training.probe_held_out_tasks": 0,  # greedy evaluations only: what resume compares
        "training.learning_rate": 0.01, "training.wandb.mode": "disabled", "training.seed": 7,
        "grpo.group_size": 2, "grpo.max_turns": 4, "grpo.max_new_tokens_per_turn": 40, "grpo.max_total_tokens": 1200,
        "grpo.filter_uniform_groups": False, "grpo.kl_coef": 0.05,
        # the tiny model's groups mostly tie at reward 0: the entropy bonus gives every step a gradient,
        # so a resume that lost the adapters or the optimizer's moments ends elsewhere
        "grpo.entropy_coef": 0.01,
    }
    return [arg for key, value in sets.items() for arg in ("--set", f"{key}={value}")]


def _cmd(root: Path, model_dir: Path, out: Path, *extra: str) -> list[str]:
    return [sys.executable, str(SCRIPT), "--mode", "lora", "--output-dir", str(out),
            *_config_args(root, model_dir), *extra]


def _env() -> dict[str, str]:
    return {**os.environ, "WANDB_MODE": "disabled", "TOKENIZERS_PARALLELISM": "false", "PYTHONPATH": str(REPO)}


def _metrics(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def _main_here(cmd: list[str]) -> str:
    """`cmd` (a launch of the train script, `_cmd`) run by the script's `main` in this process (the
    script is its alias: test_bad_inputs_exit_2_with_one_line launches it, and the interrupted runs
    below launch it twice): what it printed and logged, together as a launch's stdout and
    stderr hold them (output not a terminal: a log line per step). A launch imported torch,
    transformers and peft again (~5 s of CPU); a launched run and one in this process log the same
    metrics (the interrupted runs' launches are compared with this process's run). The job budget
    counts from its process's start: from this call here, as in a launch."""
    import contextlib
    import io
    import logging

    from skyrl_tool_agent.commands.train import main
    from skyrl_tool_agent.jobs import budget

    assert cmd[:2] == [sys.executable, str(SCRIPT)], cmd[:2]
    printed = io.StringIO()
    handler = logging.StreamHandler(printed)  # the log lines (under pytest the command's own handler is not set)
    handler.setFormatter(logging.Formatter("[%(asctime)s] %(levelname)s %(message)s", datefmt="%H:%M:%S"))
    logger, level = logging.getLogger(), logging.getLogger().level
    started = time.monotonic()
    with pytest.MonkeyPatch.context() as patch, contextlib.redirect_stdout(printed), \
            contextlib.redirect_stderr(printed):
        patch.setattr(budget, "process_start", lambda: started)
        patch.delenv("COLUMNS", raising=False)  # the command's logging setup sets it for rich: undone after the run
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        try:
            main(cmd[2:])
        except SystemExit as exited:  # a launch would have exited with this status
            if exited.code not in (0, None):
                raise AssertionError(f"exit {exited.code}: {printed.getvalue()[-3000:]}") from None
        finally:
            logger.removeHandler(handler)
            logger.setLevel(level)
    return printed.getvalue()


@pytest.fixture(scope="module")
def uninterrupted(setup, tmp_path_factory):
    """One uninterrupted run of STEPS steps (`_main_here`): (its output dir, what it printed and
    logged) for the runs that are interrupted and resumed to compare with."""
    root, model_dir = setup
    full = tmp_path_factory.mktemp("full")
    return full, _main_here(_cmd(root, model_dir, full))


def _assert_same_steps(rows: list[dict], again: list[dict]) -> None:
    assert [r["step"] for r in again] == list(range(STEPS + 1))  # every step exactly once
    for a, b in zip(rows, again):
        for key in ("reward/mean", "train/loss", "train/kl", "eval/execution_accuracy"):
            assert (key in a) == (key in b), (a["step"], key)
            if key in a:
                assert b[key] == pytest.approx(a[key], rel=1e-4, abs=1e-5), (a["step"], key)


def _wait_for(proc: subprocess.Popen, ready, what: str, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        assert proc.poll() is None and time.monotonic() < deadline, f"run ended before {what}"
        time.sleep(0.05)


@pytest.mark.slow
def test_a_run_trains_checkpoints_and_reports(uninterrupted):
    full, printed = uninterrupted
    rows = _metrics(full)
    assert [r["step"] for r in rows] == list(range(STEPS + 1))
    for key in ("reward/mean", "reward/std", "train/loss", "train/kl", "train/entropy", "episode/turns_mean",
                "episode/tool_errors", "tokens_per_s"):
        assert key in rows[1], key
    assert "eval/execution_accuracy" in rows[0] and "eval/execution_accuracy" in rows[-1]
    assert rows[1]["train/entropy"] > 0 and rows[1]["tokens_per_s"] > 0
    assert (full / "checkpoints" / f"step-{STEPS:06d}" / "trainer_state.json").is_file()
    assert (full / "final" / "adapter_config.json").is_file()
    card = (full / "final" / "README.md").read_text()  # a real model card, not peft's empty template
    assert card.startswith("---\n") and "library_name: peft" in card and "Model Card for Model ID" not in card
    assert f"{STEPS} GRPO steps" in card and "| execution_accuracy |" in card and "paired-bootstrap interval" in card
    assert (full / "training_curves.png").stat().st_size > 10_000
    assert "before GRPO" in printed
    # Before/after on the same tasks, with the paired interval of the change and why training stopped.
    record = json.loads((full / "before_after.json").read_text())
    assert len(record["before"]["solved"]) == len(record["after"]["solved"]) == 3
    delta = record["execution_accuracy_delta"]
    assert delta["n"] == 3 and delta["low"] <= delta["delta"] <= delta["high"]
    assert delta["delta"] == pytest.approx(record["after"]["execution_accuracy"] - record["before"]["execution_accuracy"])
    assert record["stop_reason"] == f"max_steps ({STEPS}) reached"
    assert "paired-bootstrap interval" in printed and f"training stopped: max_steps ({STEPS}) reached" in printed
    # Output captured (not a terminal): the progress bar is replaced by one log line per step.
    # With the default time budget each line also gives the budget's clock.
    lines = [line for line in printed.splitlines() if "GRPO step" in line]
    assert all(any(f"GRPO step {n}/{STEPS}, " in line and "/8.0 min" in line for line in lines)
               for n in range(1, STEPS + 1)), lines
    assert all(r["time/elapsed_s"] > 0 for r in rows[1:])
    # Sampled episodes a person can read: 2 whole groups per step (rollout_groups_per_step), 2 episodes each.
    rollouts = _rollouts(full)
    assert [r["step"] for r in rollouts] == [s for s in range(1, STEPS + 1) for _ in range(4)]
    first = rollouts[0]
    assert first["messages"][0]["role"] == "system" and first["gold_sql"] and "execution" in first["reward_terms"]
    assert [r["group_member"] for r in rollouts[:4]] == [0, 1, 0, 1] and len({r["task_id"] for r in rollouts[:4]}) == 2
    assert set(first["reward_terms"]) >= {"execution", "format", "syntax", "partial"}
    assert all(isinstance(r["advantage"], float) and isinstance(r["used_in_update"], bool) for r in rollouts)


def _rollouts(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "rollouts.jsonl").read_text().splitlines()]


def _steps_logged(out: Path) -> list[int]:
    """Steps in metrics.jsonl so far (read while the run writes it: a line still being written is skipped)."""
    path = out / "metrics.jsonl"
    steps = []
    for line in path.read_text().splitlines() if path.is_file() else []:
        try:
            steps.append(json.loads(line)["step"])
        except ValueError:
            pass
    return steps


def _launch(cmd: list[str], logs: Path) -> subprocess.Popen:
    """`cmd` in a process of its own, its stdout (the log lines) and stderr into files under `logs`
    (files, not pipes: a full pipe would stall the run)."""
    logs.mkdir(parents=True)
    with (logs / "stdout").open("w") as out, (logs / "stderr").open("w") as err:
        return subprocess.Popen(cmd, env=_env(), stdout=out, stderr=err)


def _logged_step(logs: Path, step: int) -> bool:
    """Whether the run logging into `logs` has finished `step` (its row and episodes written: the
    step line is logged after them)."""
    return f"GRPO step {step}/{STEPS}, " in (logs / "stdout").read_text()


@pytest.mark.slow
def test_sigint_and_kill9_keep_finished_steps_and_resume_exactly(setup, uninterrupted, tmp_path):
    """One run stopped two ways, each time resumed, with no periodic checkpoints (only the signal
    path can save the steps done before a signal): SIGINT in step 1; `kill -9` once the run resumed
    with `--resume auto` has logged step 2, which nothing saved; then, in this process, resumed to
    the end from the SIGINT's checkpoint named by its path (`--resume PATH`), which drops the
    killed step's metrics and episodes and runs it again. Every step once, the same metrics, the
    same episodes and the same adapters as the uninterrupted run; each resume says the minutes of
    the time budget its checkpoint had spent, and the clock goes on from them. (SIGTERM takes the
    same path, `grpo.interrupts.STOP_SIGNALS`, and is sent to a launched run's every rank by
    torchrun in tests/test_multinode.py.)"""
    root, model_dir = setup
    out = tmp_path / "sig"
    cmd = _cmd(root, model_dir, out, "--set", "training.checkpoint_every=0")

    # SIGINT right after the step-0 row (the evaluation before training): it lands in step 1
    logs = tmp_path / "SIGINT"
    proc = _launch(cmd, logs)
    _wait_for(proc, lambda: 0 in _steps_logged(out), "the signal's moment")
    proc.send_signal(signal.SIGINT)
    proc.wait(timeout=240)
    stderr = (logs / "stderr").read_text()
    saved = max(_steps_logged(out))
    assert proc.returncode == 128 + signal.SIGINT, stderr[-3000:]
    assert saved < STEPS and "Traceback" not in stderr, stderr[-3000:]
    assert f"interrupted by SIGINT after step {saved}: checkpoint saved in" in stderr, stderr[-3000:]
    assert f"resume with: {sys.executable} " in stderr and stderr.rstrip().endswith("--resume auto"), stderr[-1000:]
    checkpoint = out / "checkpoints" / f"step-{saved:06d}"
    # the minutes of the time budget the SIGINT's checkpoint records: the resumed runs' clock goes on from them
    spent = json.loads((checkpoint / "trainer_state.json").read_text())["elapsed_s"]
    assert spent > 0

    logs = tmp_path / "SIGKILL"
    proc = _launch([*cmd, "--resume", "auto"], logs)
    _wait_for(proc, lambda: _logged_step(logs, saved + 1), "its first step")
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    printed = (logs / "stdout").read_text()
    assert f"resumed from {checkpoint} at step {saved} (" in printed and "min of the time budget spent)" in printed
    assert not (out / "checkpoints" / f"step-{saved + 1:06d}").exists()  # step 2 logged, never saved
    assert saved + 1 in _steps_logged(out) and saved + 1 in [r["step"] for r in _rollouts(out)]

    # to the end in this process (`_main_here`; the signals needed launches, this resume does not)
    finished = _main_here([*cmd, "--resume", str(checkpoint)])
    assert f"resumed from {checkpoint} at step {saved} (" in finished and "min of the time budget spent)" in finished
    # the clock went on from the minutes the checkpoint had spent
    assert all(r["time/elapsed_s"] > spent for r in _metrics(out)[saved + 1:])
    full = uninterrupted[0]
    _assert_same_steps(_metrics(full), _metrics(out))
    assert [(r["step"], r["task_id"], r["reward"]) for r in _rollouts(out)] == \
        [(r["step"], r["task_id"], r["reward"]) for r in _rollouts(full)]  # no interrupted step's episodes doubled
    assert all(r["train/grad_norm"] > 0 for r in _metrics(full)[1:])  # every step trained the adapters
    from safetensors.torch import load_file

    ends = [load_file(run / "final" / "adapter_model.safetensors") for run in (full, out)]
    assert ends[0].keys() == ends[1].keys() and all(ends[0][k].equal(ends[1][k]) for k in ends[0])


def test_bad_inputs_exit_2_with_one_line(setup, tmp_path, monkeypatch, capsys):
    """The first case through the script (a process of its own), the others through its `main` in
    this process (the script is its alias): the same exit status and lines, one start instead of four."""
    from skyrl_tool_agent.commands.train import main

    root, model_dir = setup
    cases = [
        ["--set", "grpo.group_size=four"],
        ["--set", "training.data.train_file=/nonexistent/train.json"],
        ["--set", "model.name_or_path=/nonexistent/model"],
        ["--push-to-hub", "me/repo"],
    ]
    for name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_TOKEN_PATH"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))  # no token cached by `hf auth login` either
    for i, extra in enumerate(cases):
        if i == 0:
            res = subprocess.run(_cmd(root, model_dir, tmp_path / "bad", *extra), env=_env(),
                                 capture_output=True, text=True, timeout=120)
            code, stderr = res.returncode, res.stderr
        else:
            capsys.readouterr()
            with pytest.raises(SystemExit) as exited:
                main(_cmd(root, model_dir, tmp_path / "bad", *extra)[2:])
            code, stderr = exited.value.code, capsys.readouterr().err
        assert code == 2, (extra, stderr[-2000:])
        err = [line for line in stderr.splitlines() if line.startswith("error:")]
        assert len(err) == 1 and "Traceback" not in stderr, (extra, stderr[-2000:])
        if "model.name_or_path=/nonexistent/model" in extra:
            assert "model directory '/nonexistent/model' does not exist" in err[0], err
        assert not (tmp_path / "bad").exists(), (extra, "a rejected run wrote its output directory")


def test_sft_baseline_continues_the_warm_start_for_the_given_time(setup, tmp_path, monkeypatch, capsys):
    """The supervised baseline GRPO is compared with: real supervised steps for the given wall time,
    evaluated greedy before and after on GRPO's dev subset; --save-model keeps the continued model.
    The script runs in this process (`runpy`, as `python training/scripts/sft_baseline.py ARGS`
    would: its alias line and the command's `main`, the same output and files): a launch of its
    own imported torch, transformers and peft again, ~5 s of CPU (test_bad_inputs_exit_2_with_one_line
    launches the train script, whose alias is the same two lines)."""
    import runpy

    from safetensors.torch import load_file

    root, model_dir = setup
    out, kept = tmp_path / "sft.json", tmp_path / "continued"
    # 0.6 s of steps (dozens on the tiny model): the deadline ends them, not the step cap; they train the
    # model all the same
    script = REPO / "training" / "scripts" / "sft_baseline.py"
    monkeypatch.setattr(sys, "argv", [str(script), "--minutes", "0.01", "--output", str(out), "--save-model", str(kept),
                                      *_config_args(root, model_dir)])
    monkeypatch.setattr(sys, "path", list(sys.path))  # the alias puts the checkout first: undone after the test
    monkeypatch.delenv("COLUMNS", raising=False)  # the command's logging setup sets it for rich: undone after the test
    started = time.monotonic()
    capsys.readouterr()
    runpy.run_path(str(script), run_name="__main__")
    stdout = capsys.readouterr().out
    result = json.loads(out.read_text())
    assert result["minutes"] == 0.01 and result["steps"] >= 1
    for side in ("before", "after"):
        assert result[side]["n"] == 3 and 0.0 <= result[side]["execution_accuracy"] <= 1.0
    assert "continued warm start:" in stdout
    assert time.monotonic() - started < 240  # the deadline stops it (the step cap is 10**6)
    before, after = load_file(model_dir / "model.safetensors"), load_file(kept / "model.safetensors")
    assert before.keys() == after.keys() and any(not before[k].equal(after[k]) for k in before)  # trained
    assert (kept / "tokenizer_config.json").is_file()


#: Metrics that measure time or memory, not what was learned: the only ones two identical runs may differ in.
TIMING_KEYS = ("tokens_per_s", "time/rollout_s", "time/update_s", "time/elapsed_s", "memory/peak_rss_gib",
               "rollout/slot_wait_s")


def test_two_fresh_runs_with_one_seed_log_the_same_metrics(setup, uninterrupted, tmp_path):
    """Issue 17 #13: the same training.seed, two runs from scratch, the same metrics.jsonl and the
    same adapters, in one process, one run after the other: the uninterrupted run (the module's
    fixture), then this one, after Python's, NumPy's and torch's global RNGs were drawn from and
    reseeded besides (so it holds when this test runs alone too): whatever the process's RNGs hold
    must not reach the second run's LoRA initialisation or its draws. (The first run is the one the
    interrupted runs compare with: two runs here before.)"""
    import random

    import numpy as np
    import torch
    from safetensors.torch import load_file

    from skyrl_tool_agent.config import load_config
    from skyrl_tool_agent.jobs.train import run_training

    root, model_dir = setup
    full = uninterrupted[0]
    random.seed(1), random.random(), np.random.seed(2), np.random.rand(3), torch.manual_seed(3), torch.rand(3)
    sets = [a for a in _config_args(root, model_dir) if a != "--set"]  # the first run's settings
    run_training(load_config(overrides=[*sets, "training.mode=lora", f"training.output_dir={tmp_path / 'b'}"]))
    runs = [[{k: v for k, v in row.items() if k not in TIMING_KEYS} for row in _metrics(out)]
            for out in (full, tmp_path / "b")]
    assert [r["step"] for r in runs[0]] == list(range(STEPS + 1))
    assert runs[0] == runs[1]
    # The memory plan at work: every step's episodes fit the engine at once (this machine's RAM), none waited.
    assert all(r["rollout/episodes_in_flight"] >= 4 and r["rollout/slot_waits"] == 0 for r in runs[0][1:]), runs[0]
    # Each step's row gives the process's peak resident memory so far (GiB): what a laptop's RAM must hold.
    peaks = [row["memory/peak_rss_gib"] for row in _metrics(tmp_path / "b")[1:]]
    assert all(0.05 < p < 64 for p in peaks) and peaks == sorted(peaks), peaks
    # The adapters too (LoRA's A matrices are random at initialisation; B starts at zero, so a step
    # whose groups all tie would not show a different A in the metrics).
    adapters = [load_file(out / "final" / "adapter_model.safetensors") for out in (full, tmp_path / "b")]
    assert adapters[0].keys() == adapters[1].keys()
    assert all(torch.equal(adapters[0][k], adapters[1][k]) for k in adapters[0])


def test_lr_schedule_advances_only_on_steps_that_train(setup, tmp_path):
    """A step whose groups are all uniform (every episode the oracle's, so every reward equal) drops
    them all: no optimizer step, so the LR schedule must not move either (no "lr_scheduler.step()
    before optimizer.step()" warning, warmup not spent on it). The next step, whose groups have a
    spread (member 1 answers wrong), trains and advances the schedule by exactly one. Real MCP
    servers, the real tiny model, real collector episodes; only the agent is scripted."""
    import asyncio
    import warnings

    from skyrl_tool_agent.config import Config
    from skyrl_tool_agent.env.chat_format import format_answer
    from skyrl_tool_agent.grpo.trainer import GRPOTrainer
    from skyrl_tool_agent.data.loader import build_loader
    from skyrl_tool_agent.rollout.agents import ScriptedAgent, oracle_turn_texts
    from skyrl_tool_agent.rollout.collector import TrajectoryCollector
    from tests.fixtures.tiny_policy import tiny_policy

    root, model_dir = setup
    lr, warmup = 0.01, 4  # LambdaLR factor (step + 1) / warmup: lr/4 before any update, lr/2 after one
    config = Config(
        model={"device": "cpu", "lora": {"r": 4, "alpha": 8, "dropout": 0.0}},
        training={"tasks_per_step": 2, "max_steps": 8, "learning_rate": lr, "warmup_steps": warmup,
                  "wandb": {"mode": "disabled"}},
        grpo={"group_size": 2, "filter_uniform_groups": True, "refill_rounds": 0, "kl_coef": 0.0,
              "max_turns": 4, "max_new_tokens_per_turn": 40, "max_total_tokens": 1200},
    )

    class ScriptedTrainer(GRPOTrainer):
        wrong_member: int | None = None  # this group member submits a wrong query (None: all the oracle)

        def collect(self, tasks, group_size, params, settings=None, on_episode_done=None):  # type: ignore[override]
            def script(r):
                if r.group_index == self.wrong_member:
                    return [format_answer("SELECT name FROM customer WHERE 0")]
                return oracle_turn_texts(r.task, r.env_info)

            collector = TrajectoryCollector(self.runtime, ScriptedAgent(script), tokenizer=self.policy.tokenizer,
                                            settings=settings or self.collector_settings)
            return asyncio.run(collector.collect(tasks, group_size, on_episode_done=on_episode_done))

    runtime = EnvRuntime(EnvConfig(), root / "dbs")
    try:
        trainer = ScriptedTrainer(config, tiny_policy(model_dir, mode="lora"), runtime,
                                  build_loader(config, SHOP_TASKS), [], output_dir=tmp_path / "out")
        assert trainer.scheduler.last_epoch == 0 and trainer.scheduler.get_last_lr()[0] == pytest.approx(lr / warmup)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            dropped = trainer.train_step()
        assert [t.result.solved for t in dropped.trajectories] == [True] * 4
        assert dropped.metrics["train/groups_dropped"] == 2 and dropped.metrics["train/trajectories_used"] == 0
        assert dropped.metrics["train/optimizer_steps"] == 0 and not trainer.optimizer.state  # nothing trained
        assert trainer.scheduler.last_epoch == 0, "the LR schedule advanced on a step without an optimizer step"
        assert dropped.metrics["train/lr"] == pytest.approx(lr / warmup)
        assert not [w for w in caught if "lr_scheduler.step()" in str(w.message)]

        trainer.wrong_member = 1
        trained = trainer.train_step()
    finally:
        runtime.close()
    assert [t.result.solved for t in trained.trajectories] == [True, False, True, False]
    assert trained.metrics["train/groups_dropped"] == 0 and trained.metrics["train/optimizer_steps"] == 1
    assert trainer.scheduler.last_epoch == 1  # one update, one schedule step
    assert trained.metrics["train/lr"] == pytest.approx(lr * 2 / warmup)
    assert trainer.optimizer.param_groups[0]["lr"] == pytest.approx(lr * 2 / warmup)
