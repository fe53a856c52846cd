#!/usr/bin/env python
"""Build the embedded default model (tokenizer + tiny Qwen2 + supervised warm start) and cache it.

    python training/scripts/build_default_model.py [--force] [--sft-steps N]

train_grpo.py runs this automatically when the embedded model is asked for and missing. The
cache is $SKYRL_TOOL_AGENT_CACHE/embedded, else model.embedded_dir (configs/model_config.yaml).
The warm-start curve (loss, held-out execution accuracy per eval step) is saved as warmstart.json.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from skyrl_tool_agent.cli import setup_logging, training_progress  # noqa: E402
from skyrl_tool_agent.config import add_config_args, cli_main_guard, config_from_args  # noqa: E402


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_config_args(p)
    p.add_argument("--force", action="store_true", help="rebuild even if a model is cached")
    p.add_argument("--sft-steps", type=int, help="warm-start steps, all run (default: SFTSettings.steps or its time budget, whichever ends first)")
    p.add_argument("--eval-every", type=int, help="held-out evaluation cadence during the warm start")
    p.add_argument("--out", help="output directory (default: the embedded cache dir)")
    args = p.parse_args(argv)
    setup_logging()
    with cli_main_guard(also=(FileNotFoundError,)):
        from skyrl_tool_agent.pipeline import build_embedded, load_task_splits

        config = config_from_args(args)
        train, dev, db_root = load_task_splits(config)
        out = Path(args.out) if args.out else None
        with training_progress(1) as progress:
            report = build_embedded(config, train, dev, db_root, out=out, force=args.force, sft_steps=args.sft_steps,
                                    eval_every=args.eval_every, progress=progress)
    print(json.dumps({k: v for k, v in report.items() if k != "sft"}, indent=1))
    for row in report.get("sft", {}).get("evals", []):
        print(f"warm start step {row['step']:4d} ({row['seconds']:6.1f} s): held-out EX {row['execution_accuracy']:.3f}")


if __name__ == "__main__":
    main()
