"""A start built from nothing under a wall-clock cap: a fresh Qwen2 of a given shape with the
project's tokenizer, supervised on oracle episodes of the generated pool (the warm start's recipe:
AdamW, warmup, cosine fitted to the time cap) until its greedy execution accuracy on the pool's
validation split is flat by the plateau rule (`warmstart.plateau.PlateauRule`), or the cap ends it.

The speedrun's first phase (`skyrl_tool_agent.jobs.speedrun`): on a GPU the recipe that took the
shipped model hours on two CPU cores takes minutes. Dev is never looked at here.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from skyrl_tool_agent.data.tasks import Task
from skyrl_tool_agent.env.pools import EnvRuntime
from skyrl_tool_agent.policy.embedded import new_tiny_qwen2
from skyrl_tool_agent.policy.manifest import MANIFEST_FILE, tree_hashes
from skyrl_tool_agent.policy.qwen import QwenPolicy
from skyrl_tool_agent.rollout.collector import CollectorSettings
from skyrl_tool_agent.warmstart.build import validation_figures
from skyrl_tool_agent.warmstart.plateau import PlateauRule, stop_reason, tail_gain
from skyrl_tool_agent.warmstart.sft import PackedExamples, SFTHistory, SFTSettings, supervised_finetune

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ModelShape:
    """A Qwen2's shape (`policy.embedded.new_tiny_qwen2`; the shipped model is 256 x 4 layers)."""

    hidden_size: int = 384
    layers: int = 6
    heads: int = 6
    kv_heads: int = 2
    intermediate_size: int = 1024

    def check(self) -> str | None:
        """Why this shape cannot be built (None: it can)."""
        if min(asdict(self).values()) < 1:
            return "every size must be at least 1"
        if self.hidden_size % self.heads:
            return f"hidden size {self.hidden_size} is not a multiple of {self.heads} heads"
        if self.heads % self.kv_heads:
            return f"{self.heads} heads are not a multiple of {self.kv_heads} KV heads"
        return None


def weights_fingerprint(model: Any) -> str:
    """sha256 of a model's base weights, by parameter name, LoRA adapters left out (a peft model
    and the plain model it wraps agree): which weights a phase starts from."""
    base = model.get_base_model() if callable(getattr(model, "get_base_model", None)) else model
    digest = hashlib.sha256()
    for name, param in sorted(base.named_parameters(), key=lambda item: item[0].replace(".base_layer", "")):
        if "lora_" in name:
            continue
        digest.update(name.replace(".base_layer", "").encode())
        digest.update(param.detach().float().cpu().numpy().tobytes())
    return digest.hexdigest()


def build_from_scratch(
    out_dir: Path,
    tokenizer: Any,
    examples: Sequence[tuple[list[int], list[int]]],
    runtime: EnvRuntime,
    heldout_tasks: Sequence[Task],
    *,
    shape: ModelShape,
    sft: SFTSettings,
    eval_settings: CollectorSettings,
    deadline: float,
    evaluations: int = 6,
    rule: PlateauRule = PlateauRule(min_steps=0),
    min_fraction: float = 0.5,
    device: str = "cpu",
    progress: Callable[[int, float], None] | None = None,
    provenance: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Build a model of `shape` and train it on `examples` until the monotonic `deadline`,
    evaluating greedy on `heldout_tasks` `evaluations` times and stopping once flat by `rule` (not
    before `min_fraction` of the planned steps: a model from nothing sits at 0 for a while). The
    schedule is fitted to the time left, or with `sft.time_budget_minutes` None is `sft.steps` long
    (`deadline` only guards). Saves the model with `warmstart.json` into `out_dir`; returns it."""
    import torch

    packed = PackedExamples.pack(examples, tokenizer.pad_token_id, device, sft.max_length)
    t0 = time.monotonic()
    seconds = max(1.0, deadline - t0)
    fixed_steps = sft.time_budget_minutes is None
    if fixed_steps:
        sft = replace(sft, time_budget_minutes=None, eval_every=max(1, math.ceil(sft.steps / (evaluations + 1))))
    else:
        sft = replace(sft, time_budget_minutes=seconds / 60, eval_every=10**9)
    model = new_tiny_qwen2(tokenizer, **asdict(shape), seed=sft.seed).to(device)
    policy = QwenPolicy(model, tokenizer, mode="full")
    parameters = sum(p.numel() for p in model.parameters())
    logger.info("model from nothing: %s, %.1fM parameters, %d oracle episodes, %.0f s to train",
                asdict(shape), parameters / 1e6, len(examples), seconds)

    stopped: list[str] = []

    def after_eval(history: SFTHistory, state: Callable[[], dict[str, Any]]) -> bool:
        planned = int(state()["planned"])
        reason = stop_reason(history.evals, replace(rule, min_steps=max(rule.min_steps, int(min_fraction * planned))),
                             None)
        logger.info("build step %d of ~%d: validation EX %.3f%s", history.evals[-1]["step"], planned,
                    history.evals[-1]["execution_accuracy"] or 0.0, f"; {reason}" if reason else "")
        stopped.extend([reason] if reason else [])
        return reason is not None

    # Evaluation marks on the training clock (evaluations are off it); the schedule fit ignores
    # their time, so the cap may end the cosine a little before its tail.
    marks = [] if fixed_steps else [seconds * (i + 1) / (evaluations + 1) for i in range(evaluations)]
    history = supervised_finetune(
        model, packed, tokenizer.pad_token_id, sft, progress=progress, deadline=deadline, eval_at_seconds=marks,
        after_eval=after_eval, evaluate=lambda _step: validation_figures(policy, runtime, heldout_tasks, eval_settings))
    record: dict[str, Any] = {**(provenance or {}), "shape": asdict(shape), "parameters": parameters,
                              "vocab_size": len(tokenizer), "oracle_episodes": len(examples),
                              "heldout_tasks": len(heldout_tasks), "device": device}
    record["sft"] = {"settings": asdict(sft), "fixed_steps": fixed_steps, "loss": history.loss, "evals": history.evals, "seconds": history.seconds,
                     "planned_steps": history.planned_steps, "steps": len(history.loss)}
    record["plateau"] = {"rule": asdict(rule), "min_fraction": min_fraction, "tail_gain": tail_gain(history.evals, rule),
                         "stopped": stopped[0] if stopped else (
                             "step cap reached" if len(history.loss) >= sft.steps else
                             "time cap reached before the curve was flat"),
                         "reached": bool(stopped)}
    record["total_seconds"] = time.monotonic() - t0
    model.float()
    record["weights_fingerprint"] = weights_fingerprint(model)
    with torch.no_grad():
        policy.save(out_dir)
    record["files"] = tree_hashes(out_dir)
    (out_dir / MANIFEST_FILE).write_text(json.dumps(record, indent=1) + "\n")
    return record
