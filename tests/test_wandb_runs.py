"""W&B through the real `wandb` client (offline, or online against a closed port): the run id is
kept in the run directory and reused on resume, WANDB_PROJECT/WANDB_ENTITY are respected, and a key
without a reachable server falls back to offline instead of turning W&B off."""

from __future__ import annotations

import json
import socket

import pytest

from skyrl_tool_agent.config import TrainingConfig
from skyrl_tool_agent.grpo.run_logging import WANDB_RUN_FILE, RunLogger


def _wandb_config(**update):
    return TrainingConfig().wandb.model_copy(update=update)


def test_resume_continues_the_same_wandb_run_and_a_fresh_run_gets_a_new_one(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_PROJECT", "from-env")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    first = RunLogger(tmp_path, wandb_config=_wandb_config(), run_config={"a": 1})
    assert first._wandb is not None and first._wandb.project == "from-env"
    run_id = first._wandb.id
    first.log({"step": 1, "reward/mean": 0.5})
    first.finish()
    assert json.loads((tmp_path / WANDB_RUN_FILE).read_text()) == {"id": run_id}

    resumed = RunLogger(tmp_path, wandb_config=_wandb_config(), resume=True)
    assert resumed._wandb.id == run_id
    resumed.finish()
    fresh = RunLogger(tmp_path, wandb_config=_wandb_config())  # same directory, not a resume
    assert fresh._wandb.id != run_id
    fresh.finish()


def test_project_and_entity_come_from_the_config_then_the_environment():
    env = {"WANDB_PROJECT": "p-env", "WANDB_ENTITY": "team"}
    assert _wandb_config().resolved_project(env) == "p-env" and _wandb_config().resolved_entity(env) == "team"
    assert _wandb_config().resolved_project({}) == "skyrl-tool-agent" and _wandb_config().resolved_entity({}) is None
    assert _wandb_config(project="mine").resolved_project(env) == "mine"


def test_a_key_without_a_reachable_server_logs_offline(tmp_path, monkeypatch):
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)
    monkeypatch.setenv("WANDB_BASE_URL", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("WANDB_INIT_TIMEOUT", "4")  # the wait for the server (was 10 s): the fallback is checked, not its time
    logger = RunLogger(tmp_path, wandb_config=_wandb_config(mode="online"))
    try:
        assert logger._wandb is not None, "W&B was turned off instead of falling back to offline"
        assert logger._wandb.settings.mode == "offline"
        logger.log({"step": 1, "reward/mean": 0.5})
    finally:
        logger.finish()
    assert list((tmp_path / "wandb").glob("offline-run-*")), "no offline run to sync later"
    assert (tmp_path / "metrics.jsonl").is_file()


@pytest.fixture(autouse=True)
def _quiet_wandb(monkeypatch):
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("WANDB_MODE", raising=False)  # scripts/test.sh sets offline; these tests pick the mode
