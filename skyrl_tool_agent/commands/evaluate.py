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

from skyrl_tool_agent.jobs.progress import setup_logging
from skyrl_tool_agent.commands._args import (
    add_mcp_server,
    add_output_dir,
    add_task_file,
    new_parser,
    task_file_args,
)
from skyrl_tool_agent.config import UserInputError, add_config_args, cli_main_guard, config_from_args

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


def main(argv: list[str] | None = None, prog: str | None = None) -> None:
    args = parse_args(argv, prog)
    setup_logging()
    with cli_main_guard(also=(FileNotFoundError,)):
        from skyrl_tool_agent.jobs.evaluate import EvalRequest, evaluate
        from skyrl_tool_agent.reports.evaluation import OutputPaths
        from skyrl_tool_agent.rollout.openai_agent import Endpoint

        extra = [f"training.data.dataset={args.dataset}"] if args.dataset else []
        if args.spider_root:
            extra.append(f"training.data.spider_root={json.dumps(args.spider_root)}")
        args.overrides = [*extra, *args.overrides]
        task_file_args(args)
        # --profile auto decides from the model this evaluation loads (--model-path, else the config's)
        config = config_from_args(args, model_path=args.model_path if args.policy == "model" else None)
        if args.policy != "model" and args.model_path:
            raise UserInputError("--model-path is for --policy model")
        endpoint = Endpoint.from_env(args.base_url, args.model, api_key_env=args.api_key_env,
                                     timeout_s=args.request_timeout, max_retries=args.max_retries,
                                     backoff_s=args.retry_backoff) if args.policy == "openai" else None
        paths = OutputPaths.beside(args.results, trajectories=args.trajectories and Path(args.trajectories),
                                   report=args.report and Path(args.report))
        evaluate(config, EvalRequest(
            policy=args.policy, split=args.split, paths=paths, model_path=args.model_path, endpoint=endpoint,
            limit=args.limit, seed=args.seed, skip_bad_records=args.skip_bad_records, num_samples=args.num_samples,
            temperature=args.temperature, top_p=args.top_p, max_turns=args.max_turns, concurrency=args.concurrency,
            name=args.name, report=not args.no_report, compare=args.compare, rollouts=args.rollouts))
