"""Build the embedded default model (tokenizer + tiny Qwen2 + supervised warm start).

    skyrl-tool-agent build-model [--force] [--sft-steps N] [--output-dir DIR]
    skyrl-tool-agent build-model --ship DIR     # make DIR the shipped default
    python training/scripts/build_default_model.py ...   # the same command

The package ships a built model (skyrl_tool_agent/assets/embedded; its warmstart.json holds the
command that built it). A build goes to --output-dir, else model.embedded_dir, else the cache
($SKYRL_TOOL_AGENT_CACHE/embedded or ~/.cache/skyrl_tool_agent/embedded); train --rebuild
builds there and trains from it. The warm-start curve (loss, held-out execution accuracy on the
generated pool's validation split per eval step) is saved as warmstart.json. --ship writes a
built directory into the package in bf16 with the sha256 of each file and a greedy check.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from skyrl_tool_agent.commands._args import add_output_dir, new_parser
from skyrl_tool_agent.config import add_config_args, cli_main_guard, config_from_args


def build_parser(prog: str | None = None) -> argparse.ArgumentParser:
    p = new_parser(__doc__, prog)
    add_config_args(p)
    p.add_argument("--force", action="store_true", help="rebuild even if a model is cached")
    p.add_argument("--sft-steps", type=int, help="warm-start steps, all run (default: SFTSettings.steps or its time budget, whichever ends first)")
    p.add_argument("--eval-every", type=int, help="held-out evaluation cadence during the warm start")
    add_output_dir(p, "output directory (default: model.embedded_dir, else the cache)",
                   legacy=("--out",))
    p.add_argument("--ship", metavar="BUILT_DIR", help="ship an already built model as the package default and exit")
    return p


def main(argv: list[str] | None = None, prog: str | None = None) -> None:
    args = build_parser(prog).parse_args(argv)
    from skyrl_tool_agent.cli import setup_logging, training_progress

    setup_logging()
    with cli_main_guard(also=(FileNotFoundError,)):
        from skyrl_tool_agent.pipeline import build_embedded, load_task_splits, ship_embedded

        config = config_from_args(args)
        if args.ship:
            record = ship_embedded(config, Path(args.ship).expanduser())
            check = record["greedy_check"]
            print(f"shipped: greedy check EX {check['execution_accuracy']:.3f} on {len(check['solved'])} validation tasks")
            return
        train, dev, db_root = load_task_splits(config)
        out = Path(args.output_dir) if args.output_dir else None
        with training_progress(1) as progress:
            report = build_embedded(config, train, dev, db_root, out=out, force=args.force, sft_steps=args.sft_steps,
                                    eval_every=args.eval_every, progress=progress,
                                    provenance={"command": " ".join(["python", "training/scripts/build_default_model.py",
                                                                     *(sys.argv[1:] if argv is None else argv)])})
    print(json.dumps({k: v for k, v in report.items() if k != "sft"}, indent=1))
    for row in report.get("sft", {}).get("evals", []):
        print(f"warm start step {row['step']:4d} ({row['seconds']:6.1f} s): held-out EX {row['execution_accuracy']:.3f}")


if __name__ == "__main__":
    main()
