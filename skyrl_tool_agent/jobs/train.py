"""The main job (`skyrl-tool-agent train`): load the tasks, build the embedded model if asked,
evaluate, train with GRPO, evaluate the same tasks again, write the run's files. Read it top to
bottom: `run_training` is the job; the functions above it are its steps."""

from __future__ import annotations

import contextlib
import json
import logging
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from skyrl_tool_agent.config import Config, UserInputError
from skyrl_tool_agent.data.tasks import Task
from skyrl_tool_agent.eval.splits import TaskSplits, train_pool_kind
from skyrl_tool_agent.jobs.budget import AFTER_EVAL_MARGIN, FINISH_RESERVE_S, JobBudget, start_line
from skyrl_tool_agent.jobs.build_model import ensure_embedded_model
from skyrl_tool_agent.jobs.run import GRPOParts, open_run
from skyrl_tool_agent.reports.tables import RunSummary

logger = logging.getLogger(__name__)


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


@dataclass
class JobTestSplit:
    """The test split the main job evaluates beside `training.eval_split` (`training.test_eval`):
    its `tasks` (sized with the eval tasks by the job budget), the `runtime` serving their
    databases (`test_db_root`, apart from the others), and the evaluation before GRPO."""

    tasks: list[Task]
    runtime: Any
    before: dict[str, Any] | None = None

    def evaluate(self, trainer: Any) -> dict[str, Any]:
        """The run's evaluation (`training_evaluation`, as `GRPOTrainer.evaluate`) of the test
        tasks, reporting its episodes to the trainer's `eval_progress` as they finish."""
        from skyrl_tool_agent.eval.greedy import progress_counter, training_evaluation

        episodes = len(self.tasks) * (1 + trainer.config.training.eval_samples)
        return training_evaluation(trainer.policy, self.runtime, self.tasks, trainer.config, params=trainer.sampling,
                                   on_episode_done=progress_counter(trainer.eval_progress, episodes)).record


def job_test_tasks(config: Config, splits: TaskSplits, world_size: int) -> list[Task]:
    """The test split's tasks the main job evaluates (`training.test_eval`), or none: not asked
    for, not the built-in data's generated pool (no generator, or a run on task files of its own,
    where the pool whose questions the test split must avoid is never generated), or a launch of
    several ranks (whose collections are sharded over the ranks' own servers: the log says what to
    run afterwards)."""
    t = config.training
    if not t.test_eval or t.data.dataset != "builtin" or train_pool_kind(config) == "file":
        return []
    if world_size > 1:
        logger.info("test split: not evaluated under a launcher (%d ranks); afterwards run `skyrl-tool-agent eval "
                    "--split test --model-path %s`", world_size, t.resolved_output_dir() / "final")
        return []
    return splits.test()


def sized_eval_tasks(eval_tasks: list[Task], count: int, seed: int) -> list[Task]:
    """The first evaluation's tasks when the job budget sized it to `count`: a stratified subset of
    the run's eval tasks (`fixed_subset`: the same for the same count and seed, so the evaluation
    after GRPO, and a resumed run, evaluate exactly these)."""
    from skyrl_tool_agent.data.batching import fixed_subset

    return eval_tasks if count >= len(eval_tasks) else fixed_subset(eval_tasks, count, seed=seed)


def first_evaluation(trainer: Any, run_logger: Any, ctx: Any, job: JobBudget | None, out: Path,
                     eval_tasks: list[Task], resumed: bool, test: JobTestSplit | None = None,
                     ) -> tuple[dict[str, Any], list[Task]]:
    """The evaluation before GRPO and its tasks: a resumed run's before.json (and the tasks it was
    sized to), else step 0's probe first when the job has a budget (its speed sizes the
    evaluations: `JobBudget.eval_tasks_that_fit`, the eval tasks and `test`'s together, each
    split its share), then the evaluation, logged as step 0, and `test`'s (`test.before`)."""
    from skyrl_tool_agent.eval.metrics import eval_metrics

    t = trainer.config.training
    before_path, test_path = out / "before.json", out / "before_test.json"
    if ctx.broadcast_object(resumed and before_path.is_file()):
        before = json.loads(before_path.read_text())
        if isinstance(before.get("solved"), list):  # the tasks the first evaluation was sized to
            eval_tasks = trainer.eval_tasks = sized_eval_tasks(eval_tasks, len(before["solved"]), t.seed)
        if test is not None:
            if test_path.is_file():
                test.before = json.loads(test_path.read_text())
                test.tasks = sized_eval_tasks(test.tasks, len(test.before["solved"]), t.seed)
            else:  # its first evaluation was not of the test split: no "before" to compare with
                logger.info("test split: not evaluated (the run being resumed did not evaluate it before GRPO)")
        run_logger.truncate_after(trainer.step)
        return before, eval_tasks
    probe: dict[str, float] = {}
    tests = len(test.tasks) if test is not None else 0
    if job is not None and trainer.probes:  # step 0's probe first: its speed sizes the evaluations
        probe_started = time.monotonic()
        probe = trainer.probe()
        episode_s = (time.monotonic() - probe_started) / trainer.probes
        wanted = len(eval_tasks) + tests
        fits = ctx.broadcast_object(job.eval_tasks_that_fit(wanted, 1 + t.eval_samples, episode_s))
        if fits < wanted:
            share = math.ceil(fits * len(eval_tasks) / wanted)
            split = f" ({share} of {len(eval_tasks)} {t.eval_split}, {fits - share} of {tests} test)" if tests else ""
            logger.info("main job: %d of the %d eval tasks fit its %.1f minutes at this machine's speed (%.2f s an "
                        "episode in the probe); the same before and after%s", fits, wanted, job.total_s / 60,
                        episode_s, split)
            eval_tasks = trainer.eval_tasks = sized_eval_tasks(eval_tasks, share, t.seed)
            if test is not None:
                test.tasks = sized_eval_tasks(test.tasks, max(1, fits - share), t.seed)
    eval_started = time.monotonic()
    before = trainer.evaluate()
    if test is not None:
        test.before = test.evaluate(trainer)
        if ctx.is_main:
            test_path.write_text(json.dumps(test.before, indent=1) + "\n")
    before["eval_seconds"] = time.monotonic() - eval_started  # what the second one is reserved (both splits)
    if ctx.is_main:
        before_path.write_text(json.dumps(before, indent=1) + "\n")
    run_logger.truncate_after(0)
    if trainer.probes and not probe:
        probe = trainer.probe()
    run_logger.log({"step": 0, **eval_metrics(before), **probe})
    return before, eval_tasks


def grpo_deadline(trainer: Any, job: JobBudget | None, before: dict[str, Any], progress: Any, is_main: bool) -> float | None:
    """When GRPO stops. Its own budget starts after the first evaluation (rank 0's clock decides),
    and a resumed run has spent what its checkpoint says; the whole job's budget may leave it less."""
    deadline = trainer.deadline_for(trainer.config.training.time_budget_s)
    if job is None:
        return deadline
    grpo_s = job.grpo_budget_s(float(before.get("eval_seconds", 0.0)), trainer.elapsed_s())
    deadline = time.monotonic() + grpo_s
    if progress is not None and is_main:  # the bar's minutes are GRPO's share
        progress("grpo_budget", trainer.elapsed_s() + grpo_s)
    if is_main:
        logger.info("main job: GRPO gets %.1f min (%.1f min of the job left; the evaluation after it is "
                    "reserved %.1f min, the finish %.0f s)", grpo_s / 60, job.left_s() / 60,
                    AFTER_EVAL_MARGIN * float(before.get("eval_seconds", 0.0)) / 60, FINISH_RESERVE_S)
    return deadline


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
    (default) or, on every rank of a launch, `ReplicatedBackend(joined_launch(config))` / `DeepSpeedBackend(config)`;
    rank 0 writes the files and returns the summary, the other ranks return None.
    `skip_bad_records`: leave out task records that fail the load-time checks (`eval.splits`).
    `job_started`: where `training.job_budget_minutes` counts from (a `time.monotonic()` reading;
    default: this call; the train command passes its process's start).

    Writes into `training.output_dir`: metrics.jsonl, rollouts.jsonl, checkpoints/, final/
    (save_pretrained), before.json (and before_test.json: `training.test_eval`), before_after.json,
    config.yaml (resolved) and training_curves.png.
    """
    from skyrl_tool_agent.distributed.local import LocalBackend
    from skyrl_tool_agent.env.pools import build_rubric
    from skyrl_tool_agent.eval.weave_training import training_weave
    from skyrl_tool_agent.grpo.interrupts import TrainingInterrupted
    from skyrl_tool_agent.grpo.run_lock import acquire_output_dir, release_output_dir
    from skyrl_tool_agent.policy.loading import EMBEDDED, resolve_model_path
    from skyrl_tool_agent.reports.run_files import RunOutputs, finish_run

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
        test_tasks = job_test_tasks(config, splits, ctx.world_size) if ctx.is_main else []
        if job is not None and ctx.is_main:
            logger.info(start_line(job, eval_tasks=len(eval_tasks), eval_split=t.eval_split, test_tasks=len(test_tasks),
                                   episodes_per_task=1 + t.eval_samples,
                                   probe_tasks=t.probe_tasks + (t.probe_held_out_tasks if splits.validation_at_hand() else 0)))
        start = time.monotonic()
        parts = GRPOParts(train_tasks, eval_tasks, out, backend=backend, resume=resume)
        with open_run(config, splits.db_root, grpo=parts) as run, contextlib.ExitStack() as stack:
            # W&B and the servers (the test split's too) close on every path
            trainer, run_logger = run.trainer, run.logger
            test = None
            if test_tasks:
                from skyrl_tool_agent.data.builtin.test_split import test_db_root
                from skyrl_tool_agent.env.pools import EnvRuntime

                test = JobTestSplit(test_tasks, stack.enter_context(EnvRuntime(config.env, test_db_root())))
            set_probes(trainer, config, train_tasks, splits)
            if progress is not None and ctx.is_main:  # evaluations report as they go (lines in a log file)
                trainer.eval_progress = lambda done, total: progress("eval", (done, total))
            before, eval_tasks = first_evaluation(trainer, run_logger, ctx, job, out, eval_tasks, run.resumed, test)
            outputs = RunOutputs(config, eval_tasks, before, splits.db_root) if ctx.is_main else None
            weave_log = training_weave(config, run_logger, eval_tasks) if ctx.is_main else None
            if outputs is not None and weave_log is not None:  # from the first evaluation on (rank 0)

                def after_measurement() -> None:  # at step 0, then after each evaluation and probe
                    outputs.write_during_run(trainer)
                    if trainer.step == 0 or (trainer.last_eval is not None and trainer.last_eval_step == trainer.step):
                        weave_log.log(eval_tasks, trainer.last_eval_trajectories, trainer.step)

                trainer.after_measurement = after_measurement
            deadline = grpo_deadline(trainer, job, before, progress, ctx.is_main)
            on_step = (lambda m: progress("step", m)) if progress is not None and ctx.is_main else None
            try:
                history = trainer.train(run_logger, on_step=on_step, deadline=deadline)
            except TrainingInterrupted:  # its checkpoint is saved; W&B and the servers close with the run
                if outputs is not None:  # why it stopped, where a person looks
                    outputs.write_during_run(trainer, stop_reason=trainer.stop_reason)
                raise
            after = trainer.last_eval if history and "eval/execution_accuracy" in history[-1] else trainer.evaluate()
            test_after = test.evaluate(trainer) if test is not None and test.before is not None else None
            trainer.policy.save(out / "final")  # collective under a launcher (rank 0 writes; ZeRO-3 gathers shards)
            if weave_log is not None:
                weave_log.log(eval_tasks, trainer.last_eval_trajectories, trainer.step, model_path=out / "final")
        if not ctx.is_main:
            ctx.close()  # waits for rank 0's outputs
            return None
        summary = finish_run(out, before, after, trainer.step, stop_reason=trainer.stop_reason,
                             seconds=time.monotonic() - start, training_seconds=trainer.train_seconds,
                             config=config, test=(test.before, test_after) if test_after is not None else None)
        outputs.write(trainer, after=after, stop_reason=trainer.stop_reason,
                      grpo_seconds=history[-1].get("time/elapsed_s") if history else None, test=summary.test)
        ctx.close()
        return summary
    finally:
        if lock is not None:
            release_output_dir(lock)
