"""Issue 17 #11 and #12: resuming loads nothing that can run code, verifies every checkpoint file
against its sha256 manifest, falls back to the newest intact checkpoint with a warning, exits with
one `error:` line when none is intact, and survives a torn last line in metrics.jsonl.

Real tiny Qwen2 + LoRA, real AdamW steps, real checkpoint files damaged on disk.
"""

from __future__ import annotations

import json
import logging
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from skyrl_tool_agent.config import Config, UserInputError
from skyrl_tool_agent.grpo.checkpoint import (
    MANIFEST,
    CheckpointError,
    latest_checkpoint,
    load_checkpoint,
    save_checkpoint,
    write_manifest,
)
from skyrl_tool_agent.grpo.run_logging import RunLogger, read_metrics
from skyrl_tool_agent.grpo.optimizer import build_optimizer
from skyrl_tool_agent.policy.embedded import new_tiny_qwen2, train_tokenizer
from tests.fixtures.tiny_policy import tiny_policy

CORPUS = ["SELECT count(*) FROM customer WHERE city = 'Paris'", "<tool_call> execute_sql </tool_call> <answer>"] * 20
CONFIG = Config(training={"learning_rate": 0.01, "max_steps": 10, "warmup_steps": 0})


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tiny")
    tokenizer = train_tokenizer(CORPUS, 300)
    new_tiny_qwen2(tokenizer, hidden_size=32, layers=1, heads=2, kv_heads=1, intermediate_size=64).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


class Run:
    """A LoRA policy with its optimizer and scheduler, trained one real step at a time."""

    def __init__(self, model_dir: Path) -> None:
        self.policy = tiny_policy(model_dir, mode="lora")
        self.optimizer, self.scheduler = build_optimizer(self.policy, CONFIG)
        self.ids = self.policy.tokenizer(CORPUS[0], return_tensors="pt")["input_ids"]

    def step(self) -> None:
        self.policy.model.train()
        self.policy.model(input_ids=self.ids, labels=self.ids).loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad()
        self.scheduler.step()

    def weights(self) -> dict[str, torch.Tensor]:
        return {n: p.detach().clone() for n, p in self.policy.model.named_parameters() if p.requires_grad}

    def save(self, root: Path, step: int, config_yaml: str | None = None) -> Path:
        return save_checkpoint(root, step, policy=self.policy, optimizer=self.optimizer, scheduler=self.scheduler,
                               trainer_state={"loader": {"position": step}}, keep=5, config_yaml=config_yaml)

    def load(self, path: Path) -> dict:
        return load_checkpoint(path, policy=self.policy, optimizer=self.optimizer, scheduler=self.scheduler)


def draws() -> tuple[float, float, float]:
    return random.random(), float(np.random.rand()), float(torch.rand(1))


def same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_round_trip_with_plain_data_only(model_dir: Path, tmp_path: Path) -> None:
    run = Run(model_dir)
    run.step()
    random.seed(1), np.random.seed(2), torch.manual_seed(3)
    path = run.save(tmp_path, 1)
    expected_draws, expected_weights = draws(), run.weights()
    # Everything a checkpoint holds loads without unpickling code: optim.pt under weights_only,
    # RNG and loader state as JSON.
    blob = torch.load(path / "optim.pt", weights_only=True)
    assert set(blob) == {"optimizer", "scheduler"} and blob["optimizer"]["state"]
    rng = json.loads((path / "rng.json").read_text())
    assert set(rng) == {"python", "numpy", "torch"}
    manifest = json.loads((path / MANIFEST).read_text())["files"]
    assert {"optim.pt", "rng.json", "trainer_state.json", "weights/adapter_model.safetensors"} <= set(manifest)

    run.step()
    draws()
    assert not same(run.weights(), expected_weights)
    state = run.load(path)
    assert state == {"step": 1, "loader": {"position": 1}}
    assert same(run.weights(), expected_weights) and draws() == expected_draws
    assert run.scheduler.last_epoch == 1 and len(run.optimizer.state) > 0


class _Payload:
    """Unpickling this runs code: it writes a marker file (what a crafted optim.pt could do)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (exec, (f"open({str(self.marker)!r}, 'w').write('ran')",))


def test_crafted_optim_pt_does_not_run_code(model_dir: Path, tmp_path: Path) -> None:
    run = Run(model_dir)
    path = run.save(tmp_path / "checkpoints", 1)
    marker = tmp_path / "code-ran"
    blob = {"optimizer": run.optimizer.state_dict(), "scheduler": _Payload(marker), "rng": None}
    torch.save(blob, path / "optim.pt")  # the format save_checkpoint writes, with a payload inside
    write_manifest(path)  # whoever can write the checkpoint can rewrite its manifest too
    with pytest.raises(CheckpointError, match="cannot load checkpoint"):
        run.load(path)
    assert not marker.exists()


def flip_bit(file: Path, offset_from_end: int = 1) -> None:
    data = bytearray(file.read_bytes())
    data[-offset_from_end] ^= 0x01
    file.write_bytes(bytes(data))


def truncate(file: Path) -> None:
    file.write_bytes(file.read_bytes()[: file.stat().st_size // 2])


@pytest.mark.parametrize(
    "damage",
    [
        lambda p: flip_bit(p / "weights" / "adapter_model.safetensors"),  # loads fine, garbage weights
        lambda p: truncate(p / "weights" / "adapter_model.safetensors"),
        lambda p: truncate(p / "optim.pt"),
        lambda p: truncate(p / "rng.json"),
        lambda p: truncate(p / "trainer_state.json"),
        lambda p: (p / MANIFEST).unlink(),
        lambda p: truncate(p / MANIFEST),
        lambda p: (p / "weights" / "adapter_config.json").unlink(),
    ],
    ids=["adapter-bit-flip", "adapter-truncated", "optim-truncated", "rng-truncated", "state-truncated",
         "no-manifest", "manifest-truncated", "file-missing"],
)
def test_damaged_newest_checkpoint_falls_back_to_the_intact_one(model_dir: Path, tmp_path: Path, damage,
                                                                caplog: pytest.LogCaptureFixture) -> None:
    run = Run(model_dir)
    root = tmp_path / "checkpoints"
    run.step()
    first = run.save(root, 1)
    first_weights = run.weights()
    run.step()
    second = run.save(root, 2)
    damage(second)
    with caplog.at_level(logging.WARNING, logger="skyrl_tool_agent.grpo.checkpoint"):
        chosen = latest_checkpoint(root)
    assert chosen == first
    assert any("step-000002" in r.getMessage() and "skipping" in r.getMessage() for r in caplog.records)
    assert any("newest intact checkpoint" in r.getMessage() for r in caplog.records)
    assert run.load(chosen)["step"] == 1 and same(run.weights(), first_weights)
    with pytest.raises(CheckpointError, match="step-000002"):  # named explicitly: no silent substitute
        run.load(second)


def test_no_intact_checkpoint_is_a_one_line_user_error(model_dir: Path, tmp_path: Path) -> None:
    run = Run(model_dir)
    root = tmp_path / "checkpoints"
    for step in (1, 2):
        truncate(run.save(root, step) / "optim.pt")
    with pytest.raises(UserInputError) as caught:
        latest_checkpoint(root)
    assert isinstance(caught.value, CheckpointError) and "\n" not in str(caught.value)
    assert "step-000001" in str(caught.value) and "step-000002" in str(caught.value)
    assert latest_checkpoint(tmp_path / "nothing-here") is None  # no checkpoint at all: start fresh


def test_torn_last_line_of_metrics_jsonl(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    rows = [{"step": s, "reward/mean": 0.1 * s} for s in range(4)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"step": 4, "rew')
    logger = RunLogger(tmp_path)
    with caplog.at_level(logging.WARNING):
        logger.truncate_after(2)
    assert read_metrics(tmp_path / "metrics.jsonl") == rows[:3]
    assert any("partial last line" in r.getMessage() for r in caplog.records)
    logger.log({"step": 3, "reward/mean": 0.5})
    assert [r["step"] for r in read_metrics(tmp_path / "metrics.jsonl")] == [0, 1, 2, 3]


def _cli_run(model_dir: Path, tmp_path: Path) -> tuple[Path, dict[str, Any]]:
    """A run directory for the train command (tasks, databases) and its `--set`s."""
    from skyrl_tool_agent.data.tasks import save_tasks
    from tests.fixtures.tiny_db import SHOP_TASKS, make_shop_db

    make_shop_db(tmp_path / "dbs")
    save_tasks(SHOP_TASKS, tmp_path / "tasks.json")
    sets = {"model.name_or_path": model_dir, "model.device": "cpu", "training.data.train_file": tmp_path / "tasks.json",
            "training.data.dev_file": tmp_path / "tasks.json", "training.data.db_root": tmp_path / "dbs",
            "training.data.train_pool": "file", "training.eval_num_tasks": 1, "training.wandb.mode": "disabled"}
    return tmp_path / "out", sets


def _train_command_error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """The train command's one `error:` line (exit 2, no traceback), run in this process."""
    from skyrl_tool_agent.commands.train import main

    capsys.readouterr()
    with pytest.raises(SystemExit) as exited:
        main(argv)
    stderr = capsys.readouterr().err
    errors = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert exited.value.code == 2, stderr[-3000:]
    assert len(errors) == 1 and "Traceback" not in stderr, stderr[-3000:]
    return errors[0]


def test_cli_resume_from_corrupt_checkpoints_exits_2_with_one_line(model_dir: Path, tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """End to end through the train command (in this process: the script is its alias): a
    truncated checkpoint is a user-facing error, not a traceback."""
    out, sets = _cli_run(model_dir, tmp_path)
    run = Run(model_dir)
    truncate(run.save(out / "checkpoints", 1) / "weights" / "adapter_model.safetensors")
    argv = ["--mode", "lora", "--output-dir", str(out), "--resume", "auto",
            *[a for k, v in sets.items() for a in ("--set", f"{k}={v}")]]
    errors = [_train_command_error(argv, capsys)]
    assert "no intact checkpoint" in errors[0] and "adapter_model.safetensors" in errors[0]


def test_resume_stops_on_a_setting_that_changes_training_before_anything_is_loaded(
        model_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A launch resumed with a learning rate and a KL coefficient other than its checkpoint's run
    recorded stops with one `error:` line naming the first knob, both values and how many more,
    before a model is loaded or a file written (the run's config.yaml stays the checkpoint's);
    before, it trained on with the restored optimizer under the new numbers. Knobs a resume may
    change (how long, where, what it logs, how it computes) pass."""
    from skyrl_tool_agent.config import load_config
    from skyrl_tool_agent.jobs.train import resume_problem

    out, sets = _cli_run(model_dir, tmp_path)
    overrides = ["training.mode=lora", f"training.output_dir={out}", *(f"{k}={v}" for k, v in sets.items())]
    trained = load_config(None, [*overrides, "training.learning_rate=0.5", "grpo.kl_coef=0.2"])
    run = Run(model_dir)
    checkpoint = run.save(out / "checkpoints", 1, config_yaml=trained.dump_yaml())
    (out / "config.yaml").write_text(trained.dump_yaml())
    argv = ["--mode", "lora", "--output-dir", str(out), "--resume", "auto",
            *[a for k, v in sets.items() for a in ("--set", f"{k}={v}")]]
    line = _train_command_error(argv, capsys)
    launch = load_config(None, overrides)
    assert (f"--resume {checkpoint}: training.learning_rate is {launch.training.learning_rate} in this launch but 0.5 "
            "in the checkpoint's run (and 1 more: grpo.kl_coef)") in line, line
    assert (out / "config.yaml").read_text() == trained.dump_yaml()  # refused before the run wrote anything
    assert sorted(p.name for p in out.iterdir()) == ["checkpoints", "config.yaml"]

    # What a resume may change passes; anything else is named, with an explicit checkpoint too.
    same = load_config(None, [*overrides, "training.learning_rate=0.5", "grpo.kl_coef=0.2"])
    assert resume_problem(same, out, "auto", 1) is None
    moved = load_config(None, [*overrides, "training.learning_rate=0.5", "grpo.kl_coef=0.2",
                               "training.time_budget_minutes=30", f"training.output_dir={tmp_path / 'elsewhere'}",
                               f"training.data.db_root={tmp_path / 'copied_dbs'}", "training.eval_every=5",
                               "training.micro_batch_size=2", "training.checkpoint_every=3", "model.device=auto",
                               "training.wandb.mode=offline", "env.collector.concurrency=7"])
    assert resume_problem(moved, out, str(checkpoint), 1) is None
    for knob, value in {"training.max_steps": 7, "training.mode": "full", "grpo.clip_eps_high": 0.5,
                        "model.lora.r": 4, "training.seed": 3, "env.reward.keep_distinct": False}.items():
        other = load_config(None, [*overrides, "training.learning_rate=0.5", "grpo.kl_coef=0.2", f"{knob}={value}"])
        problem = resume_problem(other, out, str(checkpoint), 1)
        assert problem is not None and f": {knob} is " in problem and "(and" not in problem, (knob, problem)
    assert resume_problem(launch, out, str(tmp_path / "no-such-checkpoint"), 1) is None  # the load says so

    # A ZeRO-3 checkpoint also needs its rank count; one that recorded no config is not compared.
    (checkpoint / "trainer_state.json").write_text(json.dumps({"step": 1, "world_size": 2}))
    full = load_config(None, [*overrides, "training.learning_rate=0.5", "grpo.kl_coef=0.2", "training.mode=full"])
    assert "was written by 2 ranks, this run has 4" in resume_problem(full, out, "auto", 4)
    (checkpoint / "config.yaml").unlink()
    assert resume_problem(launch, out, "auto", 1) is None


def test_what_a_resume_may_change_names_real_knobs() -> None:
    """Every entry of MAY_CHANGE_ON_RESUME is a knob (or a section prefix) of the schema: a typo
    there would silently compare what it meant to allow."""
    from skyrl_tool_agent.config.resume import MAY_CHANGE_ON_RESUME, flat_settings

    knobs = flat_settings(Config().to_dict())
    for allowed in MAY_CHANGE_ON_RESUME:
        assert any(k == allowed or (allowed.endswith(".") and k.startswith(allowed)) for k in knobs), allowed
