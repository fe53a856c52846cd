"""Peak memory of one GRPO update per training mode, measured on this device: the `memory-profile`
command (whose docstring says how each config is measured) parses its flags and calls `profile`."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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


@dataclass(frozen=True)
class UpdateShape:
    """The synthetic update every config makes: its batch, micro-batches and repeats, and the
    torch CPU threads of each worker."""

    rows: int
    length: int
    prefix: int
    micro_batch: int
    updates: int
    threads: int


def rollout_batch(policy: Any, rows: int, length: int, prefix: int, seed: int = 0) -> Any:
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


def run_worker(name: str, model_dir: str, shape: UpdateShape) -> dict[str, Any]:
    """Config `name`'s update on the model in `model_dir`, measured in this process."""
    import psutil
    import torch

    torch.set_num_threads(shape.threads)
    from skyrl_tool_agent.config import Config
    from skyrl_tool_agent.grpo.trainer import GRPOTrainer
    from skyrl_tool_agent.memory.device import peak_rss_gib
    from skyrl_tool_agent.policy.qwen import QwenPolicy

    spec = CONFIGS[name]
    cuda = torch.cuda.is_available()

    def current() -> int:
        return torch.cuda.memory_allocated() if cuda else psutil.Process().memory_info().rss

    imported = current()
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    model: dict[str, Any] = {"name_or_path": model_dir, "gradient_checkpointing": spec["checkpointing"]}
    if spec["four_bit"]:
        model["quantization"] = {"load_in_4bit": True, "compute_dtype": "bfloat16" if cuda else "float32"}
    config = Config.model_validate({
        "model": model,
        "training": {"mode": spec["mode"], "micro_batch_size": shape.micro_batch, "wandb": {"mode": "disabled"}},
        "grpo": {"kl_coef": spec["kl"]},
    })
    policy = QwenPolicy.from_config(config.model, mode=spec["mode"])
    with tempfile.TemporaryDirectory() as tmp:
        trainer = GRPOTrainer(config, policy, None, None, [], output_dir=Path(tmp))
        batch = rollout_batch(policy, shape.rows, shape.length, shape.prefix)
        loaded = current()
        start = time.monotonic()
        for _ in range(shape.updates):
            stats = trainer._update(batch)
        seconds = (time.monotonic() - start) / shape.updates
    # A fresh process per config: the kernel's RSS high-water mark is this update's peak.
    peak = torch.cuda.max_memory_allocated() if cuda else peak_rss_gib() * 2**30
    trainable = sum(p.numel() for p in policy.model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in policy.model.parameters())
    return {
        "config": name, **spec, "device": "cuda" if cuda else "cpu", "measure": "cuda_max_allocated" if cuda else "rss",
        "trainable_params": trainable, "total_params": total, "after_import_mb": imported / MB,
        "after_load_mb": loaded / MB, "peak_mb": peak / MB, "update_s": seconds, "loss": stats.get("loss"),
    }


def synthetic_model(out: Path, hidden: int, layers: int, vocab: int) -> Path:
    """A randomly initialised Qwen2 (GQA, SwiGLU, like Qwen2.5 at a smaller size) + the embedded tokenizer."""
    from skyrl_tool_agent.policy.embedded import new_tiny_qwen2, train_tokenizer

    tokenizer = train_tokenizer(["SELECT name FROM singer WHERE age > 30 ORDER BY name"] * 50, 300)
    heads = max(1, hidden // 64)
    new_tiny_qwen2(tokenizer, hidden_size=hidden, layers=layers, heads=heads, kv_heads=max(1, heads // 4),
                   intermediate_size=3 * hidden, vocab_size=vocab).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def profile(model: str, names: list[str], shape: UpdateShape, *, hidden: int, layers: int,
            vocab: int) -> list[dict[str, Any]]:
    """Each config of `names` measured in its own worker process on `model` ('synthetic': a random
    Qwen2 of `hidden`, `layers` and `vocab` built here; 'embedded'; a path or hub name). A failed
    worker's row holds its error."""
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        if model == "synthetic":
            model_dir = str(synthetic_model(Path(tmp) / "model", hidden, layers, vocab))
        elif model == "embedded":
            from skyrl_tool_agent.config import ModelConfig
            from skyrl_tool_agent.policy.loading import resolve_model_path

            model_dir = resolve_model_path(ModelConfig())
        else:
            model_dir = model
        for name in names:
            cmd = [sys.executable, "-m", __name__, name, model_dir, json.dumps(dataclasses.asdict(shape))]
            env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": str(shape.threads),
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


def print_table(results: list[dict[str, Any]], title: str) -> dict[str, Any]:
    """The results as a table, and the LoRA-with-KL target's verdict (`ratio`, `met` when measured)."""
    from rich.console import Console
    from rich.table import Table

    ok = {r["config"]: r for r in results if "peak_mb" in r}
    base = ok.get("lora", {}).get("peak_mb")
    device = next(iter(ok.values()))["device"] if ok else "?"
    table = Table(title=f"GRPO update peak memory on {device} ({title})")
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


if __name__ == "__main__":  # a worker of `profile`: NAME MODEL_DIR SHAPE_JSON -> one JSON line
    print(json.dumps(run_worker(sys.argv[1], sys.argv[2], UpdateShape(**json.loads(sys.argv[3])))))
