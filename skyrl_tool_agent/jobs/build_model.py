"""The model builds (`skyrl-tool-agent build-model`): the embedded default model, its continuation
to a plateau, the frontier of the generated pool, shipping a build; and the settings and checks
the main job and the speedrun share with them. Each opens its environment with `open_run`."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from skyrl_tool_agent.config import Config, UserInputError, default_build_dir
from skyrl_tool_agent.data.tasks import Task
from skyrl_tool_agent.eval.splits import TaskSplits
from skyrl_tool_agent.jobs.run import open_run

if TYPE_CHECKING:
    from skyrl_tool_agent.rollout.collector import CollectorSettings

logger = logging.getLogger(__name__)


def redraw_held_out_sql(config: Config, heldout_tasks: list[Task]) -> set[str] | None:
    """With `training.data.redraw_constants`, the gold queries a redrawn training task must never
    become (the held-out tasks' and dev's); None when the knob is off."""
    if not config.training.data.redraw_constants:
        return None
    return {t.gold_sql for t in heldout_tasks} | {t.gold_sql for t in TaskSplits.load(config).dev}


def build_embedded(config: Config, train_tasks: list[Task], heldout_tasks: list[Task], db_root: Path, *,
                   out: Path | None = None, force: bool = False, sft_steps: int | None = None,
                   eval_every: int | None = None, progress: Any = None,
                   provenance: dict[str, Any] | None = None) -> dict[str, Any]:
    """Build the embedded default model into `out` (default: `model.embedded_dir`, else the project
    cache; never the shipped copy); returns the build report. An intact build there is kept unless
    `force`. Its held-out figures are on validation, never dev.
    """
    from skyrl_tool_agent.policy.device import resolve_device
    from skyrl_tool_agent.policy.manifest import verify_manifest
    from skyrl_tool_agent.rollout.collector import CollectorSettings
    from skyrl_tool_agent.warmstart.build import build_embedded_model
    from skyrl_tool_agent.warmstart.sft import SFTSettings

    if out is None:
        out = default_build_dir() if config.model.uses_shipped_model() else config.model.resolved_embedded_dir()
    if not force:
        try:
            return verify_manifest(out)  # built before, every file intact
        except ValueError as exc:
            if out.exists():  # e.g. only config.json left by a copy or an older version: built anew
                logger.warning("the embedded model at %s is incomplete or damaged (%s); building it anew", out, exc)
    sft = SFTSettings()
    if sft_steps is not None:  # an explicit step count is run in full, however long it takes
        sft.steps, sft.time_budget_minutes = sft_steps, None
    if eval_every is not None:
        sft.eval_every = eval_every
    logger.info("building the embedded default model into %s", out)
    with open_run(config, db_root) as run:
        return build_embedded_model(out, run.runtime, train_tasks, heldout_tasks,
                                    sft=sft, collector_settings=oracle_collector_settings(config),
                                    eval_settings=CollectorSettings.from_config(config, evaluation=True),
                                    device=str(resolve_device(config.model.device)), progress=progress,
                                    provenance=provenance, redraw_held_out_sql=redraw_held_out_sql(config, heldout_tasks))


def build_plateau_start(config: Config, out: Path, *, start: Path | None = None, max_steps: int | None = None,
                        eval_every: int | None = None, progress: Any = None,
                        provenance: dict[str, Any] | None = None) -> dict[str, Any]:
    """Continue the embedded model (`start`, default the shipped one) on the generated pool until flat
    on validation (`warmstart.plateau`), resuming from `out`'s checkpoint; the model lands in
    `out/model`."""
    from skyrl_tool_agent.config import SHIPPED_EMBEDDED_DIR
    from skyrl_tool_agent.policy.device import resolve_device
    from skyrl_tool_agent.rollout.collector import CollectorSettings
    from skyrl_tool_agent.warmstart.plateau import PlateauRule, continuation_settings, train_to_plateau

    if config.training.data.dataset != "builtin":
        raise UserInputError("build-model --to-plateau needs the builtin dataset (its generated pool)")
    splits = TaskSplits.load(config)
    pool, heldout = splits.pool_and_validation()
    sft = continuation_settings(seed=config.training.seed)
    sft.eval_every = eval_every or 300
    with open_run(config, splits.db_root) as run:
        return train_to_plateau(start or SHIPPED_EMBEDDED_DIR, out, run.runtime, pool, heldout, sft=sft, rule=PlateauRule(),
                                oracle_settings=oracle_collector_settings(config),
                                eval_settings=CollectorSettings.from_config(config, evaluation=True),
                                max_steps=max_steps, device=str(resolve_device(config.model.device)),
                                provenance=provenance, progress=progress,
                                redraw_held_out_sql=redraw_held_out_sql(config, heldout))


def build_frontier(config: Config, *, model_dir: Path | None = None, num_tasks: int | None = None,
                   samples: int = 8, command: str = "", progress: Any = None) -> dict[str, Any]:
    """Measure the frontier of the model in `model_dir` (default: the config's) on the generated pool
    (`warmstart.frontier`); writes `frontier.json` there and returns its summary."""
    from skyrl_tool_agent.data.batching import fixed_subset
    from skyrl_tool_agent.data.frontier import FRONTIER_FILE
    from skyrl_tool_agent.policy.sampling_params import SamplingParams
    from skyrl_tool_agent.rollout.collector import CollectorSettings
    from skyrl_tool_agent.warmstart.frontier import measure_frontier

    if config.training.data.dataset != "builtin":
        raise UserInputError("build-model --frontier needs the builtin dataset (its generated pool)")
    model_dir = model_dir or config.model.resolved_embedded_dir()
    splits = TaskSplits.load(config)
    pool = splits.pool_and_validation()[0]
    tasks = pool if num_tasks is None else fixed_subset(pool, num_tasks, seed=config.training.seed)
    g = config.grpo
    params = SamplingParams.of(g)
    with open_run(config, splits.db_root) as run:
        frontier = measure_frontier(model_dir, run.runtime, tasks, samples=samples, params=params,
                                    settings=CollectorSettings.from_config(config),
                                    seed=config.training.seed, command=command, on_episode=progress)
    frontier.write(model_dir / FRONTIER_FILE)
    return {"path": str(model_dir / FRONTIER_FILE), **frontier.summary(), "seconds": frontier.seconds}


#: Validation tasks (the first N by task id) whose greedy outcomes the shipped model records.
GREEDY_CHECK_TASKS = 16


def ship_embedded(config: Config, built_dir: Path, dest: Path | None = None) -> dict[str, Any]:
    """Ship the model built in `built_dir` as the package's embedded default (or into `dest`)."""
    from skyrl_tool_agent.config import SHIPPED_EMBEDDED_DIR
    from skyrl_tool_agent.rollout.collector import CollectorSettings
    from skyrl_tool_agent.warmstart.ship import ship_embedded_model

    if not (built_dir / "config.json").is_file() or not (built_dir / "warmstart.json").is_file():
        raise UserInputError(f"{built_dir} holds no built model (config.json and warmstart.json)")
    splits = TaskSplits.load(config)
    check = splits.validation()[:GREEDY_CHECK_TASKS]
    with open_run(config, splits.db_root) as run:
        # The greedy check evaluates exactly as the main job does (GRPOTrainer.evaluate's settings).
        return ship_embedded_model(built_dir, dest or SHIPPED_EMBEDDED_DIR, run.runtime, check,
                                   CollectorSettings.from_config(config, evaluation=True))


def oracle_collector_settings(config: Config) -> CollectorSettings:
    """Collector settings for warm-start data and its held-out curve: the run's turn and token
    caps, but at least the 4 turns the scripted oracle may need, 64 episodes in flight."""
    from skyrl_tool_agent.rollout.collector import CollectorSettings

    return CollectorSettings.from_config(config, min_turns=4, concurrency=64, deterministic=False)


def ensure_embedded_model(config: Config, splits: TaskSplits, progress: Any = None, *, rebuild: bool = False) -> None:
    """Build the embedded model if it is asked for from a build directory where none is built yet,
    or anew with `rebuild` (the shipped copy is never built; loading checks its files)."""
    if config.model.is_embedded() and not config.model.uses_shipped_model():
        build_embedded(config, splits.train, splits.validation(), splits.db_root, progress=progress, force=rebuild)

