"""`GRPOTrainer`: rollouts through the MCP environment, group-relative advantages, clipped updates.

One step: a batch of tasks from the curriculum loader, `group_size` episodes per task, group-relative
advantages, the uninformative and infrastructure-failed groups dropped (`decide_episodes`), then a
micro-batched update on the policy tokens only (`_update`); pass rates go back to the curriculum.
Evaluations and checkpoints on cadence.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from statistics import mean, pstdev
from typing import Any

import torch

from skyrl_tool_agent.config import Config
from skyrl_tool_agent.data.loader import TaskDataLoader
from skyrl_tool_agent.data.tasks import Task
from skyrl_tool_agent.env.pools import EnvRuntime
from skyrl_tool_agent.eval.greedy import progress_counter, probe_record, training_evaluation
from skyrl_tool_agent.eval.metrics import eval_metrics, reward_term_means, summarize
from skyrl_tool_agent.grpo.advantages import turn_token_advantages
from skyrl_tool_agent.grpo.batch import EpisodeDecisions, TrainBatch, collate, decide_episodes, on_device, plan_micro_batches
from skyrl_tool_agent.grpo.interrupts import StopOnSignals, TrainingInterrupted
from skyrl_tool_agent.grpo.rollout_log import rollout_records
from skyrl_tool_agent.grpo.checkpoint import latest_checkpoint, load_checkpoint, restore_loader_state, save_checkpoint
from skyrl_tool_agent.grpo.losses import grpo_loss, loss_normalizer
from skyrl_tool_agent.grpo.optimizer import build_optimizer
from skyrl_tool_agent.grpo.run_logging import RunLogger
from skyrl_tool_agent.policy.checkpointing import recompute_activations
from skyrl_tool_agent.kernels.fused_lora import fused_lora
from skyrl_tool_agent.memory.device import device_memory, peak_rss_gib
from skyrl_tool_agent.memory.shape import ModelShape
from skyrl_tool_agent.memory.sizing import plan_for
from skyrl_tool_agent.policy.qwen import QwenPolicy
from skyrl_tool_agent.policy.sampling_params import SamplingParams
from skyrl_tool_agent.policy.weights import base_model, is_sharded, sampling_dtype
from skyrl_tool_agent.rollout.agents import PolicyAgent
from skyrl_tool_agent.rollout.collector import CollectorSettings, TrajectoryCollector
from skyrl_tool_agent.rollout.trajectory import Trajectory

logger = logging.getLogger(__name__)


@dataclass
class StepOutput:
    metrics: dict[str, Any]
    trajectories: list[Trajectory]
    tasks: list[Task] = dataclasses.field(default_factory=list)
    advantages: list[float] = dataclasses.field(default_factory=list)
    kept: list[bool] = dataclasses.field(default_factory=list)


class GRPOTrainer:
    """Trains a `QwenPolicy` with GRPO on tasks from a `TaskDataLoader` through an `EnvRuntime`."""

    def __init__(self, config: Config, policy: QwenPolicy, runtime: EnvRuntime, loader: TaskDataLoader,
                 eval_tasks: Sequence[Task], *, output_dir: Path) -> None:
        self.config = config
        self.policy = policy
        self.runtime = runtime
        self.loader = loader
        self.eval_tasks = list(eval_tasks)
        #: Training tasks, and held-out tasks never trained on, probed every `training.probe_every`
        #: steps (`probe`); set by the job (`jobs.train.set_probes`).
        self.probe_tasks: list[Task] = []
        self.held_out_probe_tasks: list[Task] = []
        self.output_dir = output_dir
        self.checkpoint_dir = output_dir / "checkpoints"
        self.optimizer, self.scheduler = build_optimizer(policy, config)
        # The rollout engine is built once and keeps its cache through every update: the memory plan
        # sizes both together on this device, and the run shows it before its first step.
        self.memory_plan = plan_for(
            config, ModelShape.from_config(base_model(policy.model).config, "the loaded model"),
            device_bytes=device_memory(policy.device).total,
            world=torch.distributed.get_world_size() if torch.distributed.is_initialized() else 1,
            device_kind="cuda" if policy.device.type == "cuda" else "cpu",
            dtype_bytes=sampling_dtype(policy.model).itemsize, zero3=is_sharded(policy.model))
        policy.use_plan(self.memory_plan)
        logger.info("%s", self.memory_plan.describe())
        self.step = 0
        self.last_eval: dict[str, Any] | None = None  # the latest `evaluate()` made by `train`
        self.last_eval_step = 0  # the step after which it was made
        self.last_eval_trajectories: list[Trajectory] = []  # the latest `evaluate()`'s episodes (for report.html)
        self.last_eval_seconds = 0.0  # how long it took (benchmarks keep evaluation off the clock)
        self.stop_reason = ""  # why `train` returned, in words (logged)
        self.train_seconds = 0.0  # time in training steps (rollouts + updates) in this process, evaluations excluded
        # The time budget's clock (`time/elapsed_s`) before this process: a resumed run goes on counting.
        self.prior_elapsed_s = 0.0
        #: Called with (episodes done, total) as an evaluation's episodes finish (progress lines).
        self.eval_progress: Callable[[int, int], None] | None = None
        #: Called at step 0 and after each evaluation or probe before the last step, once its metrics
        #: are logged (the main job rewrites its curves, table and report; signals are caught by then).
        self.after_measurement: Callable[[], None] | None = None
        self._clock_started: float | None = None  # monotonic time at which the clock read 0, while training
        self.collector_settings = CollectorSettings.from_config(config)
        self.sampling = SamplingParams.of(config.grpo)

    # ---------------------------------------------------------------- resume
    def resume(self, path: str | None) -> bool:
        """`path` = a checkpoint dir, 'auto' (latest under output_dir, if any) or None."""
        if path is None:
            return False
        ckpt = latest_checkpoint(self.checkpoint_dir) if path == "auto" else Path(path)
        if ckpt is None:
            logger.info("no checkpoint under %s: starting fresh", self.checkpoint_dir)
            return False
        state = load_checkpoint(ckpt, policy=self.policy, optimizer=self.optimizer, scheduler=self.scheduler)
        self.step = restore_loader_state(ckpt, state, self.loader, self.config.training.max_steps)
        self.prior_elapsed_s = float(state.get("elapsed_s", 0.0))
        logger.info("resumed from %s at step %d (%.1f min of the time budget spent)", ckpt, self.step,
                    self.prior_elapsed_s / 60)
        return True

    def save(self) -> Path:
        return save_checkpoint(
            self.checkpoint_dir, self.step, policy=self.policy, optimizer=self.optimizer, scheduler=self.scheduler,
            trainer_state={"loader": self.loader.state_dict(), "elapsed_s": self.elapsed_s()},
            keep=self.config.training.keep_checkpoints, config_yaml=self.config.dump_yaml(),
        )

    def elapsed_s(self) -> float:
        """The time budget's clock: seconds of GRPO so far, over every process of a resumed run."""
        if self._clock_started is None:
            return self.prior_elapsed_s
        return time.monotonic() - self._clock_started

    def deadline_for(self, budget_s: float | None) -> float | None:
        """The monotonic time at which the budget's clock (`elapsed_s`) reads `budget_s` (None: no
        limit): what `train(deadline=...)` takes, counting what a resumed run already spent."""
        return None if budget_s is None else time.monotonic() + budget_s - self.elapsed_s()

    # ------------------------------------------------------------- rollouts
    def collect(self, tasks: Sequence[Task], group_size: int, params: SamplingParams,
                settings: CollectorSettings | None = None,
                on_episode_done: Callable[[Trajectory], None] | None = None) -> list[Trajectory]:
        """`group_size` episodes per task of the policy through the env, drawn with `params`
        (`settings`: the training ones unless given)."""
        agent = PolicyAgent(self.policy, params)
        collector = TrajectoryCollector(self.runtime, agent, tokenizer=agent.tokenizer,
                                        settings=settings or self.collector_settings)
        return asyncio.run(collector.collect(tasks, group_size, on_episode_done=on_episode_done))

    def evaluate(self) -> dict[str, Any]:
        """The run's evaluation of `eval_tasks` (`eval.greedy.training_evaluation`: greedy with
        `solved` per task, avg@k with `training.eval_samples`), its episodes run by `collect`."""
        episodes = len(self.eval_tasks) * (1 + self.config.training.eval_samples)
        run = training_evaluation(self.policy, self.runtime, self.eval_tasks, self.config, params=self.sampling,
                                  on_episode_done=progress_counter(self.eval_progress, episodes), collect=self.collect)
        self.last_eval_trajectories = run.trajectories
        return run.record

    @property
    def probes(self) -> int:
        """Episodes one probe samples (0: no probe)."""
        return len(self.probe_tasks) + len(self.held_out_probe_tasks)

    def probe(self) -> dict[str, float]:
        """The probe of `probe_tasks` and `held_out_probe_tasks` (`eval.greedy.probe_record`)."""
        return probe_record(self.policy, self.runtime, self.probe_tasks, self.held_out_probe_tasks, self.config,
                            self.sampling, self.collector_settings, collect=self.collect)

    # --------------------------------------------------------------- update
    # The four hooks below are the optimizer "engine": plain torch here; the DeepSpeed trainer
    # (skyrl_tool_agent.distributed) routes them to a ZeRO-3 engine and its data-parallel ranks.
    def _micro_batches(self, batch: TrainBatch, size: int) -> list[TrainBatch]:
        """The micro-batches this process runs, on the policy's device: `size` rows at most, within
        `training.micro_batch_tokens` when set (`plan_micro_batches`)."""
        lengths = batch.attention_mask.sum(dim=1).tolist()
        return [on_device(batch.slice(rows), self.policy.device)
                for rows in plan_micro_batches(lengths, size, self.config.training.micro_batch_tokens)]

    def _backward(self, loss: torch.Tensor, *, last: bool) -> None:
        """Accumulate the gradient of one micro-batch loss (`last`: the final one before a step)."""
        loss.backward()

    def _optimizer_step(self) -> float | None:
        """Clip, step and zero the gradients; returns the pre-clip gradient norm (None: no clipping)."""
        t = self.config.training
        norm = None
        if t.max_grad_norm > 0:
            norm = float(torch.nn.utils.clip_grad_norm_(self.policy.trainable_parameters(), t.max_grad_norm))
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return norm

    def _sum_over_workers(self, sums: dict[str, float]) -> dict[str, float]:
        """Add up per-process update sums (one process here: unchanged)."""
        return sums

    def _update(self, batch: TrainBatch) -> dict[str, float]:
        """The optimizer steps on one rollout batch: `update_epochs` passes, each one step per
        `gradient_accumulation` micro-batches (null: one per pass). Statistics are means over the
        steps (``loss``/``pg_loss`` as minimised, the others token-weighted); the LR schedule then
        advances once (it counts rollout batches that trained)."""
        g, t = self.config.grpo, self.config.training
        fixed_length = g.resolved_fixed_length()  # null in YAML means max_total_tokens
        size = max(1, t.micro_batch_size)
        # An optimizer step's rows are fixed by rollout order (gradient_accumulation micro_batch_size
        # rows each; null: all of them); within a step, rows are grouped into passes by length.
        step_rows = len(batch) if t.gradient_accumulation is None else t.gradient_accumulation * size
        steps = [self._micro_batches(batch.slice(range(start, min(start + step_rows, len(batch)))), size)
                 for start in range(0, len(batch), step_rows)]
        # One step over everything: the full batch's normaliser (under data parallel the ranks'
        # micro-batches are shards of it); minibatches: each its own, as PPO minibatches are.
        norms = ([loss_normalizer(batch.loss_mask, g.loss_aggregation, fixed_length)] if len(steps) == 1 else
                 [loss_normalizer([mb.loss_mask for mb in step], g.loss_aggregation, fixed_length) for step in steps])
        sums: dict[str, float] = {"loss": 0.0, "pg_loss": 0.0, "num_tokens": 0.0}
        grad_norms = []
        # fused_lora: each fp32 LoRA projection as one matmul with the merged weight (kernels.fused_lora)
        with self.policy.training_precision(), fused_lora(self.policy.model):
            if g.kl_coef > 0:  # the reference once per step, under no_grad, before any weight moves
                for step in steps:
                    for mb in step:
                        mb.ref_logp = self.policy.reference_logprobs(mb.input_ids, mb.attention_mask,
                                                                     temperature=g.temperature, score_mask=mb.loss_mask)
            with recompute_activations(self.policy.model, self.config.model.gradient_checkpointing):
                for _ in range(t.update_epochs):
                    for step, norm in zip(steps, norms, strict=True):
                        for i, mb in enumerate(step):
                            loss, stats = self._micro_batch_loss(mb, norm, fixed_length)
                            self._backward(loss, last=i == len(step) - 1)
                            n = stats.pop("num_tokens", 0.0)
                            sums["num_tokens"] += n
                            for key, value in stats.items():  # loss, pg_loss: partial sums; the rest: means
                                sums[key] = sums.get(key, 0.0) + (value if key in ("loss", "pg_loss") else value * n)
                        grad_norm = self._optimizer_step()
                        if grad_norm is not None:
                            grad_norms.append(grad_norm)
        self.scheduler.step()
        sums = self._sum_over_workers(sums)
        tokens = sums.pop("num_tokens")
        optimizer_steps = t.update_epochs * len(steps)
        out = {k: v / (optimizer_steps if k in ("loss", "pg_loss") else max(tokens, 1.0)) for k, v in sums.items()}
        out["optimizer_steps"] = float(optimizer_steps)
        if grad_norms:
            out["grad_norm"] = mean(grad_norms)
        return out

    def _micro_batch_loss(self, mb: TrainBatch, norm: float, fixed_length: int) -> tuple[torch.Tensor, dict[str, float]]:
        """One micro-batch's share of its optimizer step's loss (divided by the step's `norm`)."""
        g = self.config.grpo
        # Only the loss's positions are scored: the prompt's and the tools' tokens cost no head projection.
        logp, entropy = self.policy.token_logprobs(mb.input_ids, mb.attention_mask, temperature=g.temperature,
                                                   with_entropy=True, score_mask=mb.loss_mask)
        if g.entropy_coef == 0:
            entropy = entropy.detach()
        return grpo_loss(
            logp, mb.old_logp, mb.advantages, mb.loss_mask, ref_logp=mb.ref_logp, kl_coef=g.kl_coef,
            kl_estimator=g.kl_estimator, entropy=entropy, entropy_coef=g.entropy_coef,
            eps_low=g.clip_eps_low, eps_high=g.clip_eps_high, aggregation=g.loss_aggregation,
            fixed_length=fixed_length, normalizer=norm,
        )

    def train_step(self) -> StepOutput:
        g = self.config.grpo
        t0 = time.monotonic()
        torch.manual_seed(self.config.training.seed * 100_003 + self.step)  # sampling RNG per step
        on_cuda = self.policy.device.type == "cuda"
        if on_cuda:  # memory/gpu_peak_gib is this step's peak (rollout's KV cache, update's activations)
            torch.cuda.reset_peak_memory_stats(self.policy.device)
        tasks = self.loader.next_batch()
        engine_before = self.policy.engine_stats()
        trajectories = self.collect(tasks, g.group_size, self.sampling)
        decided = self._decide(trajectories)
        target, refills = len(tasks), 0
        # DAPO dynamic sampling: new tasks for the groups that carry no signal, until the step is full.
        while refills < g.refill_rounds and decided.kept_groups < target:
            extra = self.loader.draw_extra(target - decided.kept_groups)
            tasks, refills = [*tasks, *extra], refills + 1
            trajectories = [*trajectories, *self.collect(extra, g.group_size, self.sampling)]
            decided = self._decide(trajectories)
        rollout_s = time.monotonic() - t0
        engine_after = self.policy.engine_stats()
        groups = [trajectories[i * g.group_size:(i + 1) * g.group_size] for i in range(len(tasks))]
        # Infrastructure failures (done_reason "error") were never scored: no attempts for the curriculum.
        self.loader.record_results({
            task.task_id: (sum(tr.result.solved for tr in groups[i]), sum(tr.result.done_reason != "error" for tr in groups[i]))
            for i, task in enumerate(tasks)
        })
        scored_rewards = [tr.result.reward for tr, ok in zip(trajectories, decided.scored) if ok]
        kept = [(tr, a) for tr, a, k in zip(trajectories, decided.advantages, decided.kept) if k]
        update_stats: dict[str, float] = {}
        t1 = time.monotonic()
        if kept:
            batch = collate([tr for tr, _ in kept], [self._token_credit(tr, a) for tr, a in kept],
                            self.policy.tokenizer.pad_token_id)
            update_stats = self._update(batch)
        # No kept group: no optimizer step, so the LR schedule stays where it is (it counts updates).
        update_s = time.monotonic() - t1
        self.step += 1
        policy_tokens = sum(tr.num_policy_tokens for tr in trajectories)
        all_tokens = sum(len(tr.token_ids) for tr in trajectories)
        summary = summarize(trajectories)
        metrics: dict[str, Any] = {
            "step": self.step,
            # reward/*: the scored episodes only (an infrastructure error's placeholder 0 is no reward)
            "reward/mean": mean(scored_rewards) if scored_rewards else None,
            "reward/std": pstdev(scored_rewards) if scored_rewards else None,
            **{f"reward/{name}": value for name, value in reward_term_means(trajectories).items()},
            "train/execution_accuracy": summary["execution_accuracy"],
            **{f"train/{key}": update_stats.get(key, 0.0)
               for key in ("loss", "pg_loss", "kl", "entropy", "clip_frac", "grad_norm", "optimizer_steps")},
            "train/lr": self.scheduler.get_last_lr()[0],
            "train/groups_dropped": decided.groups_dropped,
            "train/groups_infra_error": decided.infra_groups,
            "train/refill_rounds": refills,
            "train/trajectories_used": len(kept),
            "train/scored": summary["scored"],
            "train/infra_errors": summary["infra_errors"],
            "episode/turns_mean": summary["mean_turns"],
            "episode/tool_errors": sum(tr.result.tool_errors for tr in trajectories),
            "episode/format_ok_rate": summary["format_ok_rate"],
            "episode/tasks": len(tasks),
            "tokens_per_s": all_tokens / max(time.monotonic() - t0, 1e-9),
            "policy_tokens": policy_tokens,
            "time/rollout_s": rollout_s,
            "time/update_s": update_s,
            # The memory plan at work: episodes the engine holds at once, and how many waited for a slot, how long.
            "rollout/episodes_in_flight": engine_after.get("slots", 0),
            "rollout/slot_waits": engine_after.get("waited", 0) - engine_before.get("waited", 0),
            "rollout/slot_wait_s": engine_after.get("wait_s", 0.0) - engine_before.get("wait_s", 0.0),
        }
        metrics["memory/peak_rss_gib"] = peak_rss_gib()
        if on_cuda:
            metrics["memory/gpu_peak_gib"] = torch.cuda.max_memory_allocated(self.policy.device) / 2**30
        return StepOutput(metrics, trajectories, list(tasks), decided.advantages, decided.kept)

    def _decide(self, trajectories: Sequence[Trajectory]) -> EpisodeDecisions:
        g = self.config.grpo
        return decide_episodes(trajectories, g.group_size, estimator=g.advantage_estimator,
                               scale_batch=g.scale_advantages_by_batch, filter_uniform=g.filter_uniform_groups)

    def _token_credit(self, trajectory: Trajectory, advantage: float) -> float | torch.Tensor:
        """The episode's advantage, or per id with per-turn credit (`grpo.turn_credit_discount`)."""
        discount = self.config.grpo.turn_credit_discount
        if discount is None:
            return advantage
        return turn_token_advantages(advantage, torch.tensor(trajectory.turn_rewards, dtype=torch.float32),
                                     torch.tensor(trajectory.loss_mask), discount)

    # ----------------------------------------------------------------- loop
    def _past_deadline(self, deadline: float | None) -> bool:
        """Whether the wall-clock budget is spent (the DeepSpeed trainer makes every rank agree)."""
        return deadline is not None and time.monotonic() > deadline

    def _signal_received(self, stop: StopOnSignals) -> str | None:
        """The stop signal's name, if one arrived (the DeepSpeed trainer makes every rank agree)."""
        return stop.received

    def train(self, run_logger: RunLogger, *, on_step: Callable[[dict[str, Any]], None] | None = None,
              deadline: float | None = None) -> list[dict[str, Any]]:
        """Run until `training.max_steps` (or the wall-clock `deadline`); returns the logged metrics.

        SIGINT/SIGTERM: the step under way finishes, a checkpoint is saved (no final evaluation)
        and `TrainingInterrupted` is raised; see `grpo.interrupts`."""
        t = self.config.training
        history = []
        started = self._clock_started = time.monotonic() - self.prior_elapsed_s  # the budget counts across --resume
        self.stop_reason = f"max_steps ({t.max_steps}) reached"
        interrupted: str | None = None
        checkpoint: Path | None = None
        saved_at: int | None = None
        with StopOnSignals() as stop:
            if self.step == 0 and self.after_measurement is not None:
                self.after_measurement()
            while self.step < t.max_steps:
                interrupted = self._signal_received(stop)
                if interrupted:  # it came during an evaluation or a save: stop before the next step
                    self.stop_reason = f"interrupted by {interrupted} after step {self.step}"
                    if saved_at != self.step:
                        checkpoint, saved_at = self.save(), self.step
                    break
                t_step = time.monotonic()
                out = self.train_step()
                self.train_seconds += time.monotonic() - t_step
                metrics = out.metrics
                metrics["time/elapsed_s"] = time.monotonic() - started  # the clock the time budget reads
                # A signal during the last step changes nothing: the run is complete anyway.
                interrupted = self._signal_received(stop) if self.step < t.max_steps else None
                out_of_time = self.step < t.max_steps and self._past_deadline(deadline)
                if interrupted:
                    self.stop_reason = f"interrupted by {interrupted} after step {self.step}"
                elif out_of_time:
                    self.stop_reason = (f"time budget reached after {self.step} of {t.max_steps} steps "
                                        f"({(time.monotonic() - started) / 60:.1f} min)")
                last = self.step >= t.max_steps or out_of_time or interrupted is not None
                measured = False
                if self.probes and not interrupted and (self.step % t.probe_every == 0 or last):
                    metrics.update(self.probe())
                    measured = True
                if not interrupted and ((t.eval_every and self.step % t.eval_every == 0) or last):
                    measured = True
                    t_eval = time.monotonic()
                    ev = self.last_eval = self.evaluate()
                    self.last_eval_step = self.step
                    self.last_eval_seconds = time.monotonic() - t_eval
                    metrics.update(eval_metrics(ev))
                if self.step % t.log_every == 0 or last:
                    metrics["memory/peak_rss_gib"] = peak_rss_gib()  # evaluations and probes included
                    run_logger.log(metrics)
                if t.rollouts_every and self.step % t.rollouts_every == 0:
                    run_logger.log_rollouts(rollout_records(self.step, out.tasks, out.trajectories, out.advantages,
                                                            out.kept, t.rollout_groups_per_step))
                history.append(metrics)
                if measured and not last and self.after_measurement is not None:  # the end writes its own
                    self.after_measurement()
                if on_step is not None:
                    on_step(metrics)
                if (t.checkpoint_every and self.step % t.checkpoint_every == 0) or last:
                    checkpoint, saved_at = self.save(), self.step
                if last:
                    break
        logger.info("training stopped: %s", self.stop_reason)
        if interrupted:
            raise TrainingInterrupted(interrupted, self.step, checkpoint)
        return history
