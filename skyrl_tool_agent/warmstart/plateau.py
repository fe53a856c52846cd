"""Continue a warm start on the generated pool until its held-out curve is flat.

GRPO's gain is only RL's when the start has stopped learning from supervision on the questions RL
samples from. `train_to_plateau` continues a built model with the warm start's recipe until the
greedy curve on the pool's validation split is flat (`PlateauRule`), checkpointing after every
evaluation so a later call continues exactly (hours on a CPU).

    skyrl-tool-agent build-model --to-plateau --output-dir DIR [--from MODEL_DIR]   # resumes DIR
"""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from skyrl_tool_agent.config import ModelConfig
from skyrl_tool_agent.eval.metrics import format_rate
from skyrl_tool_agent.data.tasks import Task
from skyrl_tool_agent.env.pools import EnvRuntime
from skyrl_tool_agent.policy.manifest import MANIFEST_FILE
from skyrl_tool_agent.policy.qwen import QwenPolicy
from skyrl_tool_agent.rollout.collector import CollectorSettings
from skyrl_tool_agent.warmstart.build import RedrawnEpochs, oracle_conversations, save_model_dir, validation_figures
from skyrl_tool_agent.warmstart.sft import SFTHistory, SFTSettings, conversation_to_ids, supervised_finetune

logger = logging.getLogger(__name__)

#: Inside the output directory: the resumable checkpoint, and the finished model.
CHECKPOINT_DIR = "checkpoint"
MODEL_DIR = "model"
STATE_FILE = "sft_state.pt"


@dataclass(frozen=True)
class PlateauRule:
    """When a supervised curve counts as flat: the last `tail_fraction` of its steps added less
    than `min_gain` held-out execution accuracy. Each end of that comparison is the mean of
    `smooth` consecutive evaluations (one evaluation on 256 tasks moves by ~2 points from noise
    alone), and no curve is flat before `min_steps`."""

    tail_fraction: float = 0.2
    min_gain: float = 0.01
    smooth: int = 2
    min_steps: int = 1500


def tail_gain(evals: Sequence[dict[str, Any]], rule: PlateauRule) -> float | None:
    """Execution accuracy added over the last `rule.tail_fraction` of the steps of `evals` (each end
    the mean of `smooth` evaluations); None while there are too few evaluations."""
    evals = [e for e in evals if e["execution_accuracy"] is not None]  # unscored evaluations: no point
    if not evals:
        return None
    last = evals[-1]["step"]
    cut = (1 - rule.tail_fraction) * last
    early = [i for i, e in enumerate(evals) if e["step"] <= cut]
    if not early or early[-1] + 1 < rule.smooth or len(evals) - early[-1] - 1 < rule.smooth:
        return None  # both windows need `smooth` evaluations, and they must not overlap

    def mean(rows: Sequence[dict[str, Any]]) -> float:
        return sum(r["execution_accuracy"] for r in rows) / len(rows)

    end = early[-1] + 1
    return mean(evals[-rule.smooth:]) - mean(evals[end - rule.smooth:end])


def plateau_reached(evals: Sequence[dict[str, Any]], rule: PlateauRule) -> bool:
    """Whether the curve `evals` is flat by `rule` (see `tail_gain`)."""
    gain = tail_gain(evals, rule)
    return gain is not None and evals[-1]["step"] >= rule.min_steps and gain < rule.min_gain


def stop_reason(evals: Sequence[dict[str, Any]], rule: PlateauRule, max_steps: int | None) -> str | None:
    """Why the build stops after the last of `evals`, or None while it goes on: a flat curve by
    `rule`, else `max_steps` reached."""
    if plateau_reached(evals, rule):
        return (f"plateau: the last {100 * rule.tail_fraction:.0f}% of steps added "
                f"{100 * tail_gain(evals, rule):+.1f} points (< {100 * rule.min_gain:.1f})")
    if evals and max_steps is not None and evals[-1]["step"] >= max_steps:
        return f"max_steps {max_steps} reached before the plateau"
    return None


def continuation_settings(seed: int, **overrides: Any) -> SFTSettings:
    """The warm start's recipe continued at its cosine schedule's tail rate (a tenth of the peak),
    no warmup, effectively constant (a million planned steps); the SFT arm and the plateau build
    share it."""
    base = SFTSettings()
    settings = SFTSettings(steps=10**6, warmup_steps=0, seed=seed, time_budget_minutes=None, eval_every=10**9,
                           learning_rate=base.learning_rate * 0.1)
    for key, value in overrides.items():
        setattr(settings, key, value)
    return settings


def _save_checkpoint(ckpt: Path, policy: QwenPolicy, state: dict[str, Any]) -> None:
    """Weights + tokenizer + the SFT state, written to a sibling and renamed into place, so a
    kill at any moment leaves the previous checkpoint or the new one, never half of one."""
    staging = Path(tempfile.mkdtemp(prefix=f".{ckpt.name}-", dir=ckpt.parent))
    try:
        policy.model.save_pretrained(staging)
        policy.tokenizer.save_pretrained(staging)
        torch.save(state, staging / STATE_FILE)
        old = ckpt.with_name(ckpt.name + ".old")
        shutil.rmtree(old, ignore_errors=True)
        if ckpt.exists():
            ckpt.rename(old)
        staging.rename(ckpt)
        shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _latest_checkpoint(out_dir: Path) -> Path | None:
    for name in (CHECKPOINT_DIR, CHECKPOINT_DIR + ".old"):  # .old: killed between the two renames
        if (out_dir / name / STATE_FILE).is_file():
            return out_dir / name
    return None


def train_to_plateau(
    start_dir: Path,
    out_dir: Path,
    runtime: EnvRuntime,
    train_tasks: Sequence[Task],
    heldout_tasks: Sequence[Task],
    *,
    sft: SFTSettings,
    rule: PlateauRule,
    oracle_settings: CollectorSettings,
    eval_settings: CollectorSettings,
    max_steps: int | None = None,
    device: str = "cpu",
    provenance: dict[str, Any] | None = None,
    progress: Callable[[int, float], None] | None = None,
    redraw_held_out_sql: set[str] | None = None,
) -> dict[str, Any]:
    """Continue the model in `start_dir` on oracle episodes of `train_tasks` until its greedy curve
    on `heldout_tasks` is flat by `rule` (or `max_steps`), resuming from `out_dir/checkpoint`.
    Writes `out_dir/model` with `warmstart.json` and returns that record. `redraw_held_out_sql`:
    given, each epoch's constants are redrawn (`RedrawnEpochs`)."""
    resume_from = _latest_checkpoint(out_dir)
    # The start is checked against its manifest; a checkpoint is a plain local model directory.
    source = (ModelConfig(name_or_path=str(resume_from), device=device) if resume_from
              else ModelConfig(embedded_dir=str(start_dir), device=device))
    policy = QwenPolicy.from_config(source, mode="full")
    policy.model.float()
    resume = torch.load(resume_from / STATE_FILE, weights_only=True) if resume_from else None
    if resume is not None:
        logger.info("plateau build: resuming from %s at step %d (%d evaluations so far)",
                    resume_from, resume["step"], len(resume["history"]["evals"]))

    # A checkpoint whose curve already ended the build (resumed after its last evaluation): no training.
    stopped = [reason] if resume is not None and (reason := stop_reason(resume["history"]["evals"], rule, max_steps)) else []
    t0 = time.monotonic()
    redrawn = None if redraw_held_out_sql is None else RedrawnEpochs(
        runtime, train_tasks, oracle_settings, policy.tokenizer, seed=sft.seed, held_out_sql=redraw_held_out_sql)
    if stopped:
        examples = []
    elif redrawn is not None:
        examples = redrawn(0)
    else:
        examples = [conversation_to_ids(c, policy.tokenizer) for c in oracle_conversations(runtime, train_tasks,
                                                                                           oracle_settings)]
    logger.info("plateau build: %d oracle episodes of %d pool tasks in %.0f s; %d held-out tasks",
                len(examples), len(train_tasks), time.monotonic() - t0, len(heldout_tasks))

    out_dir.mkdir(parents=True, exist_ok=True)

    def after_eval(history: SFTHistory, state: Callable[[], dict[str, Any]]) -> bool:
        _save_checkpoint(out_dir / CHECKPOINT_DIR, policy, state())
        gain = tail_gain(history.evals, rule)
        logger.info("plateau build step %d: held-out EX %s, last %.0f%% of steps added %s", history.evals[-1]["step"],
                    format_rate(history.evals[-1]["execution_accuracy"], history.evals[-1]), 100 * rule.tail_fraction,
                    "n/a" if gain is None else f"{100 * gain:+.1f} points")
        reason = stop_reason(history.evals, rule, max_steps)
        stopped.extend([reason] if reason else [])
        return reason is not None

    if stopped:
        history = SFTHistory(loss=[tuple(x) for x in resume["history"]["loss"]], evals=resume["history"]["evals"],
                             seconds=resume["history"]["seconds"])
    else:
        history = supervised_finetune(
            policy.model, examples, policy.tokenizer.pad_token_id, sft, progress=progress, resume=resume,
            evaluate=lambda _step: validation_figures(policy, runtime, heldout_tasks, eval_settings, "solved"),
            after_eval=after_eval, epoch_examples=redrawn)

    record: dict[str, Any] = {**(provenance or {})}
    start_manifest = start_dir / MANIFEST_FILE
    if start_manifest.is_file():
        base = json.loads(start_manifest.read_text())
        record["start"] = {k: base[k] for k in ("command", "train_tasks", "parameters", "vocab_size") if k in base}
        record["start"]["sft_steps"] = len(base.get("sft", {}).get("loss", []))
    record.update(train_tasks=len(train_tasks), oracle_episodes=len(examples), heldout_tasks=len(heldout_tasks),
                  redraw_constants=redrawn is not None,
                  vocab_size=len(policy.tokenizer), parameters=sum(p.numel() for p in policy.model.parameters()))
    record["sft"] = {"settings": asdict(sft), "loss": history.loss,
                     "evals": [{k: v for k, v in e.items() if k != "solved"} for e in history.evals],
                     "seconds": history.seconds, "planned_steps": len(history.loss)}
    record["plateau"] = {"rule": asdict(rule), "tail_gain": tail_gain(history.evals, rule),
                         "stopped": stopped[0] if stopped else "schedule ended"}
    model_dir = out_dir / MODEL_DIR
    save_model_dir(model_dir, policy, record)
    logger.info("plateau build: %s; model in %s", record["plateau"]["stopped"], model_dir)
    return record

