"""Peak memory of one GRPO update per training mode, measured on this device, plus estimates.

    skyrl-tool-agent memory-profile                      # synthetic Qwen2, all configs
    skyrl-tool-agent memory-profile --model Qwen/Qwen2.5-1.5B-Instruct --rows 16 --length 2048
    skyrl-tool-agent memory-profile --estimate           # Qwen2.5-1.5B / 7B on GPUs (formula)
    python training/scripts/memory_profile.py ...        # the same command

Each config runs in a fresh subprocess (clean peaks): load the policy as training would, build the
GRPOTrainer, run `--updates` real `_update` calls on a synthetic rollout batch (`--rows` sequences of
`--length` tokens sharing a `--prefix`-token system prompt, micro-batched as configured); the job is
`jobs.memory_profile`. Peak = the process's peak RSS on CPU (the kernel's high-water mark),
`max_memory_allocated` on CUDA. Configs:

  lora      adapters on a frozen base, no KL
  lora_kl   + KL to the reference = the same model with adapters disabled (no second copy)
  lora_kl_ckpt  lora_kl with model.gradient_checkpointing (shows whether recomputation is active)
  qlora     lora_kl on a bitsandbytes NF4 base
  full      all parameters, AdamW, single process (ZeRO-3 divides weights/grads/optimizer by GPUs)
  full_kl   + KL: the reference is a frozen copy of the model

Benchmark target: peak(lora_kl) <= 1.1 x peak(lora). Writes the table as JSON: --output-dir DIR
(default outputs) gets memory_profile.json, or --json-out FILE names the file.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from skyrl_tool_agent.commands._args import add_output_dir, new_parser
from skyrl_tool_agent.jobs.memory_profile import CONFIGS, UpdateShape, print_table, profile

#: The results file's name inside --output-dir.
RESULTS_FILE = "memory_profile.json"


def parse_args(argv: list[str] | None = None, prog: str | None = None) -> argparse.Namespace:
    p = new_parser(__doc__, prog)
    p.add_argument("--model", default="synthetic", help="'synthetic' (random Qwen2 built here), 'embedded', a path or hub name")
    p.add_argument("--configs", default=",".join(CONFIGS), help=f"comma-separated subset of {','.join(CONFIGS)}")
    p.add_argument("--rows", type=int, default=8, help="sequences in the rollout batch")
    p.add_argument("--length", type=int, default=384, help="tokens per sequence")
    p.add_argument("--prefix", type=int, default=96, help="shared system-prompt tokens at the start of every row")
    p.add_argument("--micro-batch", type=int, default=4, help="training.micro_batch_size")
    p.add_argument("--updates", type=int, default=2, help="_update calls (the first allocates optimizer state)")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads per worker")
    p.add_argument("--hidden", type=int, default=512, help="synthetic model: hidden size")
    p.add_argument("--layers", type=int, default=8, help="synthetic model: layers")
    p.add_argument("--vocab", type=int, default=32000, help="synthetic model: vocabulary (logits dominate activations)")
    add_output_dir(p, f"write {RESULTS_FILE} into DIR (default outputs); excludes --json-out")
    p.add_argument("--json-out", metavar="FILE", help="results JSON file (instead of --output-dir)")
    p.add_argument("--check", action="store_true", help="exit 1 when the LoRA-with-KL target is missed")
    p.add_argument("--estimate", action="store_true", help="print formula estimates for Qwen2.5-1.5B/7B and exit")
    args = p.parse_args(argv)
    if args.json_out and args.output_dir:
        p.error("--json-out FILE and --output-dir DIR both name the results file; give one")
    args.results = Path(args.json_out) if args.json_out else Path(args.output_dir or "outputs") / RESULTS_FILE
    return args


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    args = parse_args(argv, prog)
    if args.estimate:
        from skyrl_tool_agent.memory.table import print_estimates

        print_estimates()
        return 0
    names = [n.strip() for n in args.configs.split(",") if n.strip()]
    unknown = [n for n in names if n not in CONFIGS]
    if unknown:
        print(f"error: unknown config(s) {unknown}; choose from {list(CONFIGS)}", file=sys.stderr)
        return 2
    shape = UpdateShape(args.rows, args.length, args.prefix, args.micro_batch, args.updates, args.threads)
    results = profile(args.model, names, shape, hidden=args.hidden, layers=args.layers, vocab=args.vocab)
    verdict = print_table(results, f"{args.rows} rows x {args.length} tokens, micro-batch {args.micro_batch}, "
                                   f"model {args.model}")
    out = args.results
    out.parent.mkdir(parents=True, exist_ok=True)
    settings = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
    out.write_text(json.dumps({"settings": settings,
                               "results": results, "lora_kl_target": verdict}, indent=1) + "\n")
    print(f"wrote {out}")
    return 1 if args.check and not verdict.get("met", False) else 0
