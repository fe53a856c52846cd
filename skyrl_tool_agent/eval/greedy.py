"""Greedy evaluation: one episode per task through the real env, argmax decoding, scored as
`metrics.evaluation_record` (execution accuracy, ..., and `solved` per task in task order, for
paired intervals between two evaluations of the same tasks), with the error anatomy of a SQL
evaluation (`anatomy`: `error_categories` per task, `error_anatomy` counts); and its sampled companion,
`sampled_evaluation` (k episodes per task at the training temperature: avg@k and pass@k).

Every greedy figure of the project comes from `greedy_evaluation`, with the evaluation collector
settings (`CollectorSettings.from_config(config, evaluation=True)`), so the figures compare with
each other and with the evaluate command's.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable, Sequence
from statistics import mean
from dataclasses import dataclass
from typing import Any

from skyrl_tool_agent.config import Config
from skyrl_tool_agent.data.tasks import Task
from skyrl_tool_agent.env.pools import EnvRuntime
from skyrl_tool_agent.eval.anatomy import anatomy_counts, classify_episodes
from skyrl_tool_agent.eval.metrics import evaluation_record, sampled_record
from skyrl_tool_agent.eval.vocabulary import vocabulary
from skyrl_tool_agent.policy.sampling_params import GREEDY, SamplingParams
from skyrl_tool_agent.rollout.collector import Collect, CollectorSettings, collect_episodes
from skyrl_tool_agent.rollout.trajectory import Trajectory

__all__ = ["GreedyRun", "greedy_evaluation", "probe_record", "progress_counter",
           "sampled_evaluation", "training_evaluation"]


@dataclass
class GreedyRun:
    """A greedy evaluation: its record (`evaluation_record`) and the episodes behind it."""

    record: dict[str, Any]
    trajectories: list[Trajectory]


def greedy_evaluation(policy: Any, runtime: EnvRuntime, tasks: Sequence[Task], settings: CollectorSettings, *,
                      on_episode_done: Callable[[Trajectory], None] | None = None,
                      collect: Collect | None = None) -> GreedyRun:
    """One greedy episode per task of `tasks`, in task order. `collect`: who runs the episodes
    (default: this process; the trainer passes its own, which data parallel shards over ranks)."""
    run = collect or functools.partial(collect_episodes, policy, runtime)
    trajectories = run(tasks, 1, GREEDY, settings, on_episode_done)
    record = evaluation_record(trajectories)
    if runtime is not None and vocabulary(runtime.family.name).sql:  # a rank without servers has none to read
        categories = classify_episodes(trajectories, {t.task_id: t.gold_sql for t in tasks}, runtime.db_root)
        scored = sum(1 for s in record["solved"] if s is not None)
        record.update(error_categories=categories, error_anatomy=anatomy_counts(categories, scored))
    return GreedyRun(record, trajectories)


def sampled_evaluation(policy: Any, runtime: EnvRuntime, tasks: Sequence[Task], k: int, params: SamplingParams,
                       settings: CollectorSettings, *, seed: int,
                       on_episode_done: Callable[[Trajectory], None] | None = None,
                       collect: Collect | None = None) -> dict[str, Any]:
    """`k` sampled episodes per task with `params` as `metrics.sampled_record` (avg@k, pass@k,
    per-task fractions), drawn from `seed` in a forked RNG: a measurement, so two evaluations of
    one policy draw alike, and the caller's own draws afterwards are those of a run without it."""
    import torch

    run = collect or functools.partial(collect_episodes, policy, runtime)
    device = getattr(policy, "device", None)
    with torch.random.fork_rng(devices=[device] if getattr(device, "type", "cpu") == "cuda" else []):
        torch.manual_seed(seed)
        trajectories = run(tasks, k, params, settings, on_episode_done)
    return sampled_record(trajectories, k, params.temperature)


def progress_counter(report: Callable[[int, int], None] | None, total: int) -> Callable[[Trajectory], None] | None:
    """An `on_episode_done` that tells `report` (done, `total`) as each episode finishes (None: no report)."""
    if report is None:
        return None
    done = itertools.count(1)
    return lambda _trajectory: report(next(done), total)


#: Offsets of the run's seed for its measurements' draws: the sampled evaluation's and the probe's
#: (primes, so they meet neither each other nor the training steps' seeds).
SAMPLED_SEED_OFFSET, PROBE_SEED_OFFSET = 7919, 104729


def training_evaluation(policy: Any, runtime: EnvRuntime, tasks: Sequence[Task], config: Config, *,
                        params: SamplingParams | None = None,
                        on_episode_done: Callable[[Trajectory], None] | None = None,
                        collect: Collect | None = None) -> GreedyRun:
    """The evaluation a training run reports (`GRPOTrainer.evaluate`, the SFT arm's, the same
    routine): greedy on `tasks`, with `solved` per task; with `training.eval_samples` k, also
    `sampled`: k episodes per task at the training temperature (`params`, default
    `grpo`'s), drawn from the run's seed + `SAMPLED_SEED_OFFSET`."""
    settings = CollectorSettings.from_config(config, evaluation=True)  # report semantics
    run = greedy_evaluation(policy, runtime, tasks, settings, on_episode_done=on_episode_done, collect=collect)
    if k := config.training.eval_samples:
        run.record["sampled"] = sampled_evaluation(policy, runtime, tasks, k, params or SamplingParams.of(config.grpo), settings,
                                                   seed=config.training.seed + SAMPLED_SEED_OFFSET,
                                                   on_episode_done=on_episode_done, collect=collect)
    return run


def probe_record(policy: Any, runtime: EnvRuntime, revisited: Sequence[Task], held_out: Sequence[Task],
                 config: Config, params: SamplingParams, settings: CollectorSettings, *,
                 collect: Collect | None = None) -> dict[str, float]:
    """One sampled episode of each probe task (the same tasks every time, the same seed), in one
    collection: the success of revisited training tasks (`probe/`) and of held-out tasks never
    trained on (`probe/held_out_`): whether what a run learns carries over."""
    record = sampled_evaluation(policy, runtime, [*revisited, *held_out], 1, params, settings,
                                seed=config.training.seed + PROBE_SEED_OFFSET, collect=collect)
    out: dict[str, float] = {}
    split = len(revisited)
    for prefix, fractions in (("probe/", record["per_task"][:split]), ("probe/held_out_", record["per_task"][split:])):
        scored = [f for f in fractions if f is not None]
        if fractions:
            out[f"{prefix}execution_accuracy"] = mean(scored) if scored else None  # type: ignore[assignment]
            out[f"{prefix}tasks"] = float(len(fractions))
    return out
