"""From nothing to a GRPO-trained SQL agent within one wall-clock budget, beside the arm RL must
beat (continued supervision from the same start for the same time), all evaluated on dev.

    skyrl-tool-agent speedrun --minutes 7 --output-dir OUT [--hidden-size 384 --layers 6 ...] [--set KEY=VALUE ...]

Phases: build (a fresh Qwen2 with the shipped tokenizer, supervised on the generated pool's oracle
episodes until its validation curve is flat or --build-share of the budget is spent), the start's
dev evaluation, GRPO (16 tasks x 16 episodes through the MCP environment, the rollout engine on
CUDA), continued SFT for GRPO's training time, the report. The budget counts from the command's
start and holds the evaluations too; every phase fails soft, and OUT/speedrun.json is rewritten as
each phase ends (a kill leaves the phases before). OUT gets only flat files: speedrun.json,
speedrun.md (the tables), speedrun.png (the curves), grpo_metrics.jsonl, speedrun.log. Models and
run directories go to --work-dir (default: a new temporary directory). The speedrun's own shape
(`skyrl_tool_agent.jobs.speedrun_plan.SPEEDRUN_OVERRIDES`) comes before --set, which wins. The model size
defaults were not chosen by a measurement.
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
import time
from pathlib import Path

from skyrl_tool_agent.commands._args import add_output_dir, new_parser
from skyrl_tool_agent.config import add_config_args, cli_main_guard, config_from_args
from skyrl_tool_agent.jobs.budget import process_start
from skyrl_tool_agent.jobs.progress import setup_logging


def build_parser(prog: str | None = None) -> argparse.ArgumentParser:
    from skyrl_tool_agent.warmstart.scratch import ModelShape

    shape = ModelShape()
    p = new_parser(__doc__, prog)
    add_config_args(p)
    p.add_argument("--minutes", type=float, default=10.0, help="wall-clock budget of the whole run (default 10)")
    add_output_dir(p, "where the results go (default outputs/speedrun)", default="outputs/speedrun")
    p.add_argument("--work-dir", type=Path, help="models and run directories (default: a new temporary directory)")
    for name, value in (("hidden-size", shape.hidden_size), ("layers", shape.layers), ("heads", shape.heads),
                        ("kv-heads", shape.kv_heads), ("intermediate-size", shape.intermediate_size)):
        p.add_argument(f"--{name}", type=int, default=value, help=f"model shape (default {value})")
    p.add_argument("--build-share", type=float, default=0.45,
                   help="fraction of the budget for the build: oracle episodes and supervision (default 0.45)")
    p.add_argument("--build-steps", type=int, help="supervised steps of the build: the schedule's fixed length, the time "
                   "cap only a guard (default: 2000 on CUDA; elsewhere the schedule is fitted to the time cap)")
    p.add_argument("--rl-pool-tasks", type=int, default=256, help="pool tasks held out of the build for GRPO and the "
                   "SFT arm to train on; no task sharing their gold queries is in the build (default 256)")
    p.add_argument("--sft-batch-size", type=int, default=64, help="supervised batch size, build and SFT arm (default 64)")
    p.add_argument("--pool-tasks", type=int, help="oracle episodes of a stratified subset of N pool tasks (default all)")
    p.add_argument("--validation-tasks", type=int, help="the build's curve on the first N validation tasks (default all)")
    p.add_argument("--build-evaluations", type=int, default=6, help="validation evaluations during the build (default 6)")
    p.add_argument("--points", type=int, default=2,
                   help="dev evaluations per arm, evenly over its training time (default 2; fewer when time is short)")
    return p


def main(argv: list[str] | None = None, prog: str | None = None, *, from_process_start: bool = True) -> int:
    """`from_process_start`: the budget counts from the process's start (interpreter and imports
    included); False (a caller running it in its own long-lived process): from this call."""
    started = process_start() if from_process_start else time.monotonic()  # the main job's clock
    args = build_parser(prog).parse_args(argv)
    setup_logging()
    with cli_main_guard(also=(FileNotFoundError,)):
        from skyrl_tool_agent.jobs.speedrun import Speedrun
        from skyrl_tool_agent.jobs.speedrun_plan import LOG_FILE, SPEEDRUN_OVERRIDES, SpeedrunPlan
        from skyrl_tool_agent.warmstart.scratch import ModelShape

        args.overrides = [*SPEEDRUN_OVERRIDES, *args.overrides]
        config = config_from_args(args)
        plan = SpeedrunPlan(minutes=args.minutes, build_share=args.build_share, build_steps=args.build_steps,
                            sft_batch_size=args.sft_batch_size,
                            shape=ModelShape(args.hidden_size, args.layers, args.heads, args.kv_heads,
                                             args.intermediate_size),
                            pool_tasks=args.pool_tasks, rl_pool_tasks=args.rl_pool_tasks,
                            validation_tasks=args.validation_tasks,
                            build_evaluations=args.build_evaluations, points=args.points)
        plan.check()
        out = Path(args.output_dir).expanduser()
        out.mkdir(parents=True, exist_ok=True)
        work = args.work_dir.expanduser() if args.work_dir else Path(tempfile.mkdtemp(prefix="speedrun-"))
        handler = logging.FileHandler(out / LOG_FILE, mode="w")
        handler.setFormatter(logging.Formatter("[%(asctime)s] %(levelname)s %(message)s", datefmt="%H:%M:%S"))
        logging.getLogger().addHandler(handler)
        logging.getLogger(__name__).info("speedrun: %g min budget, results in %s, models in %s", plan.minutes, out, work)
        command = " ".join(["skyrl-tool-agent speedrun", *(sys.argv[1:] if argv is None else argv)])
        record = Speedrun(config, plan, out, work, started=started, command=command).run()
    failed = {name: p.get("error", p["status"]) for name, p in record["phases"].items() if p["status"] != "ok"}
    print(f"speedrun: {record['elapsed_s']:.0f} s of {60 * plan.minutes:.0f}; results in {out}")
    if failed:
        print("error: " + "; ".join(f"{name}: {why}" for name, why in failed.items()), file=sys.stderr)
        return 1
    return 0
