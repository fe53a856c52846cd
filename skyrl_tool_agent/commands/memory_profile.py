"""Peak memory of one GRPO update per training mode, measured on this device, plus estimates.

    skyrl-tool-agent memory-profile                      # synthetic Qwen2, all configs
    skyrl-tool-agent memory-profile --model Qwen/Qwen2.5-1.5B-Instruct --rows 16 --length 2048
    skyrl-tool-agent memory-profile --estimate           # Qwen2.5-1.5B / 7B on GPUs (formula)
    python training/scripts/memory_profile.py ...        # the same command

Each config runs in a fresh subprocess (clean peaks): load the policy as training would, build the
GRPOTrainer, run `--updates` real `_update` calls on a synthetic rollout batch (`--rows` sequences of
`--length` tokens sharing a `--prefix`-token system prompt, micro-batched as configured). Peak =
process RSS on CPU (psutil sampled every ms, and the kernel's ru_maxrss), `max_memory_allocated`
on CUDA. Configs:

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
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from skyrl_tool_agent.commands._args import add_output_dir, new_parser

#: The directory holding the skyrl_tool_agent package: the workers import it from there too.
PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])

CONFIGS: dict[str, dict[str, Any]] = {
    "lora": {"mode": "lora", "kl": 0.0, "four_bit": False, "checkpointing": False},
    "lora_kl": {"mode": "lora", "kl": 0.05, "four_bit": False, "checkpointing": False},
    "lora_kl_ckpt": {"mode": "lora", "kl": 0.05, "four_bit": False, "checkpointing": True},
    "qlora": {"mode": "lora", "kl": 0.05, "four_bit": True, "checkpointing": False},
    "full": {"mode": "full", "kl": 0.0, "four_bit": False, "checkpointing": False},
    "full_kl": {"mode": "full", "kl": 0.05, "four_bit": False, "checkpointing": False},
}
TARGET_RATIO = 1.1
MB = 1024 * 1024
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
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--model-dir", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.json_out and args.output_dir:
        p.error("--json-out FILE and --output-dir DIR both name the results file; give one")
    args.results = Path(args.json_out) if args.json_out else Path(args.output_dir or "outputs") / RESULTS_FILE
    return args


# ---------------------------------------------------------------------------- measuring
class PeakMemory:
    """Peak of this process: CUDA max allocated, or RSS (sampled each ms + the kernel's ru_maxrss)."""

    def __init__(self, cuda: bool) -> None:
        import psutil

        self.cuda = cuda
        self._proc = psutil.Process()
        self._peak = 0
        self._stop = threading.Event()
        self._thread = None if cuda else threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.is_set():
            self._peak = max(self._peak, self._proc.memory_info().rss)
            time.sleep(0.001)

    def current(self) -> int:
        import torch

        return torch.cuda.memory_allocated() if self.cuda else self._proc.memory_info().rss

    def start(self) -> None:
        import torch

        if self.cuda:
            torch.cuda.reset_peak_memory_stats()
        else:
            self._thread.start()

    def peak(self) -> int:
        import torch

        if self.cuda:
            return torch.cuda.max_memory_allocated()
        self._stop.set()
        self._thread.join()
        return max(self._peak, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)


def _batch(policy: Any, rows: int, length: int, prefix: int, seed: int = 0) -> Any:
    """A rollout-shaped batch: shared prompt, then per-row ids; loss on the last 3/4 of each row."""
    import torch

    from skyrl_tool_agent.grpo.batch import TrainBatch

    gen = torch.Generator().manual_seed(seed)
    vocab = min(policy.model.config.vocab_size, len(policy.tokenizer))
    shared = torch.randint(5, vocab, (prefix,), generator=gen)
    ids = torch.randint(5, vocab, (rows, length), generator=gen)
    ids[:, :prefix] = shared
    attention = torch.ones_like(ids)
    loss_mask = torch.zeros((rows, length - 1), dtype=torch.bool)
    loss_mask[:, length // 4 :] = True
    old = torch.full((rows, length - 1), -3.0) * loss_mask  # off-policy enough that clipping is exercised
    adv = torch.linspace(-1, 1, rows).unsqueeze(1) * loss_mask
    return TrainBatch(ids, attention, loss_mask, old, adv)


def run_worker(name: str, args: argparse.Namespace) -> dict[str, Any]:
    import torch

    torch.set_num_threads(args.threads)
    from skyrl_tool_agent.config import Config
    from skyrl_tool_agent.grpo.trainer import GRPOTrainer
    from skyrl_tool_agent.policy.qwen import QwenPolicy

    spec = CONFIGS[name]
    cuda = torch.cuda.is_available()
    meter = PeakMemory(cuda)
    imported = meter.current()
    meter.start()
    model: dict[str, Any] = {"name_or_path": args.model_dir, "gradient_checkpointing": spec["checkpointing"]}
    if spec["four_bit"]:
        model["quantization"] = {"load_in_4bit": True, "compute_dtype": "bfloat16" if cuda else "float32"}
    config = Config.model_validate({
        "model": model,
        "training": {"mode": spec["mode"], "micro_batch_size": args.micro_batch, "wandb": {"mode": "disabled"}},
        "grpo": {"kl_coef": spec["kl"]},
    })
    policy = QwenPolicy.from_config(config.model, mode=spec["mode"])
    with tempfile.TemporaryDirectory() as tmp:
        trainer = GRPOTrainer(config, policy, None, None, [], output_dir=Path(tmp))
        batch = _batch(policy, args.rows, args.length, args.prefix)
        loaded = meter.current()
        start = time.monotonic()
        for _ in range(args.updates):
            stats = trainer._update(batch)
        seconds = (time.monotonic() - start) / args.updates
    peak = meter.peak()
    trainable = sum(p.numel() for p in policy.model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in policy.model.parameters())
    return {
        "config": name, **spec, "device": "cuda" if cuda else "cpu", "measure": "cuda_max_allocated" if cuda else "rss",
        "trainable_params": trainable, "total_params": total, "after_import_mb": imported / MB,
        "after_load_mb": loaded / MB, "peak_mb": peak / MB, "update_s": seconds, "loss": stats.get("loss"),
    }


# ---------------------------------------------------------------------------- driver
def synthetic_model(out: Path, hidden: int, layers: int, vocab: int) -> Path:
    """A randomly initialised Qwen2 (GQA, SwiGLU, like Qwen2.5 at a smaller size) + the embedded tokenizer."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from skyrl_tool_agent.policy.embedded import train_tokenizer

    tokenizer = train_tokenizer(["SELECT name FROM singer WHERE age > 30 ORDER BY name"] * 50, 300)
    torch.manual_seed(0)
    heads = max(1, hidden // 64)
    config = Qwen2Config(vocab_size=vocab, hidden_size=hidden, intermediate_size=3 * hidden, num_hidden_layers=layers,
                         num_attention_heads=heads, num_key_value_heads=max(1, heads // 4), tie_word_embeddings=True,
                         max_position_embeddings=4096, eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"),
                         pad_token_id=tokenizer.pad_token_id)
    Qwen2ForCausalLM(config).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def resolve_model(args: argparse.Namespace, tmp: Path) -> str:
    if args.model == "synthetic":
        return str(synthetic_model(tmp / "model", args.hidden, args.layers, args.vocab))
    if args.model == "embedded":
        from skyrl_tool_agent.config import ModelConfig
        from skyrl_tool_agent.policy.loading import resolve_model_path

        return resolve_model_path(ModelConfig())
    return args.model


def measure_all(args: argparse.Namespace, names: list[str]) -> list[dict[str, Any]]:
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = resolve_model(args, Path(tmp))
        for name in names:
            cmd = [sys.executable, "-m", "skyrl_tool_agent.commands.memory_profile",
                   "--worker", name, "--model-dir", model_dir, *_forwarded(args)]
            env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": str(args.threads),
                   "PYTHONPATH": os.pathsep.join(filter(None, [PACKAGE_ROOT, os.environ.get("PYTHONPATH")]))}
            done = subprocess.run(cmd, capture_output=True, text=True, env=env)
            lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
            if done.returncode != 0 or not lines:
                print(f"{name}: failed\n{done.stderr[-2000:]}", file=sys.stderr)
                results.append({"config": name, "error": done.stderr.strip().splitlines()[-1:] or ["no output"]})
                continue
            results.append(json.loads(lines[-1]))
            print(f"{name}: peak {results[-1]['peak_mb']:.0f} MB", file=sys.stderr)
    return results


def _forwarded(args: argparse.Namespace) -> list[str]:
    keys = ("rows", "length", "prefix", "micro_batch", "updates", "threads")
    return [a for k in keys for a in (f"--{k.replace('_', '-')}", str(getattr(args, k)))]


def print_table(results: list[dict[str, Any]], args: argparse.Namespace) -> dict[str, Any]:
    from rich.console import Console
    from rich.table import Table

    ok = {r["config"]: r for r in results if "peak_mb" in r}
    base = ok.get("lora", {}).get("peak_mb")
    device = next(iter(ok.values()))["device"] if ok else "?"
    table = Table(title=f"GRPO update peak memory on {device} ({args.rows} rows x {args.length} tokens, "
                        f"micro-batch {args.micro_batch}, model {args.model})")
    for col in ("config", "trainable", "total params", "after load MB", "peak MB", "update MB", "x lora", "s/update"):
        table.add_column(col, justify="left" if col == "config" else "right")
    for r in results:
        if "peak_mb" not in r:
            table.add_row(r["config"], "failed", *[""] * 6)
            continue
        ratio = f"{r['peak_mb'] / base:.3f}" if base else "-"
        table.add_row(r["config"], f"{r['trainable_params'] / 1e6:.2f}M", f"{r['total_params'] / 1e6:.1f}M",
                      f"{r['after_load_mb']:.0f}", f"{r['peak_mb']:.0f}", f"{r['peak_mb'] - r['after_load_mb']:.0f}",
                      ratio, f"{r['update_s']:.2f}")
    Console(width=max(Console().width, 120)).print(table)
    verdict: dict[str, Any] = {"target": f"peak(lora_kl) <= {TARGET_RATIO} x peak(lora)"}
    if base and "lora_kl" in ok:
        verdict["ratio"] = ok["lora_kl"]["peak_mb"] / base
        verdict["met"] = verdict["ratio"] <= TARGET_RATIO
        print(f"LoRA with KL / without KL: {verdict['ratio']:.3f} (target <= {TARGET_RATIO}): "
              f"{'met' if verdict['met'] else 'MISSED'}")
    return verdict


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    args = parse_args(argv, prog)
    if args.worker:
        print(json.dumps(run_worker(args.worker, args)))
        return 0
    if args.estimate:
        from skyrl_tool_agent.memory.table import print_estimates

        print_estimates()
        return 0
    names = [n.strip() for n in args.configs.split(",") if n.strip()]
    unknown = [n for n in names if n not in CONFIGS]
    if unknown:
        print(f"error: unknown config(s) {unknown}; choose from {list(CONFIGS)}", file=sys.stderr)
        return 2
    results = measure_all(args, names)
    verdict = print_table(results, args)
    out = args.results
    out.parent.mkdir(parents=True, exist_ok=True)
    settings = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items() if k not in ("worker", "model_dir")}
    out.write_text(json.dumps({"settings": settings,
                               "results": results, "lora_kl_target": verdict}, indent=1) + "\n")
    print(f"wrote {out}")
    return 1 if args.check and not verdict.get("met", False) else 0


if __name__ == "__main__":
    sys.exit(main())
