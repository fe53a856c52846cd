"""Issue 17 #14: a partly written embedded-model build never breaks later runs.

A real build (oracle episodes through a real MCP server, BPE tokenizer, tiny Qwen2, one warm-start
step) from the built-in data, cut to a few tasks.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from skyrl_tool_agent.config import SHIPPED_EMBEDDED_DIR, Config
from skyrl_tool_agent.eval.splits import TaskSplits
from skyrl_tool_agent.jobs.build_model import build_embedded
from skyrl_tool_agent.policy.loading import ModelLoadError, resolve_model_path
from skyrl_tool_agent.policy.manifest import MANIFEST_FILE, verify_manifest


def test_partial_build_is_built_anew_and_a_damaged_one_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from skyrl_tool_agent.rollout.collector import CollectorSettings
    from skyrl_tool_agent.warmstart import build

    # The held-out curve is a greedy evaluation like every other (eval.greedy): the evaluation
    # settings, not the oracle episodes' (at least 4 turns, training DISTINCT semantics, free batching).
    evaluated_with: list[CollectorSettings] = []
    real = build.greedy_evaluation

    def spy(policy, runtime, tasks, settings, **kwargs):
        evaluated_with.append(settings)
        return real(policy, runtime, tasks, settings, **kwargs)

    monkeypatch.setattr(build, "greedy_evaluation", spy)
    out = tmp_path / "embedded"
    config = Config(model={"embedded_dir": str(out), "device": "cpu"},
                    training={"data": {"validation_tasks": 2}, "eval_num_tasks": 2})
    splits = TaskSplits.load(config)
    train, heldout, db_root = splits.train, splits.validation(), splits.db_root
    out.mkdir()
    shutil.copy(SHIPPED_EMBEDDED_DIR / "config.json", out / "config.json")  # all a killed copy left
    with pytest.raises(ModelLoadError, match="only partly"):
        resolve_model_path(config.model)

    report = build_embedded(config, train[:3], heldout, db_root, sft_steps=1, eval_every=1000)
    assert evaluated_with == [CollectorSettings.from_config(config, evaluation=True)]
    assert verify_manifest(out)["files"] == report["files"]
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(report["files"])
    assert resolve_model_path(config.model) == str(out)
    assert [p.name for p in tmp_path.iterdir()] == ["embedded"]  # built beside it, renamed into place
    assert build_embedded(config, train[:3], heldout, db_root)["files"] == report["files"]  # intact: kept

    weights = out / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    with pytest.raises(ModelLoadError, match="model.safetensors does not match") as caught:
        resolve_model_path(config.model)
    assert "\n" not in str(caught.value)
    assert json.loads((out / MANIFEST_FILE).read_text())["files"] == report["files"]
