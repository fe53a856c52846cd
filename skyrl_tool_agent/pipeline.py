"""The main job, as library functions the scripts call: data, embedded model, training run.

`train_grpo.py` parses arguments and calls `run_training`; tests call the same functions.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from skyrl_tool_agent.config import Config, UserInputError, default_build_dir
from skyrl_tool_agent.data.batching import TaskBatcher
from skyrl_tool_agent.data.curriculum import CurriculumSampler
from skyrl_tool_agent.data.loader import TaskDataLoader
from skyrl_tool_agent.data.tasks import Task
from skyrl_tool_agent.eval.splits import TaskSplits
from skyrl_tool_agent.job_budget import AFTER_EVAL_MARGIN, FINISH_RESERVE_S, JobBudget, start_line

if TYPE_CHECKING:
    from skyrl_tool_agent.rollout.collector import CollectorSettings

logger = logging.getLogger(__name__)


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
        batcher = TaskBatcher(target_turns=g.batcher.target_turns, max_batch=g.batcher.max_batch)
    else:
        batcher = TaskBatcher(target_turns=float("inf"), max_batch=t.tasks_per_step)
    return TaskDataLoader(train_tasks, sampler, batcher, seed=t.seed, total_steps=t.max_steps, group_size=g.group_size)


def redraw_held_out_sql(config: Config, heldout_tasks: list[Task]) -> set[str] | None:
    """With `training.data.redraw_constants`, the gold queries a redrawn training task must never
    become (the held-out tasks' and dev's: a pool query with its constants redrawn can land on
    one); None when the knob is off (the supervised build's examples stay as they are)."""
    if not config.training.data.redraw_constants:
        return None
    return {t.gold_sql for t in heldout_tasks} | {t.gold_sql for t in TaskSplits.load(config).dev}


def build_embedded(config: Config, train_tasks: list[Task], heldout_tasks: list[Task], db_root: Path, *,
                   out: Path | None = None, force: bool = False, sft_steps: int | None = None,
                   eval_every: int | None = None, progress: Any = None,
                   provenance: dict[str, Any] | None = None) -> dict[str, Any]:
    """Build the embedded default model into `out` (default: `model.embedded_dir`, else the
    project cache; never the shipped copy); returns the build report. A build already there is
    kept unless `force`, if its files match its manifest; a partial or damaged one is replaced.

    The warm start trains on oracle episodes of `train_tasks` (the training file: `TaskSplits.train`);
    its held-out figures are on `heldout_tasks` (`TaskSplits.validation()`, never dev), so where the
    warm start is stopped is not chosen on the reported yardstick.
    """
    from skyrl_tool_agent.env.pools import EnvRuntime
    from skyrl_tool_agent.policy.loading import resolve_device
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
    runtime = EnvRuntime(config.env, db_root)
    try:
        return build_embedded_model(out, runtime, train_tasks, heldout_tasks,
                                    sft=sft, collector_settings=oracle_collector_settings(config),
                                    eval_settings=CollectorSettings.from_config(config, evaluation=True),
                                    device=str(resolve_device(config.model.device)), progress=progress,
                                    provenance=provenance, redraw_held_out_sql=redraw_held_out_sql(config, heldout_tasks))
    finally:
        runtime.close()


def build_plateau_start(config: Config, out: Path, *, start: Path | None = None, max_steps: int | None = None,
                        eval_every: int | None = None, progress: Any = None,
                        provenance: dict[str, Any] | None = None) -> dict[str, Any]:
    """Continue the embedded model (`start`, default the shipped one) with supervised training on
    oracle episodes of the generated pool GRPO samples until its greedy execution accuracy on the
    validation split is flat (`warmstart.plateau`); resumes from `out`'s checkpoint. Dev is never
    looked at. The model lands in `out/model` (ship it with `build-model --ship`)."""
    from skyrl_tool_agent.config import SHIPPED_EMBEDDED_DIR
    from skyrl_tool_agent.env.pools import EnvRuntime
    from skyrl_tool_agent.policy.loading import resolve_device
    from skyrl_tool_agent.rollout.collector import CollectorSettings
    from skyrl_tool_agent.warmstart.plateau import PlateauRule, continuation_settings, train_to_plateau

    if config.training.data.dataset != "builtin":
        raise UserInputError("build-model --to-plateau needs the builtin dataset (its generated pool)")
    splits = TaskSplits.load(config)
    pool, heldout = splits.pool_and_validation()
    sft = continuation_settings(seed=config.training.seed)
    sft.eval_every = eval_every or 300
    runtime = EnvRuntime(config.env, splits.db_root)
    try:
        return train_to_plateau(start or SHIPPED_EMBEDDED_DIR, out, runtime, pool, heldout, sft=sft, rule=PlateauRule(),
                                oracle_settings=oracle_collector_settings(config),
                                eval_settings=CollectorSettings.from_config(config, evaluation=True),
                                max_steps=max_steps, device=str(resolve_device(config.model.device)),
                                provenance=provenance, progress=progress,
                                redraw_held_out_sql=redraw_held_out_sql(config, heldout))
    finally:
        runtime.close()


def build_frontier(config: Config, *, model_dir: Path | None = None, num_tasks: int | None = None,
                   samples: int = 8, command: str = "", progress: Any = None) -> dict[str, Any]:
    """Measure the frontier of the embedded model in `model_dir` (default: the config's, i.e. the
    shipped one) on the generated pool (`data.frontier`): `samples` episodes per task at the
    training temperature, on all pool tasks or a stratified subset of `num_tasks`; writes
    `frontier.json` into `model_dir` and returns its summary."""
    from skyrl_tool_agent.data.batching import fixed_subset
    from skyrl_tool_agent.data.frontier import FRONTIER_FILE
    from skyrl_tool_agent.env.pools import EnvRuntime
    from skyrl_tool_agent.policy.qwen import SamplingParams
    from skyrl_tool_agent.rollout.collector import CollectorSettings
    from skyrl_tool_agent.warmstart.frontier import measure_frontier

    if config.training.data.dataset != "builtin":
        raise UserInputError("build-model --frontier needs the builtin dataset (its generated pool)")
    model_dir = model_dir or config.model.resolved_embedded_dir()
    splits = TaskSplits.load(config)
    pool = splits.pool_and_validation()[0]
    tasks = pool if num_tasks is None else fixed_subset(pool, num_tasks, seed=config.training.seed)
    g = config.grpo
    params = SamplingParams(temperature=g.temperature, top_p=g.top_p, max_new_tokens=g.max_new_tokens_per_turn)
    runtime = EnvRuntime(config.env, splits.db_root)
    try:
        frontier = measure_frontier(model_dir, runtime, tasks, samples=samples, params=params,
                                    settings=CollectorSettings.from_config(config),
                                    seed=config.training.seed, command=command, on_episode=progress)
    finally:
        runtime.close()
    frontier.write(model_dir / FRONTIER_FILE)
    return {"path": str(model_dir / FRONTIER_FILE), **frontier.summary(), "seconds": frontier.seconds}


#: Validation tasks (the first N by task id) whose greedy outcomes the shipped model records.
GREEDY_CHECK_TASKS = 16


def ship_embedded(config: Config, built_dir: Path, dest: Path | None = None) -> dict[str, Any]:
    """Ship the model built in `built_dir` as the package's embedded default (or into `dest`)."""
    from skyrl_tool_agent.config import SHIPPED_EMBEDDED_DIR
    from skyrl_tool_agent.env.pools import EnvRuntime
    from skyrl_tool_agent.rollout.collector import CollectorSettings
    from skyrl_tool_agent.warmstart.ship import ship_embedded_model

    if not (built_dir / "config.json").is_file() or not (built_dir / "warmstart.json").is_file():
        raise UserInputError(f"{built_dir} holds no built model (config.json and warmstart.json)")
    splits = TaskSplits.load(config)
    check = splits.validation()[:GREEDY_CHECK_TASKS]
    runtime = EnvRuntime(config.env, splits.db_root)
    try:
        # The greedy check evaluates exactly as the main job does (GRPOTrainer.evaluate's settings).
        return ship_embedded_model(built_dir, dest or SHIPPED_EMBEDDED_DIR, runtime, check,
                                   CollectorSettings.from_config(config, evaluation=True))
    finally:
        runtime.close()


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


@dataclass
class RunSummary:
    before: dict[str, Any]
    after: dict[str, Any]
    steps: int
    seconds: float
    output_dir: Path
    history: list[dict[str, Any]] = field(default_factory=list)
    stop_reason: str = ""
    #: Execution-accuracy change on the eval tasks with its paired-bootstrap 95% interval.
    delta: dict[str, float] | None = None
    #: The task family (`TaskFamily.name`): the end-of-run table speaks its words.
    family: str = "sql"
    #: The avg@k change (training.eval_samples) with its paired-bootstrap 95% interval.
    sampled_delta: dict[str, float] | None = None
    #: Each error category's rate change (`eval.anatomy`) with its paired-bootstrap 95% interval.
    anatomy_delta: dict[str, dict[str, float]] | None = None


def before_after_record(before: dict[str, Any], after: dict[str, Any], steps: int, *, stop_reason: str,
                        training_seconds: float) -> dict[str, Any]:
    """before_after.json's record: both evaluations, the paired-bootstrap interval of the EX change
    when both carry per-task outcomes, of the avg@k change when both sampled, and of each error
    category's rate when both carry the error anatomy; the steps, the stop reason, the minutes."""
    return {"before": before, "after": after, "steps": steps, "stop_reason": stop_reason,
            "training_minutes": training_seconds / 60,
            "execution_accuracy_delta": paired_delta(before.get("solved"), after.get("solved")),
            "avg_at_k_delta": paired_delta((before.get("sampled") or {}).get("per_task"),
                                           (after.get("sampled") or {}).get("per_task")),
            "error_anatomy_delta": anatomy_deltas(before, after)}


def run_state(step: int, max_steps: int, minutes: float, stop_reason: str = "") -> str:
    """A run's state in words, as its curves, table and report carry it: the step, the minutes of
    GRPO, and "running" or why it stopped."""
    return f"step {step} of {max_steps}, {minutes:.1f} min of GRPO, " + (
        f"stopped: {stop_reason}" if stop_reason else "running")


def training_weave(config: Config, run_logger: Any, eval_tasks: list[Task]) -> Any:
    """The run's `eval.weave_training.TrainingWeave`: its evaluations as Weave Evaluations named
    after the W&B run (else the output directory) when W&B is online; otherwise the one line that
    says where they would have gone and the `eval` command that puts the trained model there."""
    from skyrl_tool_agent.env.families import resolve_family
    from skyrl_tool_agent.eval.vocabulary import vocabulary
    from skyrl_tool_agent.eval.weave_setup import weave_mode
    from skyrl_tool_agent.eval.weave_training import TrainingWeave

    t = config.training
    out = t.resolved_output_dir()
    run_name = getattr(run_logger, "wandb_run_name", None) or out.name
    subset = f" --limit {len(eval_tasks)} --seed {t.seed}" if t.eval_split == "dev" else ""
    later = (f"WANDB_API_KEY=<key> skyrl-tool-agent eval --policy model --model-path {out / 'final'} "
             f"--split {t.eval_split}{subset} --name {run_name}-final")
    return TrainingWeave(mode=weave_mode(t.wandb.mode), wandb_mode=t.wandb.resolved_mode(),
                         project=t.wandb.weave_project(), run_name=run_name,
                         sql=vocabulary(resolve_family(config.env.task_family).name).sql, later=later)


class RunOutputs:
    """A run's training_curves.png, metrics_table.md (the before/after table: the evaluation before
    GRPO against the latest one) and report.html (the latest evaluation's episodes against the one
    before, the training rollouts so far, the curves), each with the run's state (`run_state`),
    each replaced atomically: written by rank 0 after the first evaluation and probe, after every
    evaluation and probe during training (`GRPOTrainer.after_measurement`), and at the end. One
    writer for all of them, so a long run shows what it learns while it runs."""

    def __init__(self, config: Config, eval_tasks: list[Task], before: dict[str, Any], db_root: Path) -> None:
        self.config, self.eval_tasks, self.before, self.db_root = config, eval_tasks, before, db_root
        self.out = config.training.resolved_output_dir()

    def write(self, trainer: Any, *, after: dict[str, Any] | None = None, stop_reason: str = "",
              grpo_seconds: float | None = None) -> None:
        """Write the three files for `trainer`'s step and latest evaluation (`after`, default its
        `last_eval`, the one before GRPO until there is another; its episodes are the trainer's
        `last_eval_trajectories`); `stop_reason`: why the run stopped ("" while it runs);
        `grpo_seconds`: the GRPO clock where training stopped (default: the trainer's clock now)."""
        from skyrl_tool_agent.env.families import resolve_family
        from skyrl_tool_agent.eval.plots import plot_training_curves
        from skyrl_tool_agent.eval.report import TrainingRunView
        from skyrl_tool_agent.eval.report_training import write_training_report
        from skyrl_tool_agent.eval.vocabulary import vocabulary
        from skyrl_tool_agent.reporting import write_metrics_table

        t = self.config.training
        if after is not None:
            evaluated_at = trainer.step
        else:
            after, evaluated_at = ((trainer.last_eval, trainer.last_eval_step) if trainer.last_eval is not None
                                   else (self.before, 0))
        minutes = (trainer.elapsed_s() if grpo_seconds is None else grpo_seconds) / 60
        state = run_state(trainer.step, t.max_steps, minutes, stop_reason)
        curves = plot_training_curves(self.out / "metrics.jsonl", self.out / "training_curves.png",
                                      eval_split=t.eval_split, kl_off=self.config.grpo.kl_coef == 0, state=state)
        record = before_after_record(self.before, after, trainer.step, stop_reason=stop_reason,
                                     training_seconds=trainer.train_seconds)
        write_metrics_table(self.out / METRICS_TABLE_FILE, record, vocabulary(resolve_family(self.config.env.task_family).name),
                            state=state, split=t.eval_split,
                            after_label="after GRPO" if stop_reason else f"step {evaluated_at}")
        if trainer.last_eval_trajectories:  # a resumed run has none until it evaluates: its report stays
            # report.html: the latest evaluation's episodes against `before`, with the run's rollouts.jsonl
            write_training_report(self.config, self.eval_tasks, trainer.last_eval_trajectories, self.before,
                                  db_root=self.db_root, step=evaluated_at, run=TrainingRunView(state, curves))

    def write_during_run(self, trainer: Any, *, stop_reason: str = "") -> None:
        """`write` where a failure to write (a full disk, a file made read-only) must not end the
        training: one warning, and the next evaluation or probe tries again."""
        try:
            self.write(trainer, stop_reason=stop_reason)
        except OSError as exc:
            logger.warning("the run's curves, table and report were not rewritten at step %d (%s: %s)",
                           trainer.step, type(exc).__name__, exc)


#: The before/after table of a run, in its output directory (`RunOutputs`).
METRICS_TABLE_FILE = "metrics_table.md"


def finish_run(out: Path, before: dict[str, Any], after: dict[str, Any], steps: int, *, stop_reason: str,
               seconds: float, history: list[dict[str, Any]], training_seconds: float, config: Config) -> RunSummary:
    """Write before_after.json (`before_after_record`), error_anatomy.png and the model card in
    final/ (the curves, the table and report.html: `RunOutputs`)."""
    from skyrl_tool_agent.eval.plots import plot_error_anatomy
    from skyrl_tool_agent.reporting import write_model_card

    record = before_after_record(before, after, steps, stop_reason=stop_reason, training_seconds=training_seconds)
    (out / "before_after.json").write_text(json.dumps(record, indent=1) + "\n")
    if before.get("error_anatomy") and after.get("error_anatomy"):
        plot_error_anatomy([("before GRPO", before["error_anatomy"]), ("after GRPO", after["error_anatomy"])],
                           out / "error_anatomy.png",
                           title=f"Why answers are wrong ({config.training.eval_split}, greedy)")
    if (out / "final").is_dir():
        write_model_card(out / "final", config, record)
    from skyrl_tool_agent.env.families import resolve_family

    return RunSummary(before, after, steps, seconds, out, history, stop_reason, record["execution_accuracy_delta"],
                      family=resolve_family(config.env.task_family).name, sampled_delta=record["avg_at_k_delta"],
                      anatomy_delta=record["error_anatomy_delta"])


def anatomy_deltas(before: dict[str, Any], after: dict[str, Any]) -> dict[str, dict[str, float]] | None:
    """Each error category's rate change between two greedy evaluations of the same tasks with
    its paired-bootstrap interval (`eval.anatomy.anatomy_changes`), or None when either lacks the
    anatomy (`error_categories`, `solved`)."""
    from skyrl_tool_agent.eval.anatomy import anatomy_changes

    b, a = before.get("error_categories"), after.get("error_categories")
    if not b or not a or len(b) != len(a) or len(before.get("solved") or ()) != len(b) \
            or len(after.get("solved") or ()) != len(a):
        return None
    return {c: d.to_dict() for c, d in anatomy_changes(b, before["solved"], a, after["solved"]).items()}


def paired_delta(before: list[float | None] | None, after: list[float | None] | None) -> dict[str, float] | None:
    """The paired-bootstrap interval of mean(after) - mean(before) over the tasks scored on both
    sides (`eval.stats`), or None when either side has no per-task outcomes or nothing was scored."""
    from skyrl_tool_agent.eval.stats import NothingScored, paired_bootstrap

    if not before or not after or len(before) != len(after):
        return None
    try:  # tasks unscored on either side (infrastructure errors) are left out of the interval
        return paired_bootstrap(before, after).to_dict()
    except NothingScored:
        return None


class LocalContext:
    """The process group of a single-process run: rank 0 of 1. A launched run's
    `distributed.comm.DistContext` has the same methods, so `run_training` is one loop for both,
    gated on `is_main` (one writer of files, logs and W&B)."""

    rank = 0
    world_size = 1
    is_main = True

    def barrier(self) -> None:
        pass

    def broadcast_object(self, obj: Any) -> Any:
        return obj

    def close(self) -> None:
        pass


class LocalBackend:
    """Builds a single-process trainer (LoRA, QLoRA or full, on CPU, MPS or one GPU). A launch's
    backends (`distributed`: ReplicatedBackend for LoRA, DeepSpeedBackend for full) have the same two members."""

    def __init__(self) -> None:
        self.ctx = LocalContext()

    def build_trainer(self, config: Config, runtime: Any, loader: TaskDataLoader, eval_tasks: list[Task],
                      out: Path) -> Any:
        from skyrl_tool_agent.grpo.trainer import GRPOTrainer
        from skyrl_tool_agent.policy.qwen import QwenPolicy

        policy = QwenPolicy.from_config(config.model, mode=config.training.mode)
        return GRPOTrainer(config, policy, runtime, loader, eval_tasks, output_dir=out)


def set_probes(trainer: Any, config: Config, train_tasks: list[Task], splits: TaskSplits) -> None:
    """The fixed sets `trainer` probes, the same at every probe and on every rank: `training.probe_tasks`
    of the tasks it trains on, `training.probe_held_out_tasks` of the validation split (never trained on)."""
    from skyrl_tool_agent.data.batching import fixed_subset

    t = config.training
    if t.probe_tasks:
        trainer.probe_tasks = fixed_subset(train_tasks, t.probe_tasks, seed=t.seed + 1)
    if t.probe_held_out_tasks:
        held_out = splits.validation_at_hand()
        if held_out is None:
            logger.info("no held-out probe (training.probe_held_out_tasks): GRPO trains on the training file, "
                        "so the generated pool's validation split is not built")
        else:
            trainer.held_out_probe_tasks = fixed_subset(held_out, t.probe_held_out_tasks, seed=t.seed + 2)


def sized_eval_tasks(eval_tasks: list[Task], count: int, seed: int) -> list[Task]:
    """The first evaluation's tasks when the job budget sized it to `count`: a stratified subset of
    the run's eval tasks (`fixed_subset`: the same for the same count and seed, so the evaluation
    after GRPO, and a resumed run, evaluate exactly these)."""
    from skyrl_tool_agent.data.batching import fixed_subset

    return eval_tasks if count >= len(eval_tasks) else fixed_subset(eval_tasks, count, seed=seed)


def resume_problem(config: Config, out: Path, resume: str, world_size: int) -> str | None:
    """Why `--resume resume` cannot go on with this launch's settings (one line), or None: the
    checkpoint it names recorded other values of knobs that change training, or (full mode) another
    rank count (`grpo.checkpoint.resume_settings_problem`)."""
    from skyrl_tool_agent.grpo.checkpoint import checkpoint_to_resume, resume_settings_problem

    checkpoint = checkpoint_to_resume(out / "checkpoints", resume)
    if checkpoint is None or not checkpoint.is_dir():
        return None  # nothing to resume (auto) or a missing directory: the load says so
    # only a ZeRO-3 checkpoint records its rank count; a LoRA one resumes on any number of ranks
    full = config.training.mode == "full"
    return resume_settings_problem(config.to_dict(), checkpoint, world_size=world_size if full else None)


def run_training(config: Config, *, resume: str | None = None, rebuild: bool = False,
                 progress: Any = None, backend: Any = None, skip_bad_records: bool = False,
                 job_started: float | None = None) -> RunSummary | None:
    """Train with GRPO as configured; evaluates the fixed eval tasks before and after. `rebuild`:
    build the embedded model anew first (see `ensure_embedded_model`). `backend`: `LocalBackend()`
    (default) or, on every rank of a launch, `ReplicatedBackend(config)` / `DeepSpeedBackend(config)`;
    rank 0 writes the files and returns the summary, the other ranks return None.
    `skip_bad_records`: leave out task records that fail the load-time checks (`eval.splits`).
    `job_started`: where `training.job_budget_minutes` counts from (a `time.monotonic()` reading;
    default: this call; the train command passes its process's start).

    Writes into `training.output_dir`: metrics.jsonl, rollouts.jsonl, checkpoints/, final/
    (save_pretrained), before.json, before_after.json, config.yaml (resolved) and training_curves.png.
    """
    from skyrl_tool_agent.env.pools import EnvRuntime, build_rubric
    from skyrl_tool_agent.eval.metrics import eval_metrics
    from skyrl_tool_agent.grpo.checkpoint import seed_everything
    from skyrl_tool_agent.grpo.interrupts import TrainingInterrupted
    from skyrl_tool_agent.grpo.run_lock import acquire_output_dir, release_output_dir
    from skyrl_tool_agent.grpo.run_logging import NullRunLogger, RunLogger
    from skyrl_tool_agent.policy.loading import EMBEDDED, resolve_model_path

    backend = backend or LocalBackend()
    ctx = backend.ctx
    t = config.training
    job = JobBudget.for_run(t, job_started)
    build_rubric(config.env)  # the reward's own terms are imported here, first: a broken one is one error line
    if config.model.name_or_path != EMBEDDED:
        resolve_model_path(config.model)  # a missing model directory is an error before anything is written
    splits = TaskSplits.load(config, skip_bad_records=skip_bad_records)
    out = t.resolved_output_dir()
    lock = None
    if ctx.is_main:
        out.mkdir(parents=True, exist_ok=True)
        lock = acquire_output_dir(out)  # one run per output directory (before anything is written)
    try:
        if resume is not None:  # before any model is loaded, and before config.yaml is written anew
            problem = ctx.broadcast_object(resume_problem(config, out, resume, ctx.world_size) if ctx.is_main else None)
            if problem is not None:
                raise UserInputError(problem)
        if ctx.is_main:
            ensure_embedded_model(config, splits, progress=progress, rebuild=rebuild)
            (out / "config.yaml").write_text(config.dump_yaml())
        ctx.barrier()  # the other ranks wait for the embedded model
        eval_tasks = splits.run_eval()  # deterministic: the same on every rank
        if not eval_tasks:  # else the run trains, then fails on an evaluation of nothing
            raise UserInputError(f"no tasks to evaluate: the {t.eval_split} split is empty "
                                 f"(training.data.{'dev_file' if t.eval_split == 'dev' else 'validation_tasks'})")
        train_tasks = splits.rl_train()
        if job is not None and ctx.is_main:
            logger.info(start_line(job, eval_tasks=len(eval_tasks), eval_split=t.eval_split,
                                   episodes_per_task=1 + t.eval_samples,
                                   probe_tasks=t.probe_tasks + (t.probe_held_out_tasks if splits.validation_at_hand() else 0)))
        start = time.monotonic()
        runtime = EnvRuntime(config.env, splits.db_root)
        try:
            # The same on every rank (LoRA replicas start alike; ZeRO-3 partitions one initialisation);
            # a resumed run then restores the checkpoint's RNG states.
            seed_everything(t.seed)
            trainer = backend.build_trainer(config, runtime, build_loader(config, train_tasks), eval_tasks, out)
            set_probes(trainer, config, train_tasks, splits)
            resumed = trainer.resume(resume)
            if progress is not None and ctx.is_main:  # evaluations report as they go (lines in a log file)
                trainer.eval_progress = lambda done, total: progress("eval", (done, total))
            run_logger: Any = (RunLogger(out, wandb_config=t.wandb, run_config=config.to_dict(), resume=resumed)
                               if ctx.is_main else NullRunLogger())
            before_path = out / "before.json"
            if ctx.broadcast_object(resumed and before_path.is_file()):
                before = json.loads(before_path.read_text())
                if isinstance(before.get("solved"), list):  # the tasks the first evaluation was sized to
                    eval_tasks = trainer.eval_tasks = sized_eval_tasks(eval_tasks, len(before["solved"]), t.seed)
                run_logger.truncate_after(trainer.step)
            else:
                probe: dict[str, float] = {}
                if job is not None and trainer.probes:  # step 0's probe first: its speed sizes the evaluations
                    probe_started = time.monotonic()
                    probe = trainer.probe()
                    episode_s = (time.monotonic() - probe_started) / trainer.probes
                    fits = ctx.broadcast_object(job.eval_tasks_that_fit(len(eval_tasks), 1 + t.eval_samples, episode_s))
                    if fits < len(eval_tasks):
                        logger.info("main job: %d of the %d eval tasks fit its %.1f minutes at this machine's speed "
                                    "(%.2f s an episode in the probe); the same %d before and after",
                                    fits, len(eval_tasks), job.total_s / 60, episode_s, fits)
                    eval_tasks = trainer.eval_tasks = sized_eval_tasks(eval_tasks, fits, t.seed)
                eval_started = time.monotonic()
                before = trainer.evaluate()
                before["eval_seconds"] = time.monotonic() - eval_started  # what the second one is reserved
                if ctx.is_main:
                    before_path.write_text(json.dumps(before, indent=1) + "\n")
                run_logger.truncate_after(0)
                if trainer.probes and not probe:
                    probe = trainer.probe()
                run_logger.log({"step": 0, **eval_metrics(before), **probe})
            outputs = RunOutputs(config, eval_tasks, before, splits.db_root) if ctx.is_main else None
            weave_log = training_weave(config, run_logger, eval_tasks) if ctx.is_main else None
            if outputs is not None and weave_log is not None:  # from the first evaluation on (rank 0)

                def after_measurement() -> None:  # at step 0, then after each evaluation and probe
                    outputs.write_during_run(trainer)
                    if trainer.step == 0 or (trainer.last_eval is not None and trainer.last_eval_step == trainer.step):
                        weave_log.log(eval_tasks, trainer.last_eval_trajectories, trainer.step)

                trainer.after_measurement = after_measurement
            # The time budget is GRPO's own: it starts after the first evaluation (rank 0's clock decides),
            # and a resumed run has spent what its checkpoint says. The whole job's budget may leave it less.
            deadline = trainer.deadline_for(t.time_budget_s)
            if job is not None:
                grpo_s = job.grpo_budget_s(float(before.get("eval_seconds", 0.0)), trainer.elapsed_s())
                deadline = time.monotonic() + grpo_s
                if progress is not None and ctx.is_main:  # the bar's minutes are GRPO's share
                    progress("grpo_budget", trainer.elapsed_s() + grpo_s)
                if ctx.is_main:
                    logger.info("main job: GRPO gets %.1f min (%.1f min of the job left; the evaluation after it is "
                                "reserved %.1f min, the finish %.0f s)", grpo_s / 60, job.left_s() / 60,
                                AFTER_EVAL_MARGIN * float(before.get("eval_seconds", 0.0)) / 60, FINISH_RESERVE_S)
            on_step = (lambda m: progress("step", m)) if progress is not None and ctx.is_main else None
            try:
                history = trainer.train(run_logger, on_step=on_step, deadline=deadline)
            except TrainingInterrupted:  # its checkpoint is saved; W&B closes the run cleanly, the servers in `finally`
                if outputs is not None:  # why it stopped, where a person looks
                    outputs.write_during_run(trainer, stop_reason=trainer.stop_reason)
                run_logger.finish()
                raise
            after = trainer.last_eval if history and "eval/execution_accuracy" in history[-1] else trainer.evaluate()
            trainer.policy.save(out / "final")  # collective under a launcher (rank 0 writes; ZeRO-3 gathers shards)
            if weave_log is not None:
                weave_log.log(eval_tasks, trainer.last_eval_trajectories, trainer.step, model_path=out / "final")
            run_logger.finish()
        finally:
            runtime.close()
        if not ctx.is_main:
            ctx.close()  # waits for rank 0's outputs
            return None
        summary = finish_run(out, before, after, trainer.step, stop_reason=trainer.stop_reason,
                             seconds=time.monotonic() - start, history=history, training_seconds=trainer.train_seconds,
                             config=config)
        outputs.write(trainer, after=after, stop_reason=trainer.stop_reason,
                      grpo_seconds=history[-1].get("time/elapsed_s") if history else None)
        ctx.close()
        return summary
    finally:
        if lock is not None:
            release_output_dir(lock)


def continue_warm_start(config: Config, minutes: float, *, eval_at_minutes: tuple[float, ...] = (),
                        eval_tasks: list[Task] | None = None, progress: Any = None,
                        save_to: Path | None = None, examples: list[tuple[list[int], list[int]]] | None = None,
                        before: dict[str, Any] | None = None, deadline: float | None = None,
                        batch_size: int | None = None, splits: TaskSplits | None = None) -> dict[str, Any]:
    """The supervised baseline for GRPO's gain: continue the embedded model's warm start (same
    recipe at the tail learning rate of its schedule, on the tasks GRPO samples:
    `training.data.train_pool`) for `minutes` of training time, then evaluate greedy on `eval_tasks`
    (default: GRPO's fixed dev subset; with `training.eval_samples`, avg@k too, as GRPO's
    evaluations). `eval_at_minutes` adds evaluations on the way (a curve
    against training time; evaluation time is off that clock). Each evaluation carries `solved`
    per task for paired intervals. `save_to`: keep the continued model there (`save_pretrained` +
    tokenizer), e.g. as the start of a GRPO run (`--set model.name_or_path=DIR`).

    A caller that has them already (the speedrun) passes `examples` (oracle episodes of the
    training tasks tokenised with this model's tokenizer: not collected again), `before` (the
    start's evaluation on `eval_tasks`: not run again), a monotonic `deadline` that also ends the
    training, the supervised `batch_size` and the loaded `splits`. The result's `start_weights` is
    the `weights_fingerprint` of the model before training."""
    from skyrl_tool_agent.env.pools import EnvRuntime
    from skyrl_tool_agent.eval.greedy import greedy_evaluation, sampled_evaluation
    from skyrl_tool_agent.policy.qwen import QwenPolicy, SamplingParams
    from skyrl_tool_agent.rollout.collector import CollectorSettings
    from skyrl_tool_agent.warmstart.build import oracle_conversations
    from skyrl_tool_agent.warmstart.plateau import continuation_settings
    from skyrl_tool_agent.warmstart.scratch import weights_fingerprint
    from skyrl_tool_agent.warmstart.sft import conversation_to_ids, supervised_finetune

    splits = splits or TaskSplits.load(config)
    train_tasks = splits.rl_train() if examples is None else []
    t = config.training
    settings = oracle_collector_settings(config)
    runtime = EnvRuntime(config.env, splits.db_root)
    try:
        policy = QwenPolicy.from_config(config.model, mode="full")
        if eval_tasks is None:
            eval_tasks = splits.run_eval()

        eval_settings = CollectorSettings.from_config(config, evaluation=True)
        g = config.grpo

        def evaluate(_step: int = 0) -> dict[str, Any]:  # exactly as GRPOTrainer.evaluate runs it
            record = greedy_evaluation(policy, runtime, eval_tasks, eval_settings).record
            if t.eval_samples:
                params = SamplingParams(temperature=g.temperature, top_p=g.top_p, max_new_tokens=g.max_new_tokens_per_turn)
                record["sampled"] = sampled_evaluation(policy, runtime, eval_tasks, t.eval_samples, params, eval_settings,
                                                       seed=t.seed + 7919)
            return record

        start_weights = weights_fingerprint(policy.model)
        if before is None:
            before = evaluate()
        if examples is None:
            conversations = oracle_conversations(runtime, train_tasks, settings)
            examples = [conversation_to_ids(c, policy.tokenizer) for c in conversations]
        sft = continuation_settings(seed=t.seed + 17, **({"batch_size": batch_size} if batch_size else {}))
        history = supervised_finetune(policy.model, examples, policy.tokenizer.pad_token_id, sft,
                                      evaluate=evaluate, eval_at_seconds=[60 * m for m in eval_at_minutes],
                                      train_seconds=60 * minutes, progress=progress, deadline=deadline)
        if save_to is not None:
            policy.save(save_to)
    finally:
        runtime.close()
    curve = [{"minutes": e["seconds"] / 60, **{k: v for k, v in e.items() if k != "seconds"}} for e in history.evals]
    return {"minutes": minutes, "steps": len(history.loss), "before": before, "after": curve[-1], "curve": curve,
            "start_weights": start_weights}


class GRPOCurve:
    """GRPO from the config's model, evaluated on the run's eval tasks (`TaskSplits.run_eval`) at
    marks of training time: `train_for(seconds)` trains until the arm has trained that long in all
    (evaluations excluded, as in the main job's budget), then the trainer's last step evaluates.
    The probe of `training.probe_tasks` revisited training tasks runs as in the main job. Writes
    metrics.jsonl (step 0: the start's evaluation and probe) into `out`; `close()` ends the run.
    Used by benchmarks/bench_learning.py and the speedrun (`skyrl_tool_agent.speedrun`), which
    passes its loaded `splits` (the generated pool is not built again) and the `pool` it trains on
    (its RL pool, held out of the build; default `splits.rl_train()`). `start_weights`: the
    `weights_fingerprint` of the model GRPO starts from."""

    def __init__(self, config: Config, out: Path, *, splits: TaskSplits | None = None,
                 pool: list[Task] | None = None) -> None:
        from skyrl_tool_agent.env.pools import EnvRuntime
        from skyrl_tool_agent.grpo.checkpoint import seed_everything
        from skyrl_tool_agent.grpo.run_logging import RunLogger
        from skyrl_tool_agent.grpo.trainer import GRPOTrainer
        from skyrl_tool_agent.policy.qwen import QwenPolicy
        from skyrl_tool_agent.warmstart.scratch import weights_fingerprint

        t = config.training
        self.config = config
        splits = splits or TaskSplits.load(config)
        pool = splits.rl_train() if pool is None else pool
        self.runtime = EnvRuntime(config.env, splits.db_root)
        try:
            seed_everything(t.seed)
            policy = QwenPolicy.from_config(config.model, mode=t.mode)
            self.start_weights = weights_fingerprint(policy.model)
            self.trainer = GRPOTrainer(config, policy, self.runtime, build_loader(config, pool), splits.run_eval(),
                                       output_dir=out)
            set_probes(self.trainer, config, pool, splits)  # the same fixed sets the main job probes
            self.run_logger = RunLogger(out, wandb_config=t.wandb)
        except BaseException:
            self.runtime.close()
            raise
        self.trained_s = 0.0  # training time so far (rollouts, updates, probes), evaluations excluded
        self.curve: list[dict[str, Any]] = []

    def evaluate_start(self) -> dict[str, Any]:
        """The start's evaluation (and probe), logged as step 0."""
        from skyrl_tool_agent.eval.metrics import eval_metrics

        before = self.trainer.evaluate()
        probe = self.trainer.probe() if self.trainer.probes else {}
        self.run_logger.log({"step": 0, **eval_metrics(before), **probe})
        return before

    def train_for(self, training_s: float, *, on_step: Any = None) -> dict[str, Any]:
        """Train until `training_s` seconds of training in all, then evaluate; returns the point
        (`minutes` of training, `step`, the evaluation record). At least one step runs."""
        t0 = time.monotonic()
        self.trainer.train(self.run_logger, deadline=t0 + training_s - self.trained_s, on_step=on_step)
        self.trained_s += time.monotonic() - t0 - self.trainer.last_eval_seconds
        point = {"minutes": self.trained_s / 60, "step": self.trainer.step, **(self.trainer.last_eval or {})}
        self.curve.append(point)
        return point

    @property
    def finished(self) -> bool:
        """Whether `training.max_steps` is reached (no further `train_for` trains)."""
        return self.trainer.step >= self.config.training.max_steps

    def close(self) -> None:
        try:
            self.run_logger.finish()
        finally:
            self.runtime.close()
