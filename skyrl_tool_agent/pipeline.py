"""The main job, as library functions the scripts call: data, embedded model, training run.

`train_grpo.py` parses arguments and calls `run_training`; tests call the same functions.
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from skyrl_tool_agent.config import Config, UserInputError
from skyrl_tool_agent.data.batching import TaskBatcher, fixed_subset
from skyrl_tool_agent.data.curriculum import CurriculumSampler
from skyrl_tool_agent.data.loader import TaskDataLoader
from skyrl_tool_agent.data.tasks import Task, load_tasks

logger = logging.getLogger(__name__)


def load_task_splits(config: Config) -> tuple[list[Task], list[Task], Path]:
    """(train tasks, dev tasks, db root) for `training.data`; missing files are user errors."""
    data = config.training.data
    db_root = data.resolved_db_root()
    if not db_root.is_dir():
        raise UserInputError(f"database root not found: {db_root} (training.data.db_root)")
    if data.dataset == "spider":
        from skyrl_tool_agent.data.spider import load_spider

        root = Path(data.spider_root).expanduser()
        if not (root / "dev.json").is_file():
            raise UserInputError(f"Spider not found at {root} (training.data.spider_root)")
        return load_spider(root, "train").tasks, load_spider(root, "dev").tasks, db_root
    train_file, dev_file = data.resolved_train_file(), data.resolved_dev_file()
    for path, knob in ((train_file, "train_file"), (dev_file, "dev_file")):
        if not path.is_file():
            raise UserInputError(f"task file not found: {path} (training.data.{knob}); "
                                 "run `python training/scripts/build_data.py`")
    try:
        return load_tasks(train_file), load_tasks(dev_file), db_root
    except ValueError as exc:
        raise UserInputError(str(exc)) from exc


def rl_train_tasks(config: Config, train_tasks: list[Task], dev_tasks: list[Task], db_root: Path) -> list[Task]:
    """The tasks GRPO samples (`training.data.train_pool`): the training file's, or the generated
    pool of every built-in slot assignment not in dev."""
    if config.training.data.train_pool == "file":
        return train_tasks
    from skyrl_tool_agent.data.builtin.pool import generated_train_pool

    try:
        return generated_train_pool(db_root, held_out=dev_tasks)
    except (FileNotFoundError, ValueError) as exc:
        raise UserInputError(f"{exc} (training.data.train_pool: generated)") from exc


def build_loader(config: Config, train_tasks: list[Task]) -> TaskDataLoader:
    g, t = config.grpo, config.training
    c = g.curriculum
    sampler = CurriculumSampler(
        c.mode,
        start_mix=c.start.model_dump(),
        end_mix=c.end.model_dump(),
        fixed_mix=c.fixed.model_dump() if c.fixed else None,
        high=c.adaptive_high,
        low=c.adaptive_low,
        min_attempts=c.adaptive_min_attempts,
        min_weight=c.adaptive_min_weight,
        ema_alpha=c.adaptive_ema_alpha,
    )
    if g.batcher.enabled:
        batcher = TaskBatcher(target_turns=g.batcher.target_turns, max_batch=min(g.batcher.max_batch, t.tasks_per_step))
    else:
        batcher = TaskBatcher(target_turns=float("inf"), max_batch=t.tasks_per_step)
    return TaskDataLoader(train_tasks, sampler, batcher, seed=t.seed, total_steps=t.max_steps, group_size=g.group_size)


def build_embedded(config: Config, train_tasks: list[Task], dev_tasks: list[Task], db_root: Path, *,
                   out: Path | None = None, force: bool = False, sft_steps: int | None = None,
                   eval_every: int | None = None, progress: Any = None) -> dict[str, Any]:
    """Build the embedded default model into `out` (default: its cache dir); returns the build report.

    Held-out figures during the warm start use a fixed 64-task dev subset drawn with another seed
    than the GRPO evaluation subset, so the warm start is not tuned on GRPO's yardstick.
    """
    from skyrl_tool_agent.env.pools import EnvRuntime
    from skyrl_tool_agent.policy.loading import resolve_device
    from skyrl_tool_agent.rollout.collector import CollectorSettings
    from skyrl_tool_agent.warmstart.build import build_embedded_model
    from skyrl_tool_agent.warmstart.sft import SFTSettings

    out = out or config.model.resolved_embedded_dir()
    if (out / "config.json").is_file() and not force:
        return json.loads((out / "warmstart.json").read_text()) if (out / "warmstart.json").is_file() else {}
    shutil.rmtree(out, ignore_errors=True)
    sft = SFTSettings()
    if sft_steps is not None:  # an explicit step count is run in full, however long it takes
        sft.steps, sft.time_budget_minutes = sft_steps, None
    if eval_every is not None:
        sft.eval_every = eval_every
    logger.info("building the embedded default model into %s", out)
    g = config.grpo
    settings = CollectorSettings(max_turns=max(g.max_turns, 4), max_new_tokens_per_turn=g.max_new_tokens_per_turn,
                                 max_total_tokens=g.max_total_tokens, concurrency=64, max_batch=64)
    runtime = EnvRuntime(config.env, db_root)
    try:
        return build_embedded_model(out, runtime, train_tasks, fixed_subset(dev_tasks, 64, seed=config.training.seed + 1),
                                    sft=sft, collector_settings=settings, device=str(resolve_device(config.model.device)),
                                    progress=progress)
    finally:
        runtime.close()


def ensure_embedded_model(config: Config, train_tasks: list[Task], dev_tasks: list[Task], db_root: Path,
                          progress: Any = None) -> None:
    """Build the embedded default model if it is asked for and missing (first run only)."""
    if config.model.is_embedded():
        build_embedded(config, train_tasks, dev_tasks, db_root, progress=progress)


@dataclass
class RunSummary:
    before: dict[str, float]
    after: dict[str, float]
    steps: int
    seconds: float
    output_dir: Path
    history: list[dict[str, Any]] = field(default_factory=list)


def run_training(config: Config, *, resume: str | None = None, progress: Any = None) -> RunSummary:
    """Train with GRPO as configured; evaluates the fixed dev subset before and after.

    Writes into `training.output_dir`: metrics.jsonl, checkpoints/, final/ (save_pretrained),
    before_after.json, config.yaml (resolved) and training_curves.png.
    """
    from skyrl_tool_agent.env.pools import EnvRuntime
    from skyrl_tool_agent.eval.plots import plot_training_curves
    from skyrl_tool_agent.grpo.run_logging import RunLogger
    from skyrl_tool_agent.grpo.trainer import GRPOTrainer
    from skyrl_tool_agent.policy.qwen import QwenPolicy

    t = config.training
    out = Path(t.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    train_tasks, dev_tasks, db_root = load_task_splits(config)
    ensure_embedded_model(config, train_tasks, dev_tasks, db_root, progress=progress)
    train_tasks = rl_train_tasks(config, train_tasks, dev_tasks, db_root)
    (out / "config.yaml").write_text(config.dump_yaml())
    start = time.monotonic()
    deadline = start + 60 * t.time_budget_minutes if t.time_budget_minutes else None
    runtime = EnvRuntime(config.env, db_root)
    try:
        policy = QwenPolicy.from_config(config.model, mode=t.mode)
        loader = build_loader(config, train_tasks)
        eval_tasks = fixed_subset(dev_tasks, t.eval_num_tasks, seed=t.seed)
        trainer = GRPOTrainer(config, policy, runtime, loader, eval_tasks, output_dir=out)
        resumed = trainer.resume(resume)
        run_logger = RunLogger(out, wandb_config=t.wandb, run_config=config.to_dict())
        before_path = out / "before.json"
        if resumed and before_path.is_file():
            before = json.loads(before_path.read_text())
            run_logger.truncate_after(trainer.step)
        else:
            before = trainer.evaluate()
            before_path.write_text(json.dumps(before, indent=1) + "\n")
            run_logger.truncate_after(0)
            run_logger.log({"step": 0, "eval/execution_accuracy": before["execution_accuracy"],
                            "eval/reward_mean": before["reward_mean"], "eval/format_ok_rate": before["format_ok_rate"]})
        history = trainer.train(run_logger, on_step=progress and (lambda m: progress("step", m)), deadline=deadline)
        after = trainer.evaluate() if not history or "eval/execution_accuracy" not in history[-1] else {
            "execution_accuracy": history[-1]["eval/execution_accuracy"], "reward_mean": history[-1]["eval/reward_mean"],
            "format_ok_rate": history[-1]["eval/format_ok_rate"]}
        policy.save(out / "final")
        run_logger.finish()
    finally:
        runtime.close()
    (out / "before_after.json").write_text(json.dumps({"before": before, "after": after, "steps": trainer.step}, indent=1) + "\n")
    plot_training_curves(out / "metrics.jsonl", out / "training_curves.png")
    return RunSummary(before, after, trainer.step, time.monotonic() - start, out, history)


def continue_warm_start(config: Config, minutes: float, *, progress: Any = None) -> dict[str, Any]:
    """The supervised baseline for GRPO's gain: continue the embedded model's warm start (same
    recipe, on the tasks GRPO samples: `training.data.train_pool`) for `minutes` of wall time, then
    evaluate greedy on GRPO's fixed dev subset."""
    from skyrl_tool_agent.env.pools import EnvRuntime
    from skyrl_tool_agent.policy.qwen import QwenPolicy
    from skyrl_tool_agent.rollout.collector import CollectorSettings
    from skyrl_tool_agent.warmstart.build import greedy_eval, oracle_conversations
    from skyrl_tool_agent.warmstart.sft import SFTSettings, conversation_to_ids, supervised_finetune

    train_tasks, dev_tasks, db_root = load_task_splits(config)
    train_tasks = rl_train_tasks(config, train_tasks, dev_tasks, db_root)
    g, t = config.grpo, config.training
    settings = CollectorSettings(max_turns=max(g.max_turns, 4), max_new_tokens_per_turn=g.max_new_tokens_per_turn,
                                 max_total_tokens=g.max_total_tokens, concurrency=64, max_batch=64)
    runtime = EnvRuntime(config.env, db_root)
    try:
        policy = QwenPolicy.from_config(config.model, mode="full")
        eval_tasks = fixed_subset(dev_tasks, t.eval_num_tasks, seed=t.seed)
        before = greedy_eval(policy, runtime, eval_tasks, settings)
        conversations = oracle_conversations(runtime, train_tasks, settings)
        examples = [conversation_to_ids(c, policy.tokenizer) for c in conversations]
        sft = SFTSettings(steps=10**6, warmup_steps=0, seed=t.seed + 17, time_budget_minutes=None)
        sft.learning_rate *= 0.1  # the tail of the warm start's cosine schedule
        start = time.monotonic()
        history = supervised_finetune(policy.model, examples, policy.tokenizer.pad_token_id, sft,
                                      deadline=start + 60 * minutes, progress=progress)
        after = greedy_eval(policy, runtime, eval_tasks, settings)
    finally:
        runtime.close()
    return {"minutes": minutes, "steps": len(history.loss), "before": before, "after": after}
