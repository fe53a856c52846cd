#!/usr/bin/env python
"""The supervised baseline GRPO is compared with: continue the embedded model's warm start for the
same wall time GRPO used, then evaluate greedy on the same fixed dev subset.

    python training/scripts/sft_baseline.py --minutes 9.5 [--output sft_baseline.json]
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from skyrl_tool_agent.cli import log_every, setup_logging  # noqa: E402
from skyrl_tool_agent.config import add_config_args, cli_main_guard, config_from_args  # noqa: E402


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_config_args(p)
    p.add_argument("--minutes", type=float, required=True, help="wall time to spend continuing the warm start")
    p.add_argument("--output", default="sft_baseline.json")
    args = p.parse_args(argv)
    setup_logging()
    with cli_main_guard(also=(FileNotFoundError,)):
        from skyrl_tool_agent.pipeline import continue_warm_start

        started: list[float] = []  # the supervised clock starts at the first step (after the first evaluation)
        log_due = log_every()

        def progress(step: int, loss: float) -> None:  # throttled lines: readable in a terminal and a log
            if not started:
                started.append(time.monotonic())
            if log_due():
                logging.getLogger("sft_baseline").info("supervised step %d, loss %.3f, %.0f of %.0f s", step, loss,
                                                       time.monotonic() - started[0], 60 * args.minutes)

        result = continue_warm_start(config_from_args(args), args.minutes, progress=progress)
    Path(args.output).write_text(json.dumps(result, indent=1) + "\n")
    b, a = result["before"]["execution_accuracy"], result["after"]["execution_accuracy"]
    print(f"continued warm start: {result['steps']} steps in {args.minutes} min: dev EX {b:.3f} -> {a:.3f} ({a - b:+.3f})")


if __name__ == "__main__":
    main()
