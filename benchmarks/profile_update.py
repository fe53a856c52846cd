"""Where one GRPO update's time goes, change by change, on the same micro-batches in one run: the gpu
profile's LoRA update (KL to the adapters-off reference, gradient checkpointing, micro-batches of 8)
on a rollout-shaped batch, timed as a whole for each variant, then the chosen one under
torch.profiler with GPU time split by kernel class.

    python benchmarks/profile_update.py --model /tmp/q15 [--rows 8 --length 6144] [--mixed] [--out FILE]

Variants (`--variants`, comma-separated, in this order by default):
  new          this code: log-probs from hidden states in chunks, bf16 adapter matmuls
               (`QwenPolicy.training_precision`), the reference once per step, token-budget passes
  casts        new, but peft's float32 adapter casts back (training_precision off)
  logits       new, but the `[B, L, V]` logits materialised (the output head run as a module)
  rows         new, but passes of micro_batch_size rows in rollout order (no token budget)
  no_ckpt:T    new without gradient checkpointing, passes of at most T tokens
  peft_lora    new, but peft's five-op LoRA projections (fused_lora off; it only merges fp32 weights)
  compile      new, each decoder layer compiled alone (regional torch.compile, dynamic shapes): RMSNorm,
               RoPE, SwiGLU, residual adds and the adapters' scaling fused; `first_s` is the warm-up
               update, compilation included
Today's path (before these changes) is the same script at an earlier commit: scripts/gpu_check.sh's
update_today stage runs it from .old/ beside this one in one device call.

FLOPs (written out, per real token of a sequence of length L; N = weights of every matmul, the
output head included; d = hidden size; layers):
  forward 2N + 2 L d layers (causal attention: QK^T and PV over L/2 keys on average, 4 d FLOPs a key);
  backward to the activations 2N + 4 L d layers (frozen base weights: no weight gradients; LoRA's
  are negligible); the reference's forward 2N + 2 L d layers.
  MFU counts these (model FLOPs); HFU adds the recomputed forward of gradient checkpointing.
Peak: 989 TFLOP/s dense bf16 (H100/H200 SXM datasheet).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from skyrl_tool_agent.jobs.memory_profile import rollout_batch  # noqa: E402
from skyrl_tool_agent.config.loader import load_config  # noqa: E402
from skyrl_tool_agent.grpo.batch import TrainBatch  # noqa: E402
from skyrl_tool_agent.grpo import trainer as trainer_module  # noqa: E402
from skyrl_tool_agent.grpo.trainer import GRPOTrainer  # noqa: E402
from skyrl_tool_agent.policy import prefix  # noqa: E402
from skyrl_tool_agent.policy.qwen import QwenPolicy  # noqa: E402

PEAK_FLOPS = 989e12


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def mixed_batch(policy: QwenPolicy, rows: int, length: int, prefix_len: int) -> TrainBatch:
    """`rows` episodes of lengths spread evenly from length/8 to length (as a real step's are),
    right-padded to the longest: what micro-batches by row count pad and a token budget does not."""
    batch = rollout_batch(policy, rows, length, prefix_len)
    for row, n in enumerate(torch.linspace(length / 8, length, rows).long().tolist()):
        batch.attention_mask[row, n:] = 0
        batch.loss_mask[row, n - 1:] = False
        batch.advantages[row, n - 1:] = 0
        batch.old_logp[row, n - 1:] = 0
    return batch


def flops(policy: QwenPolicy, batch: TrainBatch, checkpointing: bool) -> tuple[float, float]:
    """(model FLOPs, hardware FLOPs) of one update of `batch` (module docstring)."""
    base = policy.model.get_base_model() if hasattr(policy.model, "get_base_model") else policy.model
    cfg = base.config
    n = sum(m.weight.numel() for name, m in base.named_modules()
            if isinstance(m, torch.nn.Linear) and "lora_" not in name)
    attn = 2 * cfg.hidden_size * cfg.num_hidden_layers  # per token and key position, forward
    lengths = batch.attention_mask.sum(1).double()
    tokens = float(lengths.sum())
    ctx = float((lengths * lengths).sum())  # sum over sequences of L * L: sum over tokens of L
    forward = 2 * n * tokens + attn * ctx
    backward = 2 * n * tokens + 2 * attn * ctx
    model = 2 * forward + backward  # policy forward + backward + reference forward
    return model, model + (forward if checkpointing else 0.0)


@contextlib.contextmanager
def variant(name: str, policy: QwenPolicy, config: Any) -> Iterator[None]:
    """Apply one variant's change for the duration (module docstring)."""
    saved = (config.model.gradient_checkpointing, config.training.micro_batch_tokens)
    precision, head, fused = policy.training_precision, prefix.output_head, trainer_module.fused_lora
    base = policy.model.get_base_model() if hasattr(policy.model, "get_base_model") else policy.model
    layers = list(base.model.layers) if name == "compile" else []
    try:
        if name == "casts":
            policy.training_precision = contextlib.nullcontext  # type: ignore[method-assign]
        elif name == "logits":
            prefix.output_head = lambda model, **_: None  # type: ignore[assignment]
        elif name == "rows":
            config.training.micro_batch_tokens = None
        elif name.startswith("no_ckpt:"):
            config.model.gradient_checkpointing = False
            config.training.micro_batch_tokens = int(name.split(":")[1])
        elif name == "peft_lora":
            trainer_module.fused_lora = lambda model, enabled=True: contextlib.nullcontext(0)  # type: ignore[assignment]
        elif name == "compile":
            for layer in layers:
                layer.compile(dynamic=True)
        elif name != "new":
            raise SystemExit(f"error: unknown variant {name!r}")
        yield
    finally:
        config.model.gradient_checkpointing, config.training.micro_batch_tokens = saved
        policy.training_precision, prefix.output_head = precision, head  # type: ignore[method-assign]
        trainer_module.fused_lora = fused  # type: ignore[assignment]
        for layer in layers:
            layer._compiled_call_impl = None  # back to the eager forward


KERNEL_CLASSES = (  # (class, substrings of a CUDA kernel's name), first match wins
    ("attention", ("flash", "fmha", "attention", "attn")),
    ("gemm_fp32", ("sgemm", "f32f32", "s1688", "tf32")),
    ("gemm", ("gemm", "cutlass", "nvjet", "wgmma", "sm90_xmma", "xmma")),
    ("reduction", ("reduce", "softmax", "logsumexp", "norm")),
    ("elementwise", ("elementwise", "vectorized", "unrolled", "copy", "cat", "fill", "index", "scatter", "gather")),
)


def kernel_shares(prof: torch.profiler.profile) -> dict[str, float]:
    totals: dict[str, float] = {}
    for event in prof.key_averages():
        device_time = getattr(event, "device_time_total", 0.0) or getattr(event, "cuda_time_total", 0.0)
        if device_time <= 0 or getattr(event, "device_type", None) != torch.autograd.DeviceType.CUDA:
            continue
        name = event.key.lower()
        cls = next((c for c, keys in KERNEL_CLASSES if any(k in name for k in keys)), "other")
        totals[cls] = totals.get(cls, 0.0) + device_time
    whole = sum(totals.values()) or 1.0
    return {k: round(v / whole, 3) for k, v in sorted(totals.items(), key=lambda kv: -kv[1])}


def main() -> None:
    parser = argparse.ArgumentParser(allow_abbrev=False)
    parser.add_argument("--model", required=True)
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--length", type=int, default=6144)
    parser.add_argument("--prefix", type=int, default=700)
    parser.add_argument("--mixed", action="store_true", help="rows of lengths from length/8 to length (padded)")
    parser.add_argument("--variants", default="new,casts,logits,no_ckpt:16384")
    parser.add_argument("--profile-variant", default="new", help="the variant run under torch.profiler ('' = none)")
    parser.add_argument("--out", default="-")
    args = parser.parse_args()
    config = load_config(overrides=[f"model.name_or_path={args.model}", "training.wandb.mode=disabled"], profile="gpu")
    policy = QwenPolicy.from_config(config.model, mode="lora")
    cuda = torch.cuda.is_available()  # CPU: a dry run of the script (use a small --model and --length)
    batch = (mixed_batch if args.mixed else rollout_batch)(policy, args.rows, args.length, args.prefix)
    tokens = int(batch.attention_mask.sum())
    out: dict[str, Any] = {
        "gpu": torch.cuda.get_device_name() if cuda else "cpu", "torch": torch.__version__,
        "rows": args.rows, "length": args.length, "mixed": args.mixed, "tokens": tokens,
        "padded_tokens": batch.attention_mask.numel(), "kl_coef": config.grpo.kl_coef,
        "micro_batch_size": config.training.micro_batch_size, "micro_batch_tokens": config.training.micro_batch_tokens,
        "variants": {},
    }
    with tempfile.TemporaryDirectory() as tmp:
        trainer = GRPOTrainer(config, policy, None, None, [], output_dir=Path(tmp))  # type: ignore[arg-type]
        for name in [v for v in args.variants.split(",") if v]:
            with variant(name, policy, config):
                try:
                    first = time.perf_counter()
                    trainer._update(batch)  # warm-up (optimizer state, allocator, compilation)
                    sync()
                    first_s = time.perf_counter() - first
                    if cuda:
                        torch.cuda.reset_peak_memory_stats()
                    start = time.perf_counter()
                    trainer._update(batch)
                    sync()
                    seconds = time.perf_counter() - start
                except torch.OutOfMemoryError as exc:
                    out["variants"][name] = {"error": f"out of memory: {str(exc).splitlines()[0]}"}
                    print(name, out["variants"][name], flush=True)
                    torch.cuda.empty_cache()
                    continue
                model_flops, hw_flops = flops(policy, batch, config.model.gradient_checkpointing)
                out["variants"][name] = {
                    "seconds": round(seconds, 3), "first_s": round(first_s, 3), "tokens_per_s": round(tokens / seconds),
                    "mfu": round(model_flops / seconds / PEAK_FLOPS, 3), "hfu": round(hw_flops / seconds / PEAK_FLOPS, 3),
                    "peak_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2) if cuda else None,
                }
            print(name, out["variants"][name], flush=True)
        if args.profile_variant:
            with variant(args.profile_variant, policy, config):
                activity = torch.profiler.ProfilerActivity.CUDA if cuda else torch.profiler.ProfilerActivity.CPU
                with torch.profiler.profile(activities=[activity]) as prof:
                    trainer._update(batch)
                    sync()
            out["kernel_share"] = kernel_shares(prof) if cuda else {}
            table = prof.key_averages().table(sort_by="cuda_time_total" if cuda else "cpu_time_total", row_limit=25,
                                              max_name_column_width=70)
            print("kernel share", out["kernel_share"])
            print(table)
            out["top_ops"] = table
    text = json.dumps(out, indent=1)
    if args.out != "-":
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
