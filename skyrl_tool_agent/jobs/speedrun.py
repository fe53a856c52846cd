"""The speedrun: from nothing to a GRPO-trained SQL agent within one wall-clock budget, with the
arm RL must beat beside it (`skyrl-tool-agent speedrun --minutes M --output-dir DIR`).

Phases (README's speedrun section), each timed and failing soft, `speedrun.json` rewritten as each
ends: **build** (`warmstart.scratch`; the RL pool held out of its data, `hold_out_rl_pool`, so GRPO
trains on questions the start never saw answered), **start** (its evaluation sizes the later ones),
**grpo** (`jobs.arms.GRPOCurve`), **sft** (`jobs.arms.continue_warm_start`, on the RL pool's oracle
episodes, for GRPO's training time) and **report**. Only flat files go into the output directory;
models, checkpoints and run directories go to the work directory.
"""

from __future__ import annotations

import contextlib
import copy
import json
import logging
import os
import resource
import shutil
import time
import traceback
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from statistics import mean
from typing import Any

from skyrl_tool_agent.config import SHIPPED_EMBEDDED_DIR, Config, ModelConfig, UserInputError
from skyrl_tool_agent.eval.anatomy import anatomy_deltas
from skyrl_tool_agent.eval.stats import paired_delta
from skyrl_tool_agent.jobs.arms import GRPOCurve, continue_warm_start
from skyrl_tool_agent.jobs.budget import JobBudget
from skyrl_tool_agent.jobs.build_model import oracle_collector_settings
from skyrl_tool_agent.jobs.progress import log_every
from skyrl_tool_agent.jobs.run import open_run
from skyrl_tool_agent.jobs.speedrun_plan import (
    CURVES_FILE,
    EVAL_SLACK,
    GPU_BUILD_STEPS,
    METRICS_FILE,
    RESULT_FILE,
    TABLE_FILE,
    SpeedrunPlan,
    arm_seconds,
    hold_out_rl_pool,
)
from skyrl_tool_agent.reports.atomic import write_text_atomically
from skyrl_tool_agent.reports.speedrun import markdown_tables, per_task_samples, plot_speedrun, throughput

logger = logging.getLogger(__name__)

class Speedrun:
    """One run (module docstring). `started` is the monotonic time the budget counts from."""

    def __init__(self, config: Config, plan: SpeedrunPlan, output_dir: Path, work_dir: Path, *,
                 started: float, command: str = "") -> None:
        plan.check()
        self.config, self.plan = config, plan
        self.output_dir, self.work_dir = output_dir, work_dir
        self.budget = JobBudget(60 * plan.minutes, None, started=started)  # the main job's budget, on its clock
        self.started, self.end = started, started + self.budget.total_s
        self.record: dict[str, Any] = {
            "command": command, "plan": {**asdict(plan), "margin_s": plan.margin},
            "size_chosen_by": "flags (the defaults were not chosen by a measurement on validation)",
            "phases": {}, "config": config.to_dict()}
        self.examples: list[tuple[list[int], list[int]]] = []  # the build's oracle episodes
        self.rl_examples: list[tuple[list[int], list[int]]] = []  # the RL pool's (the SFT arm trains on them)
        self.start_dir = work_dir / "start"
        self.start_eval: dict[str, Any] | None = None
        self.eval_s = 0.0
        self.arm_setup_s = 0.0  # loading a model and starting the MCP servers (measured on the GRPO arm)

    # ------------------------------------------------------------------ bookkeeping
    def write(self) -> None:
        """speedrun.json, replaced whole (a kill leaves the previous one or the new one)."""
        import torch

        self.record["elapsed_s"] = self.budget.spent_s()
        self.record["peak_rss_gib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            self.record["peak_gpu_gib"] = torch.cuda.max_memory_allocated() / 2**20 / 1024
        write_text_atomically(self.output_dir / RESULT_FILE, json.dumps(self.record, indent=1, default=str) + "\n")

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[dict[str, Any]]:
        """Time a phase, record its status; an error is logged and recorded, never raised (a
        signal that stopped GRPO is re-raised after the record is written)."""
        from skyrl_tool_agent.grpo.interrupts import TrainingInterrupted

        entry: dict[str, Any] = {"status": "running", "started_s": self.budget.spent_s()}
        self.record["phases"][name] = entry
        logger.info("speedrun %s: starting at %.0f of %.0f s", name, self.budget.spent_s(), 60 * self.plan.minutes)
        t0 = time.monotonic()
        try:
            yield entry
            entry["status"] = entry.get("status_override", "ok")
            entry.pop("status_override", None)
        except TrainingInterrupted as exc:
            entry.update(status="interrupted", error=str(exc))
            raise
        except UserInputError as exc:
            entry.update(status="failed", error=str(exc))
            if name == "setup":  # a bad input: the command's one error line, exit 2
                raise
            logger.error("speedrun %s failed: %s", name, exc)
        except Exception as exc:  # noqa: BLE001 - fail soft: the phases before keep their results
            logger.error("speedrun %s failed: %s: %s\n%s", name, type(exc).__name__, exc, traceback.format_exc())
            entry.update(status="failed", error=f"{type(exc).__name__}: {exc}")
        finally:
            entry["seconds"] = time.monotonic() - t0
            logger.info("speedrun %s: %s in %.1f s (%.0f s left)", name, entry["status"], entry["seconds"],
                        self.budget.left_s())
            self.write()

    def arm_config(self) -> Config:
        """The run's config with the built start as the model."""
        config = copy.deepcopy(self.config)
        config.model.name_or_path = str(self.start_dir)
        return config

    # ------------------------------------------------------------------ phases
    def run(self) -> dict[str, Any]:
        self.output_dir.mkdir(parents=True, exist_ok=True)
        self.work_dir.mkdir(parents=True, exist_ok=True)
        with self.phase("setup") as entry:
            self.setup(entry)
        if self.record["phases"]["setup"]["status"] != "ok":
            return self.record
        with self.phase("build") as entry:
            self.build(entry)
        if not (self.start_dir / "config.json").is_file():
            return self.record
        with contextlib.ExitStack() as grpo_arm:  # the GRPO arm's model and servers, closed on every path
            with self.phase("start") as entry:
                self.evaluate_start(entry, grpo_arm)
            if self.start_eval is None:
                return self.record
            points, each_s = self.plan_arms()
            grpo_s = None
            if each_s > 0:
                with self.phase("grpo") as entry:
                    grpo_s = self.grpo(entry, points, each_s)
        if each_s > 0:  # after the GRPO arm let go of its model and servers
            with self.phase("sft") as entry:
                self.sft(entry, points, grpo_s if grpo_s is not None else each_s)
        with self.phase("report") as entry:
            self.report(entry)
        return self.record

    def setup(self, entry: dict[str, Any]) -> None:
        import torch

        from skyrl_tool_agent.data.batching import fixed_subset
        from skyrl_tool_agent.eval.splits import TaskSplits
        from skyrl_tool_agent.policy.device import resolve_device
        from skyrl_tool_agent.policy.loading import load_tokenizer

        if self.config.training.data.dataset != "builtin":
            raise UserInputError("the speedrun needs the builtin dataset (its generated pool)")
        self.device = resolve_device(self.config.model.device)
        if self.device.type == "cuda":
            # fp32 master weights, TF32 matmuls: the precision bf16 autocast would lose, at bf16-like speed.
            torch.set_float32_matmul_precision("high")
        entry["device"] = torch.cuda.get_device_name(self.device) if self.device.type == "cuda" else str(self.device)
        entry["cpu_cores"] = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
        entry["torch"] = torch.__version__
        self.splits = TaskSplits.load(self.config)
        pool, validation = self.splits.pool_and_validation()
        seed = self.config.training.seed
        self.pool = pool if self.plan.pool_tasks is None else fixed_subset(pool, self.plan.pool_tasks, seed=seed)
        self.validation = validation[: self.plan.validation_tasks or len(validation)]
        self.build_pool, self.rl_pool = hold_out_rl_pool(self.pool, self.plan.rl_pool_tasks, seed=seed)
        self.tokenizer = load_tokenizer(str(SHIPPED_EMBEDDED_DIR), ModelConfig())
        entry.update(pool_tasks=len(self.pool), validation_tasks=len(self.validation),
                     dev_tasks=len(self.splits.run_eval()), vocab_size=len(self.tokenizer))

    def build(self, entry: dict[str, Any]) -> None:
        from skyrl_tool_agent.rollout.collector import CollectorSettings
        from skyrl_tool_agent.warmstart.build import oracle_episodes
        from skyrl_tool_agent.warmstart.scratch import build_from_scratch
        from skyrl_tool_agent.warmstart.sft import SFTSettings, conversation_to_ids

        deadline = self.started + self.plan.build_share * 60 * self.plan.minutes
        with open_run(self.config, self.splits.db_root) as run:
            runtime = run.runtime
            t0 = time.monotonic()
            episodes = oracle_episodes(runtime, [*self.build_pool, *self.rl_pool], oracle_collector_settings(self.config))
            self.examples = [conversation_to_ids(episodes[t.task_id], self.tokenizer) for t in self.build_pool
                             if t.task_id in episodes]
            self.rl_examples = [conversation_to_ids(episodes[t.task_id], self.tokenizer) for t in self.rl_pool
                                if t.task_id in episodes]
            entry.update(oracle_s=time.monotonic() - t0, build_pool_tasks=len(self.build_pool),
                         rl_pool_tasks=len(self.rl_pool), rl_pool_task_ids=[t.task_id for t in self.rl_pool])
            logger.info("speedrun build: %d oracle episodes of %d build pool tasks (+%d of the %d held-out RL tasks) "
                        "in %.1f s", len(self.examples), len(self.build_pool), len(self.rl_examples),
                        len(self.rl_pool), entry["oracle_s"])
            steps = self.plan.build_steps or (GPU_BUILD_STEPS if self.device.type == "cuda" else None)
            # No time budget: a fixed schedule of `steps` (the build's deadline only guards); else fitted to the time.
            sft = SFTSettings(steps=steps or 10**6, batch_size=self.plan.sft_batch_size, seed=self.config.training.seed,
                              time_budget_minutes=None if steps else SFTSettings.time_budget_minutes)
            log_due = log_every()

            def on_step(step: int, loss: float) -> None:
                if log_due():
                    logger.info("build: supervised step %d, loss %.4f, %.0f s left in the build", step, loss,
                                deadline - time.monotonic())

            built = build_from_scratch(
                self.start_dir, self.tokenizer, self.examples, runtime, self.validation, shape=self.plan.shape,
                sft=sft, eval_settings=CollectorSettings.from_config(self.config, evaluation=True),
                deadline=deadline, evaluations=self.plan.build_evaluations, device=str(self.device),
                progress=on_step, provenance={"command": self.record["command"]})
        loss = built["sft"]["loss"]
        size_mb = sum((self.start_dir / f).stat().st_size for f in built["files"]) / 1e6
        self.record["build"] = {
            "parameters": built["parameters"], "shape": built["shape"], "fp32_mb": size_mb,
            "bf16_mb_estimate": 2 * built["parameters"] / 1e6, "oracle_episodes": len(self.examples),
            "steps": built["sft"]["steps"], "planned_steps": built["sft"]["planned_steps"],
            "fixed_steps": built["sft"]["fixed_steps"], "rl_pool_examples": len(self.rl_examples),
            "train_seconds": built["sft"]["seconds"], "batch_size": sft.batch_size,
            "steps_per_s": built["sft"]["steps"] / max(built["sft"]["seconds"], 1e-9),
            "loss_first": loss[0][1] if loss else None, "loss_last": loss[-1][1] if loss else None,
            "loss_curve": loss[:: max(1, len(loss) // 50)],
            "validation_curve": built["sft"]["evals"], "plateau": built["plateau"], "model_dir": str(self.start_dir),
            "weights_fingerprint": built["weights_fingerprint"]}

    def evaluate_start(self, entry: dict[str, Any], arm: contextlib.ExitStack) -> None:
        """Starts the GRPO arm (its trainer evaluates the start, as the main job does)."""
        t0 = time.monotonic()
        self.grpo_arm = arm.enter_context(GRPOCurve(self.arm_config(), self.work_dir / "grpo", splits=self.splits,
                                                    pool=self.rl_pool))
        self.arm_setup_s = time.monotonic() - t0
        due = log_every(10.0)

        def eval_line(done: int, total: int) -> None:  # evaluations of every dev task take a while
            if due() or done == total:
                logger.info("dev evaluation: %d of %d episodes, %.0f s left in the budget", done, total,
                            self.budget.left_s())

        self.grpo_arm.trainer.eval_progress = eval_line
        t0 = time.monotonic()
        self.start_eval = self.grpo_arm.evaluate_start()
        self.eval_s = time.monotonic() - t0
        self.record["start"] = self.start_eval
        entry.update(eval_s=self.eval_s, arm_setup_s=self.arm_setup_s)
        self.check_start_weights("grpo", self.grpo_arm.start_weights)
        entry["sampler"] = self.grpo_arm.trainer.policy.sampler()

    def check_start_weights(self, arm: str, fingerprint: str) -> None:
        """Record whether an arm starts from the built weights (the comparison means nothing otherwise)."""
        same = fingerprint == (self.record.get("build") or {}).get("weights_fingerprint")
        self.record.setdefault("arms_start_from_build", {})[arm] = same
        if not same:
            logger.error("speedrun: the %s arm does not start from the built model's weights", arm)

    def plan_arms(self) -> tuple[int, float]:
        """(points, training seconds per arm) from the time left and the start evaluation's duration."""
        points = self.plan.points

        def each_for(points: int) -> float:
            return arm_seconds(self.budget.left_s(), self.eval_s, points, self.plan.margin, self.arm_setup_s)

        each = each_for(points)
        while points > 1 and each / points < self.eval_s:  # a segment shorter than an evaluation: fewer points
            points -= 1
            each = each_for(points)
        self.record["arms_plan"] = {"points": points, "training_s_each": each, "eval_s": self.eval_s,
                                    "remaining_s": self.budget.left_s()}
        if each <= 0:
            self.record["arms_plan"]["skipped"] = "no time left for the arms after the start's evaluation"
            logger.warning("speedrun: no time left for GRPO and SFT (%.0f s left, an evaluation takes %.0f s)",
                           self.budget.left_s(), self.eval_s)
        else:
            logger.info("speedrun: %.0f s of training per arm, %d dev evaluation(s) each (~%.0f s)", each, points,
                        self.eval_s)
        return points, each

    def grpo(self, entry: dict[str, Any], points: int, each_s: float) -> float | None:
        """GRPO for `each_s` seconds of training, evaluated at `points` marks; returns its training seconds."""
        arm = self.grpo_arm
        steps: list[dict[str, Any]] = []
        tool_calls = _ToolCallTally(arm.trainer)

        def on_step(m: dict[str, Any]) -> None:
            row = {"step": m["step"], "elapsed_s": m["time/elapsed_s"], "rollout_s": m["time/rollout_s"],
                   "update_s": m["time/update_s"], "generated_tokens": m["policy_tokens"],
                   "generated_tokens_per_s": m["policy_tokens"] / max(m["time/rollout_s"], 1e-9),
                   "turns_per_episode": m["episode/turns_mean"], "tool_calls_per_episode": tool_calls.last,
                   "reward": m["reward/mean"], "train_execution_accuracy": m["train/execution_accuracy"],
                   "groups_dropped": m["train/groups_dropped"], "episodes": m["train/scored"],
                   "gpu_peak_gib": m.get("memory/gpu_peak_gib"), "probe": m.get("probe/execution_accuracy"),
                   "probe_held_out": m.get("probe/held_out_execution_accuracy")}
            steps.append(row)
            logger.info("GRPO step %d: rollout %.1f s, update %.1f s, %.0f generated tokens/s, reward %.3f, "
                        "%.2f turns and %.2f tool calls per episode%s; %.0f s left", row["step"], row["rollout_s"],
                        row["update_s"], row["generated_tokens_per_s"], row["reward"] or 0.0,
                        row["turns_per_episode"] or 0.0, row["tool_calls_per_episode"] or 0.0,
                        "" if row["probe"] is None else f", probe {row['probe']:.3f}", self.budget.left_s())

        result: dict[str, Any] = {"steps": steps, "curve": arm.curve}
        self.record["grpo"] = result
        try:
            for i in range(points):
                point = arm.train_for(each_s * (i + 1) / points, on_step=on_step)
                logger.info("GRPO %.2f min, step %d: dev EX %.3f", point["minutes"], point["step"],
                            point["execution_accuracy"] or 0.0)
                self.write()
                if arm.finished:
                    break
        finally:
            result.update(training_s=arm.trained_s, total_steps=arm.trainer.step,
                          stop_reason=arm.trainer.stop_reason, throughput=throughput(steps),
                          sampler=arm.trainer.policy.sampler())
            metrics = self.work_dir / "grpo" / "metrics.jsonl"
            arm.close()  # its metrics.jsonl is complete
            if metrics.is_file():
                shutil.copyfile(metrics, self.output_dir / METRICS_FILE)
        return arm.trained_s if arm.curve else None

    def sft(self, entry: dict[str, Any], points: int, target_s: float) -> None:
        """Continued supervision from the start for `target_s` seconds (GRPO's), or what is left."""
        evals_s = points * EVAL_SLACK * self.eval_s
        fits = self.budget.left_s() - evals_s - self.arm_setup_s - self.plan.margin / 2
        seconds = min(target_s, fits)
        entry.update(target_s=target_s, training_s=seconds)
        if seconds < target_s:
            entry["short_by_s"] = target_s - seconds
            logger.warning("speedrun sft: %.0f s of the %.0f s GRPO trained fit the budget", seconds, target_s)
        if seconds <= 0:
            entry["status_override"] = "skipped"
            return
        grpo_marks = [p["minutes"] for p in (self.record.get("grpo") or {}).get("curve", [])][:-1]
        marks = tuple(m for m in grpo_marks if m < seconds / 60) or tuple(
            seconds / 60 * (i + 1) / points for i in range(points - 1))
        log_due = log_every()

        def on_step(step: int, loss: float) -> None:
            if log_due():
                logger.info("SFT arm: step %d, loss %.4f, %.0f s left", step, loss, self.budget.left_s())

        result = continue_warm_start(self.arm_config(), seconds / 60, eval_at_minutes=marks, progress=on_step,
                                     examples=self.rl_examples, before=self.start_eval,
                                     deadline=self.end - EVAL_SLACK * self.eval_s - self.plan.margin / 2,
                                     batch_size=self.plan.sft_batch_size, splits=self.splits)
        result.pop("before", None)
        self.check_start_weights("sft", result["start_weights"])
        result["training_s"] = result["curve"][-1]["minutes"] * 60 if result["curve"] else 0.0
        result["steps_per_s"] = result["steps"] / max(result["training_s"], 1e-9)
        self.record["sft"] = result

    def report(self, entry: dict[str, Any]) -> None:
        start = self.record["start"]
        arms = [a for a in ("grpo", "sft") if (self.record.get(a) or {}).get("curve")]
        for arm in arms:
            for point in self.record[arm]["curve"]:
                point["delta"] = paired_delta(start.get("solved"), point.get("solved"))
                point["sampled_delta"] = paired_delta(per_task_samples(start), per_task_samples(point))
        for arm in arms:  # why answers are wrong at the arm's end, against the start
            self.record[arm]["error_anatomy_delta"] = anatomy_deltas(start, self.record[arm]["curve"][-1])
        if len(arms) == 2:
            g, s = self.record["grpo"]["curve"][-1], self.record["sft"]["curve"][-1]
            self.record["grpo_minus_sft"] = {"greedy": paired_delta(s.get("solved"), g.get("solved")),
                                             "avg@k": paired_delta(per_task_samples(s), per_task_samples(g))}
        table = markdown_tables(self.record)
        self.record["table"] = table
        (self.output_dir / TABLE_FILE).write_text(table)
        try:
            plot_speedrun(self.record, self.output_dir / CURVES_FILE)
        except Exception as exc:  # noqa: BLE001 - the tables and JSON stand without the picture
            entry["plot_error"] = f"{type(exc).__name__}: {exc}"
            logger.error("speedrun: the curves could not be drawn: %s", entry["plot_error"])
        logger.info("speedrun tables:\n%s", table)


class _ToolCallTally:
    """Tool calls per episode of the training rollouts (the trainer's metrics count tool errors
    only): wraps `trainer.collect`, whose training calls pass no settings (evaluations and probes
    pass theirs)."""

    def __init__(self, trainer: Any) -> None:
        self.collect, self.last = trainer.collect, None
        trainer.collect = self

    def __call__(self, tasks: Any, group_size: int, params: Any, settings: Any = None,
                 on_episode_done: Any = None) -> Any:
        trajectories = self.collect(tasks, group_size, params, settings, on_episode_done)
        if settings is None and trajectories:
            self.last = mean(t.result.tool_calls for t in trajectories)
        return trajectories
