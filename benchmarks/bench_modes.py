"""Rollout tokens/s of every training mode through its rollout engine, side by side in one run: LoRA
(one process), QLoRA (one process, NF4 base), full mode (ZeRO-3 over two gloo ranks on the CPU, each
rank's engine sampling its half of the rows from a snapshot gathered from the shards).

Each mode samples the same rows: `rows / group` prompts of `group` copies (a shared system prefix
plus a per-task question, as bench_rollout.py makes them), every row decoding all `--new-tokens`
(no stop ids: a rollout's worst case), after one untimed warm-up. Full mode's seconds are the
slowest rank's, between two barriers, plus the snapshot's gather (`prepare_sampling`, once per
step), which is timed separately. The figures are ratios to LoRA's in the same run.

    python benchmarks/bench_modes.py                       # CPU, the embedded model, 64 rows
    python benchmarks/bench_modes.py --reps 3 --modes lora,qlora,full
    python benchmarks/bench_modes.py --device cuda --model /tmp/q15 --rows 256 --new-tokens 256 --modes lora,full
                                                           # GPU: full mode on one rank (NCCL)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from common import RESULTS_DIR, console, machine_info, print_table, write_json

import torch  # noqa: E402

from skyrl_tool_agent.config import SHIPPED_EMBEDDED_DIR, Config  # noqa: E402
from skyrl_tool_agent.policy.engine import RolloutEngine  # noqa: E402
from skyrl_tool_agent.policy.sampling_params import SamplingParams  # noqa: E402

REPO = Path(__file__).resolve().parent.parent


def make_prompts(rows: int, group: int, vocab: int, system_tokens: int = 600, question_tokens: int = 40) -> list[list[int]]:
    g = torch.Generator().manual_seed(0)
    system = torch.randint(3, vocab, (system_tokens,), generator=g).tolist()
    tasks = [system + torch.randint(3, vocab, (question_tokens,), generator=g).tolist() for _ in range(max(1, rows // group))]
    return [tasks[i // group % len(tasks)] for i in range(rows)]


def config(mode: str, device: str = "cpu", model_dir: str | None = None) -> Config:
    model: dict[str, Any] = {"device": device}
    if model_dir:
        model["name_or_path"] = model_dir
    else:
        model["embedded_dir"] = str(SHIPPED_EMBEDDED_DIR)
    if mode == "qlora":
        # The compute dtype the model loads in (float32 on the CPU: one without bf16 units is slow in bf16)
        model["quantization"] = {"load_in_4bit": True, "quant_type": "nf4",
                                 "compute_dtype": "bfloat16" if device == "cuda" else "float32"}
    return Config.model_validate({"model": model, "training": {"mode": "full" if mode == "full" else "lora",
                                                                "wandb": {"mode": "disabled"}}})


def sample(engine: RolloutEngine, prompts: list[list[int]], new_tokens: int, seed0: int) -> float:
    start = time.perf_counter()
    results = engine.generate(prompts, SamplingParams(), max_new_tokens=new_tokens,
                              seeds=[seed0 + i for i in range(len(prompts))])
    assert all(len(ids) == new_tokens for ids, _, _ in results)
    return time.perf_counter() - start


def one_process(mode: str, prompts: list[list[int]], new_tokens: int, reps: int, args: argparse.Namespace) -> dict[str, Any]:
    from skyrl_tool_agent.policy.qwen import QwenPolicy

    policy = QwenPolicy.from_config(config(mode, args.device, args.model).model, mode="lora")
    weights = policy.sampling_weights()
    engine = RolloutEngine(weights, slots=len(prompts), capacity=max(map(len, prompts)) + new_tokens, stop_ids=[], pad_id=0)
    try:
        sample(engine, prompts, min(new_tokens, 8), 0)  # warm-up
        seconds = [sample(engine, prompts, new_tokens, 100 * r) for r in range(reps)]
    finally:
        engine.close()
    return {"seconds": min(seconds), "runs": seconds, "dtype": str(weights.dtype),
            "four_bit_matmul": weights.four_bit_matmul}


def full_worker(out: str, rows: int, group: int, new_tokens: int, reps: int, args: argparse.Namespace) -> None:
    """One rank of full mode (launched by `full_mode`): its share of the rows on its engine."""
    from skyrl_tool_agent.distributed.comm import DistContext
    from skyrl_tool_agent.distributed.zero3 import build_deepspeed_policy, model_hidden_size, resolve_deepspeed_config

    cfg = config("full", args.device, args.model)
    ctx = DistContext.init_deepspeed()
    raw = cfg.load_deepspeed().model_dump(mode="json", exclude_none=True)
    if args.device == "cpu":
        raw["bf16"] = {"enabled": False}  # float32 on the CPU, as the LoRA and QLoRA policies load here
    ds = resolve_deepspeed_config(raw, cfg, hidden_size=model_hidden_size(cfg), world_size=ctx.world_size)
    policy = build_deepspeed_policy(cfg, ctx, ds)
    start = time.perf_counter()
    policy.prepare_sampling()  # collective: the shards gathered into each rank's snapshot
    gather_s = time.perf_counter() - start
    prompts = make_prompts(rows, group, policy.tokenizer.vocab_size)
    mine = prompts[ctx.rank::ctx.world_size]
    engine = RolloutEngine(policy.sampling_weights(), slots=len(mine), capacity=max(map(len, mine)) + new_tokens,
                           stop_ids=[], pad_id=0)
    sample(engine, mine, min(new_tokens, 8), 0)
    seconds = []
    for r in range(reps):
        ctx.barrier()
        start = time.perf_counter()
        sample(engine, mine, new_tokens, 100 * r + 1000 * ctx.rank)
        ctx.barrier()  # the slowest rank's time
        seconds.append(time.perf_counter() - start)
    engine.close()
    if ctx.is_main:
        Path(out).write_text(json.dumps({"seconds": min(seconds), "runs": seconds, "gather_s": gather_s,
                                         "dtype": str(policy.sampling_weights().dtype)}))
    ctx.close()


def full_mode(rows: int, group: int, new_tokens: int, reps: int, args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "full.json"
        env = {**os.environ, "WANDB_MODE": "disabled", "TORCH_EXTENSIONS_DIR": str(Path(tmp) / "ext"),
               "PYTHONPATH": f"{REPO}:{REPO / 'benchmarks'}"}
        if args.device == "cpu":
            env.update(DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1")
        cmd = [sys.executable, "-m", "deepspeed.launcher.runner", "--num_gpus", str(args.ranks), "--master_port",
               "29631", __file__, "--worker", str(out), "--rows", str(rows), "--group", str(group),
               "--new-tokens", str(new_tokens), "--reps", str(reps), "--device", args.device]
        if args.model:
            cmd += ["--model", args.model]
        done = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True, timeout=1800)
        if done.returncode != 0:
            raise RuntimeError(done.stdout[-3000:] + done.stderr[-3000:])
        return json.loads(out.read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                     allow_abbrev=False)
    parser.add_argument("--modes", default="lora,qlora,full")
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--group", type=int, default=16)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--model", default=None, help="a Qwen2 model directory (default: the embedded model)")
    parser.add_argument("--ranks", type=int, default=None, help="full mode's ranks (default: 2 on the CPU, 1 on CUDA)")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--local_rank", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--json-out", default=str(RESULTS_DIR / "bench_modes.json"))
    args = parser.parse_args()
    args.ranks = args.ranks or (2 if args.device == "cpu" else 1)
    if args.worker:
        full_worker(args.worker, args.rows, args.group, args.new_tokens, args.reps, args)
        return
    from skyrl_tool_agent.policy.loading import load_tokenizer, resolve_model_path

    vocab = load_tokenizer(resolve_model_path(config("lora", args.device, args.model).model),
                           config("lora", args.device, args.model).model).vocab_size
    prompts = make_prompts(args.rows, args.group, vocab)
    results: dict[str, Any] = {}
    for mode in args.modes.split(","):
        results[mode] = (full_mode(args.rows, args.group, args.new_tokens, args.reps, args) if mode == "full"
                         else one_process(mode, prompts, args.new_tokens, args.reps, args))
        results[mode]["tokens_per_s"] = args.rows * args.new_tokens / results[mode]["seconds"]
        console.print(f"{mode}: {results[mode]['tokens_per_s']:,.0f} tokens/s", highlight=False)
    base = results.get("lora", {}).get("tokens_per_s")
    table = []
    for mode, r in results.items():
        r["x_lora"] = r["tokens_per_s"] / base if base else None
        table.append([mode, r["dtype"], r["tokens_per_s"], r["x_lora"] or 0.0, r["seconds"], r.get("gather_s", 0.0)])
    print_table(f"Rollout tokens/s by mode ({args.rows} rows x {args.new_tokens} tokens, {args.model or 'embedded model'}, "
                f"{args.device}; full mode on {args.ranks} rank(s))",
                ["mode", "sampling dtype", "tokens/s", "x LoRA", "seconds", "snapshot gather s"], table)
    path = write_json(args.json_out, "bench_modes", {k: v for k, v in vars(args).items() if k not in ("json_out", "worker", "local_rank")},
                      results, machine_info())
    if path:
        console.print(f"wrote {path}")


if __name__ == "__main__":
    main()
