"""Evaluate a policy on text-to-SQL through the same MCP environment as training.

    skyrl-tool-agent eval --policy oracle --dataset spider --split dev --limit 200 --output out.json
    skyrl-tool-agent eval --policy model                       # the embedded default model
    skyrl-tool-agent eval --policy model --model-path runs/grpo/final --compare base.json --output-dir runs/eval
    skyrl-tool-agent eval --policy model --num-samples 8 --temperature 0.8   # pass@k
    skyrl-tool-agent eval --policy openai --base-url http://localhost:8000/v1 --model Qwen/Qwen2.5-7B-Instruct

(`python training/scripts/evaluate.py` is the same command.) Greedy by default. Writes the results
file (--output FILE, default results.json; or --output-dir DIR: DIR/results.json) with
execution_accuracy, exact_match, n, skipped, by_difficulty, by_db, ... and next to it
<stem>_trajectories.jsonl (one line per question), <stem>_by_difficulty.png, <stem>_errors.png
(why the wrong answers are wrong: `error_anatomy` in the results, `error_category` per sample)
and <stem>_report.html (self-contained). With WANDB_API_KEY the run is
also a Weave evaluation; without it Weave stays disabled and nothing touches the network.
`--limit N` takes a deterministic subset stratified by difficulty (same N and --seed, same questions).
`--policy openai` runs the same episodes against a served model through its OpenAI-compatible
chat-completions API (vLLM, SGLang, `transformers serve`, ...; API key from $OPENAI_API_KEY or
--api-key-env, none needed locally); docs/serving.md has the server command lines.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from skyrl_tool_agent.jobs.progress import ProgressLines, setup_logging
from skyrl_tool_agent.commands._args import (
    add_mcp_server,
    add_output_dir,
    add_task_file,
    new_parser,
    task_file_args,
)
from skyrl_tool_agent.config import add_config_args, cli_main_guard, config_from_args

#: The results file's name inside --output-dir (and the default --output).
RESULTS_FILE = "results.json"


def parse_args(argv: list[str] | None = None, prog: str | None = None) -> argparse.Namespace:
    p = new_parser(__doc__, prog)
    p.add_argument("--policy", choices=["model", "oracle", "openai"], default="model",
                   help="model = a model/adapter (see --model-path); oracle = the scripted gold-SQL agent; "
                   "openai = a served model behind an OpenAI-compatible endpoint (see --base-url)")
    p.add_argument("--model-path", help="trained adapter/model dir (e.g. <run>/final or a checkpoint), a hub "
                   "name, or 'embedded'; default: model.name_or_path of the config")
    served = p.add_argument_group("served model (--policy openai)")
    served.add_argument("--base-url", help="API root of the OpenAI-compatible server, e.g. http://localhost:8000/v1")
    served.add_argument("--model", help="the model's name on that server (what its /v1/models lists)")
    served.add_argument("--api-key-env", default="OPENAI_API_KEY", metavar="VAR",
                        help="environment variable holding the API key (default OPENAI_API_KEY; unset: no key)")
    served.add_argument("--request-timeout", type=float, default=300.0, metavar="S",
                        help="deadline of one request, connect to the last byte of the answer, i.e. of a generated turn (default 300)")
    served.add_argument("--max-retries", type=int, default=4,
                        help="retries of a request that got 429/408/5xx or no answer (default 4)")
    served.add_argument("--retry-backoff", type=float, default=1.0, metavar="S",
                        help="first wait before a retry, doubled each time up to 30 s (default 1)")
    p.add_argument("--dataset", choices=["builtin", "spider"], help="SQL dataset (default: training.data.dataset of "
                   "the config, builtin); the task family is env.task_family (e.g. --config configs/examples/inventory.yaml)")
    p.add_argument("--split", choices=["dev", "train", "validation", "test"], default="dev",
                   help="which tasks (eval.splits, as training means them): dev (reported), train (the training file), "
                   "validation (the generated pool's held-out split, what settings are tuned on; builtin only), "
                   "test (in-family tasks on databases of their own, never trained or tuned on; builtin only)")
    p.add_argument("--spider-root", help="Spider directory (default: training.data.spider_root, ../shared/spider)")
    p.add_argument("--skip-bad-records", action="store_true",
                   help="leave out task records that fail the checks at load (a missing field, an unknown db_id, "
                        "gold SQL that fails, ...; each is reported) instead of refusing to start")
    p.add_argument("--limit", type=int, help="evaluate a stratified subset of N questions")
    p.add_argument("--seed", type=int, default=0, help="seed of the --limit subset and of sampling")
    p.add_argument("--num-samples", type=int, default=1, help="episodes per question; > 1 reports pass@k")
    p.add_argument("--temperature", type=float, help="sampling temperature (default 0 = greedy; with "
                   "--num-samples > 1: grpo.temperature)")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--max-turns", type=int, help="turns per episode (default grpo.max_turns)")
    p.add_argument("--concurrency", type=int, help="episodes in flight (default env.collector.concurrency)")
    p.add_argument("--output", metavar="FILE", help=f"results JSON (default {RESULTS_FILE}; the other files are "
                   "named after its stem, beside it)")
    add_output_dir(p, f"write {RESULTS_FILE} and the files beside it into DIR; "
                   "excludes --output")
    p.add_argument("--trajectories", help="per-question JSONL (default <output stem>_trajectories.jsonl)")
    p.add_argument("--report", help="HTML report (default <output stem>_report.html)")
    p.add_argument("--no-report", action="store_true", help="skip the HTML report")
    p.add_argument("--compare", metavar="BASE_RESULTS.json", help="print this run against a baseline results.json")
    p.add_argument("--rollouts", metavar="ROLLOUTS.jsonl", help="add a training run's sampled episodes "
                   "(<output_dir>/rollouts.jsonl) to the report, as a Training rollouts view")
    p.add_argument("--name", help="evaluation name (Weave); default <dataset>-<split>")
    add_config_args(p)
    add_task_file(p)
    add_mcp_server(p)
    args = p.parse_args(argv)
    if args.output and args.output_dir:
        p.error("--output FILE and --output-dir DIR both name the results file; give one")
    if args.policy == "openai" and not (args.base_url and args.model):
        p.error("--policy openai needs --base-url URL and --model NAME")
    if args.policy != "openai" and (args.base_url or args.model):
        p.error("--base-url and --model are for --policy openai (a local model is --model-path)")
    args.results = Path(args.output_dir) / RESULTS_FILE if args.output_dir else Path(args.output or RESULTS_FILE)
    return args


def _progress():  # a rich bar advanced by the collector as episodes finish
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    return Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    TextColumn("ETA"), TimeRemainingColumn(), TextColumn("{task.fields[info]}"), refresh_per_second=4)


def _print_summary(results: dict, paths) -> None:
    from rich.console import Console
    from rich.table import Table

    from skyrl_tool_agent.eval.vocabulary import vocabulary_of

    words = vocabulary_of(results)
    table = Table(title=f"{results['name']} — {results['policy']} (n={results['n']}, skipped={results['skipped']}, "
                        f"{results['seconds']:.1f} s)")
    from skyrl_tool_agent.eval.metrics import format_rate

    sql = ("exact", "valid SQL") if words.sql else ()
    for col in ("", "n", "scored", "infra err", words.short, *sql, "turns", "tool calls", "tool err"):
        table.add_column(col, justify="left" if not col else "right")

    def row(name: str, m: dict) -> None:  # rates are over the scored episodes; None: nothing scored
        sql = (format_rate(m["exact_match"]), format_rate(m.get("valid_sql_rate"))) if words.sql else ()
        table.add_row(name, str(m["n"]), f"{m.get('scored', 0):.0f}", f"{m.get('infra_errors', 0):.0f}",
                      format_rate(m[words.accuracy]), *sql, format_rate(m["mean_turns"], digits=2),
                      format_rate(m["mean_tool_calls"], digits=2), format_rate(m["tool_error_rate"]))

    row("overall", results)
    for name, m in results["by_difficulty"].items():
        row(name, m)
    console = Console()
    console.print(table)
    for k, v in (results.get("pass_at_k") or {}).items():
        console.print(f"pass@{k}: {format_rate(v)}")
    if endpoint := results.get("endpoint"):
        refused = ", ".join(f"{reason} {n}" for reason, n in (endpoint.get("protocol_errors") or {}).items())
        console.print(f"endpoint {endpoint['base_url']} · model {endpoint['model']} · {endpoint['requests']} requests, "
                      f"{endpoint['retries']} retries, {endpoint['failed_turns']} turns the server could not produce"
                      + (f" · episodes unscored by its answers: {refused}" if refused else ""))
    if anatomy := results.get("error_anatomy"):
        from skyrl_tool_agent.eval.anatomy import LABELS

        parts = ", ".join(f"{LABELS[c]} {n}" for c, n in anatomy["counts"].items() if n)
        console.print(f"why answers are wrong ({anatomy['wrong']} of {anatomy['scored']} scored): {parts or 'none wrong'}")
    console.print(f"{words.short} {format_rate(results[words.accuracy], results)} · results {paths.results} · trajectories {paths.trajectories}"
                  + (f" · report {paths.report}" if "report" in results.get("files", {}) else ""))


def main(argv: list[str] | None = None, prog: str | None = None) -> None:
    args = parse_args(argv, prog)
    setup_logging()
    with cli_main_guard(also=(FileNotFoundError,)):
        from skyrl_tool_agent.config import UserInputError
        from skyrl_tool_agent.env.families import family_oracle, resolve_family
        from skyrl_tool_agent.eval.compare import (
            anatomy_comparison,
            load_results,
            print_anatomy,
            print_comparison,
            run_labels,
        )
        from skyrl_tool_agent.eval.evaluate import (
            OPENAI,
            ORACLE,
            EvalOptions,
            collector_settings,
            run_evaluation,
        )
        from skyrl_tool_agent.reports.evaluation import OutputPaths, write_outputs
        from skyrl_tool_agent.reports.rollouts import load_rollouts
        from skyrl_tool_agent.eval.splits import load_eval_tasks
        from skyrl_tool_agent.eval.vocabulary import vocabulary
        from skyrl_tool_agent.eval.weave_setup import weave_mode
        from skyrl_tool_agent.jobs.run import open_run

        extra = [f"training.data.dataset={args.dataset}"] if args.dataset else []
        if args.spider_root:
            extra.append(f"training.data.spider_root={json.dumps(args.spider_root)}")
        args.overrides = [*extra, *args.overrides]
        task_file_args(args)
        # --profile auto decides from the model this evaluation loads (--model-path, else the config's)
        config = config_from_args(args, model_path=args.model_path if args.policy == "model" else None)
        baseline = load_results(args.compare) if args.compare else None  # fail before the run, not after
        rollouts = load_rollouts(args.rollouts) if args.rollouts else None
        if args.policy in (ORACLE, OPENAI) and args.model_path:
            raise UserInputError("--model-path is for --policy model")
        from skyrl_tool_agent.policy.sampling_params import SamplingParams

        temperature = args.temperature if args.temperature is not None else (
            config.grpo.temperature if args.num_samples > 1 else 0.0)
        family = resolve_family(config.env.task_family)
        selection = load_eval_tasks(config, args.split, limit=args.limit, seed=args.seed,
                                    skip_bad_records=args.skip_bad_records)
        w = config.training.wandb
        options = EvalOptions(
            num_samples=args.num_samples, sampling=SamplingParams(temperature=temperature, top_p=args.top_p),
            name=args.name or f"{config.training.data.dataset if family.uses_databases else family.name}-{args.split}", weave_project=w.weave_project(),
            weave_mode=weave_mode(w.mode), seed=args.seed,
            model_path={"model": args.model_path or config.model.name_or_path, OPENAI: args.model}.get(args.policy),
            family=family.name,
        )
        words = vocabulary(family.name)
        # Requests to a server are independent: no lockstep batches (their order cannot change a result).
        settings = collector_settings(config, max_turns=args.max_turns, concurrency=args.concurrency, evaluation=True,
                                      deterministic=args.policy != OPENAI)
        policy = family_oracle(family) or ORACLE if args.policy == ORACLE else ORACLE
        if args.policy == OPENAI:
            from skyrl_tool_agent.rollout.openai_agent import Endpoint, probe_endpoint

            policy = Endpoint.from_env(args.base_url, args.model, api_key_env=args.api_key_env,
                                       timeout_s=args.request_timeout, max_retries=args.max_retries,
                                       backoff_s=args.retry_backoff, concurrency=settings.concurrency)
            probe_endpoint(policy)  # a dead server or an unknown model fails here, before the MCP servers start
        elif args.policy == "model":
            import torch

            from skyrl_tool_agent.eval.policies import load_eval_policy

            torch.manual_seed(args.seed)  # sampled runs (--num-samples) repeat for a seed
            policy = load_eval_policy(args.model_path, config.model)
        paths = OutputPaths.beside(args.results, trajectories=args.trajectories and Path(args.trajectories),
                                   report=args.report and Path(args.report))
        metadata = {"policy": args.policy, "family": family.name, "dataset": selection.dataset, "split": selection.split, "available": selection.available,
                    "skipped_reasons": selection.skipped_reasons, "limit": args.limit, "seed": args.seed}
        with open_run(config, selection.db_root) as opened:
            total = len(selection.tasks) * args.num_samples
            with _progress() as bar:
                job = bar.add_task(f"eval {options.name}", total=total, info="")
                solved = [0, 0]
                # In a log file the bar is invisible: lines with done/total and the ETA instead.
                lines = None if bar.console.is_terminal else ProgressLines(f"eval {options.name}", total)

                def on_episode(traj) -> None:
                    solved[0] += traj.result.solved
                    solved[1] += 1
                    info = f"{words.short} {solved[0] / solved[1]:.3f}"
                    bar.update(job, advance=1, info=info)
                    if lines is not None:
                        lines.advance(info=info)

                run = run_evaluation(selection.tasks, opened.runtime, policy, settings, options, skipped=selection.skipped,
                                     metadata=metadata, on_episode=on_episode)
        write_outputs(run, paths, baseline=baseline, report=not args.no_report, rollouts=rollouts, db_root=selection.db_root)
        _print_summary(run.results, paths)
        if baseline is not None:
            base_label, current_label = run_labels(args.compare, args.results)
            print_comparison(baseline, run.results, base_label=base_label, current_label=current_label,
                             records=run.records)
            if rows := anatomy_comparison(baseline, run.records):
                print_anatomy(rows, base_label=base_label, current_label=current_label)


if __name__ == "__main__":
    main()
