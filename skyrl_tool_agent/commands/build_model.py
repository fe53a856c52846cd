"""Build the embedded default model (tokenizer + tiny Qwen2 + supervised warm start).

    skyrl-tool-agent build-model [--force] [--sft-steps N] [--output-dir DIR]
    skyrl-tool-agent build-model --ship DIR     # make DIR the shipped default
    skyrl-tool-agent build-model --to-plateau --output-dir DIR [--from MODEL_DIR] [--max-steps N] [--redraw-constants]
    skyrl-tool-agent build-model --frontier [--frontier-tasks N] [--frontier-samples K] [--from MODEL_DIR]
    skyrl-tool-agent build-model --random-shape qwen2.5-1.5b --output-dir /tmp/q15   # random weights, a real model's shape
    python training/scripts/build_default_model.py ...   # the same command

The package ships a built model (skyrl_tool_agent/assets/embedded; its warmstart.json holds the
command that built it). A build goes to --output-dir, else model.embedded_dir, else the cache
($SKYRL_TOOL_AGENT_CACHE/embedded or ~/.cache/skyrl_tool_agent/embedded); train --rebuild
builds there and trains from it. The warm-start curve (loss, held-out execution accuracy on the
generated pool's validation split per eval step) is saved as warmstart.json. --ship writes a
built directory into the package in bf16 with the sha256 of each file and a greedy check.
--to-plateau continues a built model (default: the shipped one) with supervised training on the
generated pool until its validation curve is flat; it checkpoints at every evaluation and the same
command resumes it; the model lands in DIR/model. --redraw-constants (either build): each epoch
the constants a training question states are redrawn from its database, in the question and the
gold query together, so recalling a memorised constant never pays (training.data.redraw_constants).
--random-shape writes a model with a published Qwen2.5 architecture's exact shape and random bf16
weights (the embedded tokenizer), for timing and memory measurements where the real weights
cannot be downloaded (scripts/gpu_check.sh): its turns always run to the token cap and its
rewards are all 0.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from skyrl_tool_agent.commands._args import add_output_dir, new_parser
from skyrl_tool_agent.config import UserInputError, add_config_args, cli_main_guard, config_from_args


def build_parser(prog: str | None = None) -> argparse.ArgumentParser:
    p = new_parser(__doc__, prog)
    add_config_args(p)
    p.add_argument("--force", action="store_true", help="rebuild even if a model is cached")
    p.add_argument("--sft-steps", type=int, help="warm-start steps, all run (default: SFTSettings.steps or its time budget, whichever ends first)")
    p.add_argument("--eval-every", type=int, help="held-out evaluation cadence during the warm start")
    add_output_dir(p, "output directory (default: model.embedded_dir, else the cache)",
                   legacy=("--out",))
    p.add_argument("--ship", metavar="BUILT_DIR", help="ship an already built model as the package default and exit")
    p.add_argument("--to-plateau", action="store_true",
                   help="continue a built model on the generated pool until its validation curve is flat (resumable)")
    p.add_argument("--from", dest="start", metavar="MODEL_DIR", type=Path,
                   help="with --to-plateau: the model to continue; with --frontier: the model measured (default: the shipped one)")
    p.add_argument("--max-steps", type=int, help="with --to-plateau: stop here even if the curve is not flat")
    p.add_argument("--redraw-constants", action="store_true",
                   help="the build (and --to-plateau) redraws, each epoch, the constants each training question "
                        "states from its database, in the question and the gold query together (the same as "
                        "--set training.data.redraw_constants=true)")
    p.add_argument("--frontier", action="store_true",
                   help="measure the model's frontier on the generated pool into its frontier.json")
    p.add_argument("--frontier-tasks", type=int, help="with --frontier: a stratified subset of N pool tasks (default all)")
    p.add_argument("--frontier-samples", type=int, default=8, help="with --frontier: episodes per task (default 8)")
    from skyrl_tool_agent.policy.random_shapes import RANDOM_SHAPES

    p.add_argument("--random-shape", choices=sorted(RANDOM_SHAPES),
                   help="write a model of this architecture with random bf16 weights into --output-dir and exit")
    return p


def main(argv: list[str] | None = None, prog: str | None = None) -> None:
    args = build_parser(prog).parse_args(argv)
    from skyrl_tool_agent.jobs.progress import log_every, setup_logging, training_progress

    setup_logging()
    with cli_main_guard(also=(FileNotFoundError,)):
        from skyrl_tool_agent.eval.splits import TaskSplits
        from skyrl_tool_agent.jobs.build_model import build_embedded, build_frontier, build_plateau_start, ship_embedded

        if args.random_shape:
            if not args.output_dir:
                raise UserInputError("--random-shape needs --output-dir DIR")
            from skyrl_tool_agent.config import SHIPPED_EMBEDDED_DIR
            from skyrl_tool_agent.policy.random_shapes import write_random_model

            params = write_random_model(args.random_shape, Path(args.output_dir).expanduser(), SHIPPED_EMBEDDED_DIR)
            print(f"{args.output_dir}: {args.random_shape} shape, {params / 1e9:.2f}B parameters, random bf16 weights")
            return
        if args.redraw_constants:
            args.overrides = [*args.overrides, "training.data.redraw_constants=true"]
        config = config_from_args(args)
        if args.ship:
            record = ship_embedded(config, Path(args.ship).expanduser())
            check = record["greedy_check"]
            print(f"shipped: greedy check EX {check['execution_accuracy']:.3f} on {len(check['solved'])} validation tasks")
            return
        command = " ".join(["python", "training/scripts/build_default_model.py", *(sys.argv[1:] if argv is None else argv)])
        if args.frontier:
            log_due = log_every()

            def on_episode(done: int, total: int) -> None:
                if log_due() or done == total:
                    logging.getLogger("build_model").info("frontier: %d of %d episodes", done, total)

            summary = build_frontier(config, model_dir=args.start, num_tasks=args.frontier_tasks,
                                     samples=args.frontier_samples, command=command, progress=on_episode)
            print(f"frontier: {summary['mixed']} of {summary['tasks']} pool tasks mixed "
                  f"({summary['never']} never solved, {summary['always']} always; pass@1 {summary['pass@1']:.3f}; "
                  f"{summary['seconds'] / 60:.1f} min) -> {summary['path']}")
            return
        if args.to_plateau:
            if not args.output_dir:
                raise UserInputError("--to-plateau needs --output-dir DIR (its checkpoint and model live there)")
            log_due = log_every()

            def on_step(step: int, loss: float) -> None:
                if log_due():
                    logging.getLogger("build_model").info("plateau build: supervised step %d, loss %.4f", step, loss)

            record = build_plateau_start(config, Path(args.output_dir).expanduser(), start=args.start,
                                         max_steps=args.max_steps, eval_every=args.eval_every, progress=on_step,
                                         provenance={"command": command})
            for row in record["sft"]["evals"]:
                print(f"step {row['step']:6d} ({row['seconds'] / 60:6.1f} min): validation EX {row['execution_accuracy']:.3f}")
            print(f"{record['plateau']['stopped']}; model: {Path(args.output_dir) / 'model'}")
            return
        splits = TaskSplits.load(config)
        out = Path(args.output_dir) if args.output_dir else None
        with training_progress(1) as progress:
            report = build_embedded(config, splits.train, splits.validation(), splits.db_root, out=out, force=args.force, sft_steps=args.sft_steps,
                                    eval_every=args.eval_every, progress=progress,
                                    provenance={"command": command})
    print(json.dumps({k: v for k, v in report.items() if k != "sft"}, indent=1))
    for row in report.get("sft", {}).get("evals", []):
        print(f"warm start step {row['step']:4d} ({row['seconds']:6.1f} s): held-out EX {row['execution_accuracy']:.3f}")
