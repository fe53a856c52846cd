"""The evaluate job (`skyrl-tool-agent eval`): load the tasks and the policy, play every episode
through the MCP environment with a progress bar, write results.json and the files beside it,
print the summary and, given a baseline, the comparison. `evaluate` is the job, top to bottom."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from skyrl_tool_agent.config import Config
from skyrl_tool_agent.eval.evaluate import EvaluationRun
from skyrl_tool_agent.policy.sampling_params import SamplingParams
from skyrl_tool_agent.reports.evaluation import OutputPaths
from skyrl_tool_agent.rollout.openai_agent import Endpoint


@dataclass(frozen=True)
class EvalRequest:
    """What the eval command's flags ask for: `policy` 'model' (`model_path`, else the config's
    model), 'oracle' or 'openai' (`endpoint`; the collector's concurrency sets its own); the
    `split`'s tasks (a stratified `limit` of them, drawn by `seed`); `num_samples` episodes a question
    at `temperature` (None: greedy, or grpo.temperature when sampled); where the files go."""

    policy: str
    split: str
    paths: OutputPaths
    model_path: str | None = None
    endpoint: Endpoint | None = None
    limit: int | None = None
    seed: int = 0
    skip_bad_records: bool = False
    num_samples: int = 1
    temperature: float | None = None
    top_p: float = 1.0
    max_turns: int | None = None
    concurrency: int | None = None
    name: str | None = None
    report: bool = True
    compare: str | None = None  # a baseline results.json to print this run against
    rollouts: str | None = None  # a training run's rollouts.jsonl, a view of the report


def evaluate(config: Config, ask: EvalRequest) -> EvaluationRun:
    """Evaluate as `ask` says on `config`'s task family and MCP servers; writes `ask.paths`."""
    from skyrl_tool_agent.env.families import family_oracle, resolve_family
    from skyrl_tool_agent.eval.compare import anatomy_comparison, load_results, run_labels
    from skyrl_tool_agent.eval.evaluate import OPENAI, ORACLE, EvalOptions, run_evaluation
    from skyrl_tool_agent.eval.splits import load_eval_tasks
    from skyrl_tool_agent.eval.vocabulary import vocabulary
    from skyrl_tool_agent.eval.weave_setup import weave_mode
    from skyrl_tool_agent.jobs.progress import evaluation_progress
    from skyrl_tool_agent.jobs.run import open_run
    from skyrl_tool_agent.reports.evaluation import print_anatomy, print_comparison, print_results, write_outputs
    from skyrl_tool_agent.reports.rollouts import load_rollouts
    from skyrl_tool_agent.rollout.collector import CollectorSettings
    from skyrl_tool_agent.rollout.openai_agent import probe_endpoint

    baseline = load_results(ask.compare) if ask.compare else None  # fail before the run, not after
    rollouts = load_rollouts(ask.rollouts) if ask.rollouts else None
    temperature = ask.temperature if ask.temperature is not None else (
        config.grpo.temperature if ask.num_samples > 1 else 0.0)
    family = resolve_family(config.env.task_family)
    selection = load_eval_tasks(config, ask.split, limit=ask.limit, seed=ask.seed,
                                skip_bad_records=ask.skip_bad_records)
    w = config.training.wandb
    options = EvalOptions(
        num_samples=ask.num_samples, sampling=SamplingParams(temperature=temperature, top_p=ask.top_p),
        name=ask.name or f"{config.training.data.dataset if family.uses_databases else family.name}-{ask.split}",
        weave_project=w.weave_project(), weave_mode=weave_mode(w.mode), seed=ask.seed,
        model_path={"model": ask.model_path or config.model.name_or_path,
                    OPENAI: ask.endpoint and ask.endpoint.model}.get(ask.policy),
        family=family.name,
    )
    # Requests to a server are independent: no lockstep batches (their order cannot change a result).
    settings = CollectorSettings.from_config(config, max_turns=ask.max_turns, concurrency=ask.concurrency,
                                             evaluation=True, deterministic=ask.policy != OPENAI)
    policy: Any
    if ask.policy == OPENAI:
        assert ask.endpoint is not None, "--policy openai comes with its endpoint"
        policy = replace(ask.endpoint, concurrency=settings.concurrency)
        probe_endpoint(policy)  # a dead server or an unknown model fails here, before the MCP servers start
    elif ask.policy == ORACLE:
        policy = family_oracle(family) or ORACLE
    else:
        import torch

        from skyrl_tool_agent.eval.policies import load_eval_policy

        torch.manual_seed(ask.seed)  # sampled runs (--num-samples) repeat for a seed
        policy = load_eval_policy(ask.model_path, config.model)
    metadata = {"policy": ask.policy, "family": family.name, "dataset": selection.dataset, "split": selection.split,
                "available": selection.available, "skipped_reasons": selection.skipped_reasons, "limit": ask.limit,
                "seed": ask.seed}
    total = len(selection.tasks) * ask.num_samples
    with open_run(config, selection.db_root) as opened, \
            evaluation_progress(f"eval {options.name}", total, vocabulary(family.name).short) as on_episode:
        run = run_evaluation(selection.tasks, opened.runtime, policy, settings, options, skipped=selection.skipped,
                             metadata=metadata, on_episode=on_episode)
    write_outputs(run, ask.paths, baseline=baseline, report=ask.report, rollouts=rollouts, db_root=selection.db_root)
    print_results(run.results, ask.paths)
    if baseline is not None:
        base_label, current_label = run_labels(ask.compare, ask.paths.results)
        print_comparison(baseline, run.results, base_label=base_label, current_label=current_label, records=run.records)
        if rows := anatomy_comparison(baseline, run.records):
            print_anatomy(rows, base_label=base_label, current_label=current_label)
    return run
