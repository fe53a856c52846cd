"""Build the embedded default model: oracle episodes -> tokenizer -> tiny Qwen2 -> warm start.

Run by `training/scripts/build_default_model.py`, and by `train_grpo.py` when the embedded model
is asked for and missing. The oracle episodes run through the real environment (real MCP server),
so the warm start teaches exactly the turn format, tool names and observations the policy meets.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from skyrl_tool_agent.data.tasks import Task
from skyrl_tool_agent.env.chat_format import render_conversation
from skyrl_tool_agent.env.pools import EnvRuntime
from skyrl_tool_agent.eval.greedy import greedy_evaluation
from skyrl_tool_agent.policy.embedded import new_tiny_qwen2, train_tokenizer
from skyrl_tool_agent.policy.manifest import MANIFEST_FILE, tree_hashes
from skyrl_tool_agent.policy.qwen import QwenPolicy
from skyrl_tool_agent.rollout.agents import make_agent
from skyrl_tool_agent.rollout.collector import CollectorSettings, TrajectoryCollector
from skyrl_tool_agent.warmstart.redraw import redraw_constants
from skyrl_tool_agent.warmstart.sft import SFTSettings, conversation_to_ids, supervised_finetune

logger = logging.getLogger(__name__)


def oracle_conversations(runtime: EnvRuntime, tasks: Sequence[Task], settings: CollectorSettings) -> list[list[dict]]:
    """Finished oracle conversations (text) for `tasks`, through the real env; unsolved ones dropped."""
    return list(oracle_episodes(runtime, tasks, settings).values())


def oracle_episodes(runtime: EnvRuntime, tasks: Sequence[Task], settings: CollectorSettings) -> dict[str, list[dict]]:
    """`oracle_conversations` by task id (in task order), from one collector call."""
    collector = TrajectoryCollector(runtime, make_agent("oracle"), settings=settings)
    trajectories = asyncio.run(collector.collect(tasks, 1))
    solved = {t.task_id: t.messages for t in trajectories if t.result.solved}
    if len(solved) < len(trajectories):
        logger.warning("oracle solved %d of %d warm-start tasks", len(solved), len(trajectories))
    return solved


def validation_figures(policy: QwenPolicy, runtime: EnvRuntime, tasks: Sequence[Task], settings: CollectorSettings,
                       *extra: str) -> dict[str, Any]:
    """A build's validation point: greedy execution accuracy, format rate and turns on held-out
    `tasks`, and the `extra` figures of the evaluation's record."""
    figures = greedy_evaluation(policy, runtime, tasks, settings).record
    return {k: figures[k] for k in ("execution_accuracy", "format_ok_rate", "mean_turns", *extra) if k in figures}


class RedrawnEpochs:
    """The examples of each epoch with constants redrawn: `self(epoch)` redraws every task's stated
    constants (`redraw.redraw_constants`), runs the oracle on them through the real env and
    tokenises the episodes. A task whose draw fails, or lands on one of `held_out_sql` after a
    retry, stays as it is. Seeded by (seed, epoch), so a resumed build rebuilds its epoch exactly."""

    def __init__(self, runtime: EnvRuntime, tasks: Sequence[Task], settings: CollectorSettings, tokenizer: Any, *,
                 seed: int, held_out_sql: set[str], retries: int = 3) -> None:
        self.runtime, self.tasks, self.settings, self.tokenizer = runtime, list(tasks), settings, tokenizer
        self.seed, self.held_out_sql, self.retries = seed, held_out_sql, retries

    def draw(self, epoch: int) -> list[Task]:
        """Every task, its constants redrawn for `epoch` where it can be (class docstring)."""
        rng = random.Random(f"redraw:{self.seed}:{epoch}")
        out = []
        for task in self.tasks:
            db_path = self.runtime.db_root / task.db_id / f"{task.db_id}.sqlite"
            chosen = task
            for _ in range(self.retries):
                redrawn = redraw_constants(task, db_path, rng)
                if redrawn is None:
                    break
                if redrawn.gold_sql not in self.held_out_sql:
                    chosen = redrawn
                    break
            out.append(chosen)
        return out

    def __call__(self, epoch: int) -> list[tuple[list[int], list[int]]]:
        t0 = time.monotonic()
        tasks = self.draw(epoch)
        conversations = oracle_conversations(self.runtime, tasks, self.settings)
        logger.info("epoch %d: %d of %d tasks redrawn, %d oracle episodes in %.0f s", epoch,
                    sum(t.task_id.endswith("~redrawn") for t in tasks), len(tasks), len(conversations),
                    time.monotonic() - t0)
        return [conversation_to_ids(c, self.tokenizer) for c in conversations]


def build_embedded_model(
    out_dir: Path,
    runtime: EnvRuntime,
    train_tasks: Sequence[Task],
    heldout_tasks: Sequence[Task],
    *,
    sft: SFTSettings,
    collector_settings: CollectorSettings,
    eval_settings: CollectorSettings,
    vocab_size: int = 2048,
    device: str = "cpu",
    progress: Callable[[str, float], None] | None = None,
    provenance: dict | None = None,
    redraw_held_out_sql: set[str] | None = None,
) -> dict:
    """Build and save the embedded model into `out_dir` (`save_model_dir`); returns the build report,
    also saved as `warmstart.json` with each file's sha256.
    `collector_settings`: the oracle episodes'; `eval_settings`: the held-out evaluations'.
    `redraw_held_out_sql`: given, every epoch's constants are redrawn (`RedrawnEpochs`)."""
    t0 = time.monotonic()
    report: dict = {**(provenance or {}), "train_tasks": len(train_tasks), "heldout_tasks": len(heldout_tasks)}
    if progress:
        progress("oracle episodes", 0.0)
    conversations = oracle_conversations(runtime, train_tasks, collector_settings)
    if not conversations:
        raise RuntimeError("the oracle solved no warm-start task: check the data and max_turns (the oracle needs 4)")
    report["oracle_seconds"] = time.monotonic() - t0

    if progress:
        progress("tokenizer", 0.0)
    tokenizer = train_tokenizer((render_conversation(c, add_generation_prompt=False) for c in conversations), vocab_size)
    redrawn = None if redraw_held_out_sql is None else RedrawnEpochs(
        runtime, train_tasks, collector_settings, tokenizer, seed=sft.seed, held_out_sql=redraw_held_out_sql)
    examples = redrawn(0) if redrawn else [conversation_to_ids(c, tokenizer) for c in conversations]
    report["redraw_constants"] = redrawn is not None
    lengths = sorted(len(ids) for ids, _ in examples)
    report.update(vocab_size=len(tokenizer), median_tokens=lengths[len(lengths) // 2], max_tokens=lengths[-1])

    # Built on the CPU (same initial weights everywhere), then trained where the policy will run.
    model = new_tiny_qwen2(tokenizer, seed=sft.seed).to(device)
    report["parameters"] = sum(p.numel() for p in model.parameters())
    policy = QwenPolicy(model, tokenizer, mode="full")

    def on_step(step: int, loss: float) -> None:
        if progress:
            progress(f"warm start loss {loss:.3f}", step / sft.steps)

    history = supervised_finetune(
        model, examples, tokenizer.pad_token_id, sft, progress=on_step, epoch_examples=redrawn,
        evaluate=lambda _step: validation_figures(policy, runtime, heldout_tasks, eval_settings))
    report["sft"] = {"settings": asdict(sft), "loss": history.loss, "evals": history.evals, "seconds": history.seconds,
                     "planned_steps": history.planned_steps}
    report["total_seconds"] = time.monotonic() - t0

    save_model_dir(out_dir, policy, report)
    return report


def save_model_dir(out_dir: Path, policy: QwenPolicy, record: dict[str, Any]) -> None:
    """The model and tokenizer saved as `out_dir` with `record` as its manifest, each file's sha256 in
    `record["files"]` (what `verify_manifest` checks before the build is used); written to a
    temporary sibling renamed into place, so a kill leaves the old directory or the new one."""
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}-", dir=out_dir.parent))
    try:
        policy.model.save_pretrained(staging)
        policy.tokenizer.save_pretrained(staging)
        record["files"] = tree_hashes(staging)
        (staging / MANIFEST_FILE).write_text(json.dumps(record, indent=1) + "\n")
        shutil.rmtree(out_dir, ignore_errors=True)
        staging.rename(out_dir)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
