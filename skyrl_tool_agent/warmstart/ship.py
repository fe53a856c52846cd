"""Ship a built embedded model as the package's default: bf16 weights, file hashes, a greedy check.

The shipped `warmstart.json` keeps the build's own record and adds every file's sha256 and a greedy
check (per-task outcomes on a fixed set of validation tasks, loaded as the main job loads the
model), which a test reproduces exactly from the shipped files.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from skyrl_tool_agent.config import ModelConfig
from skyrl_tool_agent.data.tasks import Task
from skyrl_tool_agent.env.pools import EnvRuntime
from skyrl_tool_agent.eval.greedy import greedy_evaluation
from skyrl_tool_agent.policy.manifest import MANIFEST_FILE, tree_hashes
from skyrl_tool_agent.policy.qwen import QwenPolicy
from skyrl_tool_agent.rollout.collector import CollectorSettings

logger = logging.getLogger(__name__)


def greedy_check(model_dir: Path, runtime: EnvRuntime, tasks: Sequence[Task], settings: CollectorSettings) -> dict:
    """Per-task greedy outcomes of the model in `model_dir`, loaded as the main job loads the
    embedded model (full precision on this device, no adapters)."""
    policy = QwenPolicy.from_config(ModelConfig(embedded_dir=str(model_dir)), mode="full")
    settings = dataclasses.replace(settings, deterministic=True)  # lockstep batches: same numerics every run
    solved = greedy_evaluation(policy, runtime, tasks, settings).record["solved"]
    if None in solved:  # an episode lost to infrastructure is no outcome to ship or compare against
        raise RuntimeError(f"greedy check: {solved.count(None)} of {len(solved)} episodes could not be scored "
                           "(infrastructure errors)")
    return {
        "tasks": [t.model_dump(mode="json") for t in tasks],
        "solved": solved,
        "execution_accuracy": sum(solved) / max(1, len(solved)),
        "collector": asdict(settings),
    }


def ship_embedded_model(built_dir: Path, dest: Path, runtime: EnvRuntime, check_tasks: Sequence[Task],
                        settings: CollectorSettings) -> dict:
    """Write the model built in `built_dir` to `dest` in bf16 with its manifest; returns the manifest.
    Written into a temporary sibling and renamed into place."""
    record = json.loads((built_dir / MANIFEST_FILE).read_text())
    dest.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{dest.name}-", dir=dest.parent))
    staging.chmod(0o755)  # mkdtemp makes it private; the shipped model is package data
    try:
        model = AutoModelForCausalLM.from_pretrained(built_dir, dtype=torch.float32)
        model.to(torch.bfloat16).save_pretrained(staging)
        AutoTokenizer.from_pretrained(built_dir).save_pretrained(staging)
        record["shipped_dtype"] = "bfloat16"
        record["files"] = tree_hashes(staging, exclude=(MANIFEST_FILE,))
        # Loaded as the main job loads the shipped copy, manifest check included: written first
        # without the check's outcome, then again with it (the hashed files do not change).
        record.pop("greedy_check", None)
        (staging / MANIFEST_FILE).write_text(json.dumps(record, indent=1) + "\n")
        record["greedy_check"] = greedy_check(staging, runtime, check_tasks, settings)
        (staging / MANIFEST_FILE).write_text(json.dumps(record, indent=1) + "\n")
        shutil.rmtree(dest, ignore_errors=True)
        staging.rename(dest)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    logger.info("shipped %s -> %s: greedy check EX %.3f on %d tasks", built_dir, dest,
                record["greedy_check"]["execution_accuracy"], len(check_tasks))
    return record
