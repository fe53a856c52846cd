"""The supervised baseline GRPO is compared with: continue the embedded model's warm start for the
same wall time GRPO used, then evaluate greedy on the same fixed dev subset.

    skyrl-tool-agent sft-baseline --minutes 9.5 [--output sft_baseline.json | --output-dir DIR] [--save-model DIR]
    python training/scripts/sft_baseline.py ...      # the same command
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path

from skyrl_tool_agent.commands._args import add_output_dir, new_parser
from skyrl_tool_agent.config import add_config_args, cli_main_guard, config_from_args

#: The result file's name inside --output-dir (and the default --output).
RESULT_FILE = "sft_baseline.json"


def parse_args(argv: list[str] | None = None, prog: str | None = None) -> argparse.Namespace:
    p = new_parser(__doc__, prog)
    add_config_args(p)
    p.add_argument("--minutes", type=float, required=True, help="wall time to spend continuing the warm start")
    p.add_argument("--output", metavar="FILE", help=f"result JSON (default {RESULT_FILE})")
    add_output_dir(p, f"write {RESULT_FILE} into DIR; excludes --output")
    p.add_argument("--save-model", metavar="DIR", type=Path,
                   help="keep the continued model in DIR (a start for GRPO: --set model.name_or_path=DIR)")
    args = p.parse_args(argv)
    if args.output and args.output_dir:
        p.error("--output FILE and --output-dir DIR both name the result file; give one")
    args.result = Path(args.output_dir) / RESULT_FILE if args.output_dir else Path(args.output or RESULT_FILE)
    return args


def main(argv: list[str] | None = None, prog: str | None = None) -> None:
    args = parse_args(argv, prog)
    output = args.result
    from skyrl_tool_agent.jobs.progress import log_every, setup_logging

    setup_logging()
    with cli_main_guard(also=(FileNotFoundError,)):
        from skyrl_tool_agent.jobs.arms import continue_warm_start

        started: list[float] = []  # the supervised clock starts at the first step (after the first evaluation)
        log_due = log_every()

        def progress(step: int, loss: float) -> None:  # throttled lines: readable in a terminal and a log
            if not started:
                started.append(time.monotonic())
            if log_due():
                logging.getLogger("sft_baseline").info("supervised step %d, loss %.3f, %.0f of %.0f s", step, loss,
                                                       time.monotonic() - started[0], 60 * args.minutes)

        result = continue_warm_start(config_from_args(args), args.minutes, progress=progress, save_to=args.save_model)
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(result, indent=1) + "\n")
    from skyrl_tool_agent.eval.metrics import format_rate

    b, a = result["before"], result["after"]
    change = ("" if a["execution_accuracy"] is None or b["execution_accuracy"] is None
              else f" ({a['execution_accuracy'] - b['execution_accuracy']:+.3f})")
    print(f"continued warm start: {result['steps']} steps in {args.minutes} min: dev EX "
          f"{format_rate(b['execution_accuracy'], b)} -> {format_rate(a['execution_accuracy'], a)}{change}")
