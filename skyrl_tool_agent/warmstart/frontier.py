"""Measure a model's frontier on the generated pool: `samples` sampled episodes per task through the
real env at the training temperature, the per-task success counts written to `frontier.json`
beside the model (format and reading: `data.frontier`).

    skyrl-tool-agent build-model --frontier [--frontier-tasks N] [--frontier-samples K]

The tasks are the pool GRPO samples (`TaskSplits.rl_train`), or a seeded stratified subset of N.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from skyrl_tool_agent.config import ModelConfig
from skyrl_tool_agent.data.frontier import Frontier
from skyrl_tool_agent.data.tasks import Task
from skyrl_tool_agent.env.pools import EnvRuntime
from skyrl_tool_agent.eval.greedy import progress_counter
from skyrl_tool_agent.eval.metrics import solved_outcome
from skyrl_tool_agent.policy.manifest import model_weights_sha256
from skyrl_tool_agent.policy.qwen import QwenPolicy
from skyrl_tool_agent.policy.sampling_params import SamplingParams
from skyrl_tool_agent.rollout.collector import CollectorSettings, collect_episodes

logger = logging.getLogger(__name__)


def measure_frontier(model_dir: Path, runtime: EnvRuntime, tasks: Sequence[Task], *, samples: int,
                     params: SamplingParams, settings: CollectorSettings, seed: int = 0, command: str = "",
                     on_episode: Callable[[int, int], None] | None = None) -> Frontier:
    """`samples` episodes per task of the model in `model_dir` (loaded as the main job loads the
    embedded model), sampled with `params`; an episode never scored (infrastructure error) counts
    as unsolved and is logged. `on_episode(done, total)` reports progress."""
    policy = QwenPolicy.from_config(ModelConfig(embedded_dir=str(model_dir)), mode="full")
    torch.manual_seed(seed)
    total, unscored = len(tasks) * samples, 0
    t0 = time.monotonic()
    trajectories = collect_episodes(policy, runtime, tasks, samples, params, settings,
                                    progress_counter(on_episode, total))
    counts: dict[str, int] = {}
    for i, task in enumerate(tasks):
        outcomes = [solved_outcome(t) for t in trajectories[i * samples:(i + 1) * samples]]
        unscored += sum(o is None for o in outcomes)
        counts[task.task_id] = sum(o or 0 for o in outcomes)
    if unscored:
        logger.warning("%d of %d frontier episodes were never scored (infrastructure errors); counted as unsolved",
                       unscored, total)
    return Frontier(samples=samples, temperature=params.temperature, model_sha256=model_weights_sha256(model_dir),
                    counts=counts, command=command, seconds=time.monotonic() - t0,
                    extra={"top_p": params.top_p, "max_new_tokens_per_turn": settings.max_new_tokens_per_turn,
                           "max_turns": settings.max_turns, "unscored": unscored, "seed": seed})
