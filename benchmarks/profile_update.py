"""Where one GRPO update's time goes on a GPU: the gpu profile's update (LoRA, KL to the adapters-off
reference, gradient checkpointing, micro-batches of 8) on one rollout-shaped micro-batch, timed
as a whole and per knob (KL off, checkpointing off), then under torch.profiler: the top CUDA ops.

    python benchmarks/profile_update.py --model /tmp/q15 [--rows 8 --length 6144] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from skyrl_tool_agent.commands.memory_profile import _batch  # noqa: E402
from skyrl_tool_agent.config.loader import load_config  # noqa: E402
from skyrl_tool_agent.grpo.trainer import GRPOTrainer  # noqa: E402
from skyrl_tool_agent.policy.qwen import QwenPolicy  # noqa: E402


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def main() -> None:
    parser = argparse.ArgumentParser(allow_abbrev=False)
    parser.add_argument("--model", required=True)
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--length", type=int, default=6144)
    parser.add_argument("--prefix", type=int, default=700)
    parser.add_argument("--out", default="-")
    args = parser.parse_args()
    config = load_config(overrides=[f"model.name_or_path={args.model}", "training.wandb.mode=disabled",
                                    f"training.micro_batch_size={args.rows}"], profile="gpu")
    policy = QwenPolicy.from_config(config.model, mode="lora")
    cuda = torch.cuda.is_available()  # CPU: a dry run of the script (use a small --model and --length)
    out: dict = {"gpu": torch.cuda.get_device_name() if cuda else "cpu", "rows": args.rows, "length": args.length,
                 "kl_coef": config.grpo.kl_coef, "gradient_checkpointing": config.model.gradient_checkpointing}
    with tempfile.TemporaryDirectory() as tmp:
        batch = _batch(policy, args.rows, args.length, args.prefix)

        def timed(label: str, trainer: GRPOTrainer) -> None:
            trainer._update(batch)  # warm-up (optimizer state, allocator)
            sync()
            if cuda:
                torch.cuda.reset_peak_memory_stats()
            start = time.perf_counter()
            trainer._update(batch)
            sync()
            out[label] = {"seconds": time.perf_counter() - start,
                          "peak_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else None}
            print(label, out[label], flush=True)

        trainer = GRPOTrainer(config, policy, None, None, [], output_dir=Path(tmp))
        timed("profile", trainer)
        config.grpo.kl_coef = 0.0
        timed("no_kl", trainer)
        # Without checkpointing 8 x 6144 does not fit an H200 (OOM at 139 GiB, 2026-11-26): not timed.
        config.grpo.kl_coef = out["kl_coef"]
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA if cuda else torch.profiler.ProfilerActivity.CPU]) as prof:
            trainer._update(batch)  # the profile's update: KL and checkpointing on
            sync()
        table = prof.key_averages().table(sort_by="cuda_time_total" if cuda else "cpu_time_total", row_limit=30, max_name_column_width=60)
        print(table)
        out["top_cuda_ops"] = table
    text = json.dumps(out, indent=1)
    if args.out != "-":
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
