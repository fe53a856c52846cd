"""The evaluation run: tasks -> collector episodes (through the MCP env) -> per-question records ->
metrics overall, per difficulty and per database (+ pass@k when sampled) -> offline files.

    run = run_evaluation(tasks, runtime, "oracle" | policy, settings, EvalOptions(...))
    reports.evaluation.write_outputs(run, OutputPaths.beside(Path("results.json")))  # + the files beside it

One `TrajectoryCollector.collect` call over all tasks produces the episodes a `weave.Evaluation`
consumes (`weave_eval`).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from skyrl_tool_agent.config import UserInputError
from skyrl_tool_agent.data.tasks import Task
from skyrl_tool_agent.env.pools import EnvRuntime
from skyrl_tool_agent.eval.anatomy import anatomy_counts, classify_episodes
from skyrl_tool_agent.eval.compare import sorted_difficulties
from skyrl_tool_agent.eval.metrics import evaluation_breakdown, evaluation_metrics, group_by, is_exact_match
from skyrl_tool_agent.eval.vocabulary import localise, vocabulary
from skyrl_tool_agent.policy.sampling_params import GREEDY, SamplingParams
from skyrl_tool_agent.rollout.agents import make_agent
from skyrl_tool_agent.rollout.collector import CollectorSettings, TrajectoryCollector
from skyrl_tool_agent.rollout.openai_agent import Endpoint, probe_endpoint
from skyrl_tool_agent.rollout.trajectory import Trajectory

logger = logging.getLogger(__name__)

ORACLE = "oracle"
OPENAI = "openai"  # a model behind an OpenAI-compatible endpoint


@dataclass(frozen=True)
class EvalOptions:
    """How an evaluation samples and how it is named/tracked.

    `num_samples` episodes per question, sampled with `sampling` (greedy: then `num_samples` must be 1).
    `weave_mode` is usually `weave_eval.weave_mode(config.training.wandb.mode)`.
    """

    num_samples: int = 1
    sampling: SamplingParams = GREEDY
    name: str = "sql-eval"
    weave_project: str = "skyrl-tool-agent"
    weave_mode: Literal["online", "disabled"] = "disabled"
    model_path: str | None = None
    step: int | None = None
    seed: int = 0  # seeds sampled requests to a served model (local models: torch.manual_seed)
    family: str = "sql"  # the task family's name (`TaskFamily.name`): the words of the outputs (`eval.vocabulary`)

    def __post_init__(self) -> None:
        if self.num_samples < 1:
            raise UserInputError(f"--num-samples must be >= 1, got {self.num_samples}")
        if self.num_samples > 1 and self.sampling.greedy:
            raise UserInputError("pass@k with --num-samples > 1 needs sampling: give --temperature > 0")


@dataclass
class EvaluationRun:
    """An evaluation's outcome: `results` (results.json), `records` (one per question, the JSONL)
    and the raw trajectories."""

    results: dict[str, Any]
    records: list[dict[str, Any]]
    trajectories: list[Trajectory] = field(repr=False)


def policy_kind(policy: Any) -> str:
    """How results.json names the evaluated policy."""
    if isinstance(policy, Endpoint):
        return OPENAI
    return ORACLE if policy == ORACLE else "agent" if hasattr(policy, "act") else "model"


class EpisodeRunner:
    """Runs every task's episodes in one collector call and hands them out per task as they finish
    (the `weave_eval.EpisodeSource` that `PolicyModel.predict` awaits)."""

    def __init__(self, collector: TrajectoryCollector, tasks: Sequence[Task], num_samples: int,
                 on_episode: Callable[[Trajectory], None] | None = None) -> None:
        ids = [t.task_id for t in tasks]
        if len(set(ids)) != len(ids):
            raise UserInputError("duplicate task ids in the evaluation set")
        self.collector = collector
        self.tasks = list(tasks)
        self.num_samples = num_samples
        self.on_episode = on_episode
        self._done: dict[str, list[Trajectory]] = defaultdict(list)
        self._futures: dict[str, asyncio.Future[list[Trajectory]]] = {}
        self._job: asyncio.Task[list[Trajectory]] | None = None

    def start(self) -> None:
        """Start collecting (inside the running event loop)."""
        loop = asyncio.get_running_loop()
        self._futures = {t.task_id: loop.create_future() for t in self.tasks}
        self._job = asyncio.create_task(self.collector.collect(self.tasks, self.num_samples, on_episode_done=self._episode))
        self._job.add_done_callback(self._finished)

    def _episode(self, traj: Trajectory) -> None:
        group = self._done[traj.task_id]
        group.append(traj)
        if self.on_episode is not None:
            self.on_episode(traj)
        if len(group) == self.num_samples and not self._futures[traj.task_id].done():
            self._futures[traj.task_id].set_result(sorted(group, key=lambda t: t.group_index))

    def _finished(self, job: asyncio.Task[list[Trajectory]]) -> None:
        error = RuntimeError("evaluation cancelled") if job.cancelled() else job.exception()
        if error is None:
            return
        for future in self._futures.values():
            if not future.done():
                future.set_exception(error)
                future.exception()  # retrieved here too: the job re-raises it once, in wait()

    async def episodes(self, task_id: str) -> list[Trajectory]:
        return await asyncio.shield(self._futures[task_id])

    async def wait(self) -> list[Trajectory]:
        """All trajectories, task-major (re-raises a collector failure)."""
        assert self._job is not None, "start() first"
        return await self._job


async def _run_episodes(runner: EpisodeRunner, options: EvalOptions, policy_name: str) -> tuple[list[Trajectory], dict[str, Any]]:
    from skyrl_tool_agent.eval.weave_setup import prepare_weave

    prepare_weave(options.weave_mode)  # before weave is first imported (see weave_setup)
    from skyrl_tool_agent.eval.weave_eval import PolicyModel, object_name, run_weave_evaluation, weave_session

    runner.start()
    weave_info: dict[str, Any] = {}
    try:
        with weave_session(options.weave_project, options.weave_mode) as mode:
            weave_info["mode"] = mode
            model = PolicyModel(name=object_name(_model_name(policy_name, options)), policy=policy_name,
                                model_path=options.model_path, step=options.step, num_samples=options.num_samples,
                                temperature=options.sampling.temperature)
            try:
                weave_info["summary"] = await run_weave_evaluation(runner.tasks, runner, model, name=options.name,
                                                                 sql=options.family == "sql")
            except Exception as exc:  # noqa: BLE001 - Weave trouble must not lose the evaluation itself
                logger.warning("weave.Evaluation failed (%s: %s); results come from the episodes alone",
                               type(exc).__name__, exc)
                weave_info["error"] = f"{type(exc).__name__}: {exc}"
        return await runner.wait(), weave_info
    finally:
        aclose = getattr(runner.collector.agent, "aclose", None)  # an HTTP client, for served models
        if aclose is not None:
            await aclose()


def _model_name(policy_name: str, options: EvalOptions) -> str:
    base = Path(options.model_path or "embedded").name or "model" if policy_name in ("model", OPENAI) else policy_name
    return f"{base}-step{options.step}" if options.step is not None else base


def run_evaluation(
    tasks: Sequence[Task],
    runtime: EnvRuntime,
    policy: Any,
    settings: CollectorSettings,
    options: EvalOptions | None = None,
    *,
    skipped: int = 0,
    metadata: dict[str, Any] | None = None,
    on_episode: Callable[[Trajectory], None] | None = None,
) -> EvaluationRun:
    """Evaluate `policy` ('oracle', a `QwenPolicy`, an `Endpoint` or an `Agent`) on `tasks` through
    `runtime`'s MCP env. An `Endpoint` is probed first (one `EndpointError` line before any episode)
    and results.json gets its `endpoint` entry (`OpenAIChatAgent.summary`). `on_episode` is called
    as each episode finishes.
    """
    options = options or EvalOptions()
    if not tasks:
        raise UserInputError("no tasks to evaluate")
    served = probe_endpoint(policy) if isinstance(policy, Endpoint) else None
    if served is not None and served["model"] != policy.model:  # the name the server takes for --model
        served["requested_model"] = policy.model
        policy = replace(policy, model=served["model"])
    if served is not None and options.model_path is None:
        options = replace(options, model_path=policy.model)
    agent = make_agent(policy, options.sampling, seed=options.seed)  # its tokenizer (None: text) records tokens
    collector = TrajectoryCollector(runtime, agent, tokenizer=agent.tokenizer, settings=settings)
    runner = EpisodeRunner(collector, tasks, options.num_samples, on_episode)
    policy_name = policy_kind(policy)
    start = time.monotonic()
    trajectories, weave_info = asyncio.run(_run_episodes(runner, options, policy_name))
    seconds = time.monotonic() - start
    run = scored_run(tasks, trajectories, runtime.db_root, family=options.family, num_samples=options.num_samples,
                     skipped=skipped)
    run.results.update({  # metadata last: it may name the policy (a task family's oracle is an agent)
        "name": options.name, "policy": policy_name, "model_path": options.model_path, "step": options.step,
        "temperature": options.sampling.temperature, "top_p": options.sampling.top_p, "max_turns": settings.max_turns,
        "seconds": seconds, "episodes_per_s": len(trajectories) / seconds if seconds > 0 else 0.0,
        "weave": weave_info, **(metadata or {}),
    })
    if served is not None:
        run.results["endpoint"] = {**policy.describe(), **served, **agent.summary()}
    return run


def scored_run(tasks: Sequence[Task], trajectories: Sequence[Trajectory], db_root: Path, *, family: str = "sql",
               num_samples: int = 1, skipped: int = 0) -> EvaluationRun:
    """Finished episodes of `tasks` as `compute_results` and `build_records`, with each episode's
    error category (`anatomy`, on the databases under `db_root`) for a SQL family."""
    categories = (classify_episodes(trajectories, {t.task_id: t.gold_sql for t in tasks}, db_root)
                  if vocabulary(family).sql else None)
    results = compute_results(tasks, trajectories, num_samples=num_samples, skipped=skipped, family=family,
                              categories=categories)
    return EvaluationRun(results, build_records(tasks, trajectories, family=family, categories=categories),
                         list(trajectories))


def difficulty_of(task: Task) -> str:
    """The reporting bucket: Spider's official hardness (easy/medium/hard/extra) when known."""
    return task.spider_hardness or task.difficulty


def compute_results(tasks: Sequence[Task], trajectories: Sequence[Trajectory], *, num_samples: int = 1,
                    skipped: int = 0, family: str = "sql",
                    categories: Sequence[str | None] | None = None) -> dict[str, Any]:
    """Metrics overall, `by_difficulty` and `by_db`, in the words of task family `family`
    (`eval.vocabulary`); `categories` (each episode's error category) counted as `error_anatomy`."""
    by_id = {t.task_id: t for t in tasks}
    gold = {t.task_id: t.gold_sql for t in tasks}
    results = evaluation_metrics(trajectories, gold, num_samples)
    results["skipped"] = skipped
    results["num_samples"] = num_samples
    by_difficulty = evaluation_breakdown(trajectories, gold, lambda t: difficulty_of(by_id[t.task_id]), num_samples)
    results["by_difficulty"] = {k: by_difficulty[k] for k in sorted_difficulties(by_difficulty)}
    results["by_db"] = evaluation_breakdown(trajectories, gold, lambda t: t.result.db_id, num_samples)
    words = vocabulary(family)
    if not words.sql:
        localise(results, words)
        for group in results["by_difficulty"].values():
            localise(group, words)
        by_db = {db: localise(group, words) for db, group in results["by_db"].items() if db}
        results["by_db"] = by_db
    if categories is not None:
        results["error_anatomy"] = anatomy_counts(categories, int(results.get("scored") or 0))
    results["family"], results["headline"] = family, words.accuracy
    # Compare only like with like: `--compare` checks this fingerprint of the question set.
    results["task_ids_sha1"] = hashlib.sha1("\n".join(sorted(by_id)).encode()).hexdigest()
    return results


def build_records(tasks: Sequence[Task], trajectories: Sequence[Trajectory], *,
                  family: str = "sql", categories: Sequence[str | None] | None = None) -> list[dict[str, Any]]:
    """One JSON-friendly record per question, in `tasks`' order: the task, its samples (with their
    `error_category` from `categories`) and its pass counts; another family names the reference
    `ground_truth` and has no db_id."""
    words = vocabulary(family)
    groups = group_by(trajectories, lambda t: t.task_id)
    category_of = {id(t): c for t, c in zip(trajectories, categories)} if categories is not None else {}
    records = []
    for task in tasks:
        samples = []
        for traj in sorted(groups.get(task.task_id, []), key=lambda t: t.group_index):
            sample = traj.to_record()
            if words.sql:
                sample["exact_match"] = is_exact_match(traj.result.final_sql, task.gold_sql)
            if id(traj) in category_of:
                sample["error_category"] = category_of[id(traj)]
            samples.append(sample)
        correct = sum(bool(s["solved"]) for s in samples)
        records.append({
            "task_id": task.task_id, **({"db_id": task.db_id} if words.sql or task.db_id else {}),
            "question": task.question, words.truth_key: task.gold_sql,
            "difficulty": difficulty_of(task), "source": task.source, "split": task.split,
            "num_samples": len(samples), "num_correct": correct,
            "solved": bool(samples) and bool(samples[0]["solved"]),
            # False: the first sample was lost to infrastructure, so `solved` is no outcome
            "scored": bool(samples) and samples[0].get("done_reason") != "error",
            "samples": samples,
        })
    return records
