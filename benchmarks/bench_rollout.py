"""Generated tokens/s and ms per decode step: `RolloutEngine` and `model.generate`, and with `--old DIR`
an earlier commit's samplers (its own bench_rollout.py, run from DIR in a subprocess, interleaved
rep by rep), on the same prompts, at several row counts, beside the memory-bandwidth bound.

Every row decodes exactly `--new-tokens` tokens (no stop ids: the worst case of a rollout, and the
same work for every sampler). Prompts are the rollout's shape: `rows / group` tasks of `group`
copies, each a shared system prefix plus a per-task question. Each variant runs once untimed at
the timed shapes (compilation, graph capture, allocator warm-up) and then `--reps` times timed.

Variants:
- old:NAME (with `--old DIR`, e.g. `git archive 5b5bf6b skyrl_tool_agent benchmarks | tar -x -C .old`):
  DIR's variant NAME, e.g. old:kernel = the `Qwen2Kernel` batch sampler the CPU ran before the engine
  was the only sampler;
- generate: `model.generate` with the dynamic cache (sampling, top-p 1);
- generate_static (`--static-generate`, CUDA): `model.generate` with a static cache and
  `CompileConfig(mode="reduce-overhead", fullgraph=True)`;
- engine: `RolloutEngine` (slot KV cache, continuous batching, CUDA graphs on CUDA).

With an old variant and the engine, each rep's tokens/s ratio (the two ran back to back) and their
geometric mean with a 95% bootstrap interval: on a shared 2-core VM one run varies by +-30%.

The bound: one decode step reads every weight once plus each row's keys and values; at the
measured copy bandwidth that gives the fastest possible step (`bound_tokens_per_s`).

    python benchmarks/bench_rollout.py                       # CPU, the embedded model
    python benchmarks/bench_rollout.py --old .old --variants old:kernel,engine --rows 64 --reps 10
    python benchmarks/bench_rollout.py --model /tmp/q15 --rows 64,256 --new-tokens 512   # GPU
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

from common import RESULTS_DIR, Samples, console, machine_info, print_table, ratio_interval, write_json

import torch  # noqa: E402

from skyrl_tool_agent.policy.engine import RolloutEngine  # noqa: E402
from skyrl_tool_agent.policy.sampling_params import SamplingParams  # noqa: E402

VARIANTS = ("generate", "generate_static", "engine")


def load_model(path: str | None, device: str) -> torch.nn.Module:
    if path is None:
        from skyrl_tool_agent.config import ModelConfig
        from skyrl_tool_agent.policy.qwen import QwenPolicy

        return QwenPolicy.from_config(ModelConfig(device=device), mode="lora").model
    from transformers import AutoModelForCausalLM

    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    return AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device).eval()


def make_prompts(rows: int, group: int, system_tokens: int, question_tokens: int, vocab: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(0)
    system = torch.randint(3, vocab, (system_tokens,), generator=g).tolist()
    tasks = [system + torch.randint(3, vocab, (question_tokens,), generator=g).tolist()
             for _ in range(max(1, rows // group))]
    return [tasks[i // group % len(tasks)] for i in range(rows)]


def copy_bandwidth(device: torch.device) -> float:
    """Bytes/s of a large device-to-device copy (read + write counted)."""
    n = (1 << 28) if device.type == "cuda" else (1 << 25)
    src = torch.empty(n, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    sync(device)
    start = time.perf_counter()
    for _ in range(10):
        dst.copy_(src)
    sync(device)
    return 10 * 2 * src.numel() * src.element_size() / (time.perf_counter() - start)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def bytes_per_step(model: torch.nn.Module, rows: int, context: float) -> float:
    """Weights read once (tied embeddings once) + each row's keys and values at `context` tokens."""
    seen, weights = set(), 0
    for p in model.parameters():
        if p.data_ptr() not in seen:
            seen.add(p.data_ptr())
            weights += p.numel() * p.element_size()
    cfg = getattr(model, "get_base_model", lambda: model)().config
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    kv_per_token = cfg.num_hidden_layers * 2 * cfg.num_key_value_heads * head_dim * next(model.parameters()).element_size()
    return weights + rows * context * kv_per_token


def run_variant(name: str, model: torch.nn.Module, prompts: list[list[int]], new_tokens: int,
                state: dict[str, Any]) -> dict[str, float]:
    """One run: seconds, and the engine's decode-only seconds and steps where it reports them."""
    device = next(model.parameters()).device
    rows = len(prompts)
    sync(device)
    start = time.perf_counter()
    extra: dict[str, float] = {}
    if name.startswith("old:"):
        return run_old(name[4:], rows, new_tokens, state)
    if name in ("generate", "generate_static"):
        width = max(map(len, prompts))
        input_ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts], device=device)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device)
        kwargs: dict[str, Any] = {}
        if name == "generate_static":
            from transformers import CompileConfig

            kwargs = dict(cache_implementation="static",
                          compile_config=CompileConfig(mode="reduce-overhead", fullgraph=True))
        with torch.no_grad():
            out = model.generate(input_ids=input_ids, attention_mask=mask, max_new_tokens=new_tokens,
                                 min_new_tokens=new_tokens, do_sample=True, temperature=1.0, top_p=1.0, top_k=None,
                                 pad_token_id=0, **kwargs)
        assert out.shape[1] == width + new_tokens
    else:
        key = ("engine", rows)
        if key not in state:  # one engine per row count: its graphs are captured in the untimed run
            state[key] = RolloutEngine(model, slots=rows, capacity=state["engine_capacity"],
                                       stop_ids=[], pad_id=0)
        engine: RolloutEngine = state[key]
        before = dict(engine.stats)
        results = engine.generate(prompts, SamplingParams(), max_new_tokens=new_tokens,
                                  seeds=list(range(rows)))
        assert all(len(ids) == new_tokens for ids, _, _ in results)
        extra = {k: engine.stats[k] - before[k] for k in ("decode_s", "decode_steps", "prefill_s", "capture_s")}
    sync(device)
    return {"seconds": time.perf_counter() - start, **extra}


def run_old(name: str, rows: int, new_tokens: int, state: dict[str, Any]) -> dict[str, float]:
    """One timed run of variant `name` of the earlier commit in `state['old']` (its own bench_rollout.py in
    a subprocess, with its own untimed warm-up), on the same prompt shape; its seconds as it measured them."""
    old, args = Path(state["old"]).resolve(), state["args"]
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "old.json"
        cmd = [sys.executable, str(old / "benchmarks" / "bench_rollout.py"), "--rows", str(rows), "--variants", name,
               "--new-tokens", str(new_tokens), "--group", str(args.group), "--system-tokens", str(args.system_tokens),
               "--question-tokens", str(args.question_tokens), "--device", args.device, "--json-out", str(out)]
        if args.model:
            cmd += ["--model", args.model]
        subprocess.run(cmd, check=True, cwd=old, env={**os.environ, "PYTHONPATH": str(old)}, capture_output=True)
        result = json.loads(out.read_text())["results"][f"{name}@{rows}"]
    return {"seconds": result["seconds"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                     allow_abbrev=False)
    parser.add_argument("--model", default=None, help="a Qwen2 model directory (default: the embedded model)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--rows", default="16,64", help="row counts, comma-separated (GPU: 64,256)")
    parser.add_argument("--group", type=int, default=16, help="rows per task (the GRPO group)")
    parser.add_argument("--system-tokens", type=int, default=600, help="shared prefix length")
    parser.add_argument("--question-tokens", type=int, default=40, help="per-task prompt tail")
    parser.add_argument("--new-tokens", type=int, default=64, help="tokens each row decodes")
    parser.add_argument("--baseline-new-tokens", type=int, default=None,
                        help="tokens per row for kernel/generate (default: --new-tokens; fewer keeps a GPU run short: "
                             "their per-step cost hardly depends on the context length)")
    parser.add_argument("--variants", default="generate,engine", help=f"comma-separated, of {VARIANTS} and old:NAME")
    parser.add_argument("--old", default=None, help="an earlier commit's tree (skyrl_tool_agent, benchmarks) for old:NAME")
    parser.add_argument("--static-generate", action="store_true", help="add generate_static (CUDA)")
    parser.add_argument("--reps", type=int, default=1, help="timed runs per variant and row count")
    parser.add_argument("--json-out", default=str(RESULTS_DIR / "bench_rollout.json"))
    args = parser.parse_args()

    device = torch.device(args.device)
    model = load_model(args.model, args.device)
    vocab = model.config.vocab_size
    variants = [v for v in args.variants.split(",") if v] + (["generate_static"] if args.static_generate else [])
    bandwidth = copy_bandwidth(device)
    console.print(f"device {device} ({torch.cuda.get_device_name(device) if device.type == 'cuda' else 'cpu'}), "
                  f"copy bandwidth {bandwidth / 1e9:.0f} GB/s")
    state: dict[str, Any] = {"engine_capacity": args.system_tokens + args.question_tokens + args.new_tokens,
                             "old": args.old, "args": args}
    results: dict[str, Any] = {}
    table = []
    for rows in (int(r) for r in args.rows.split(",")):
        prompts = make_prompts(rows, args.group, args.system_tokens, args.question_tokens, vocab)
        tokens_of = {name: args.new_tokens if name == "engine" else (args.baseline_new_tokens or args.new_tokens)
                     for name in variants}
        for name in variants:  # untimed: compile, capture, warm-up (an old:NAME run warms itself up)
            if not name.startswith("old:"):
                run_variant(name, model, prompts, min(tokens_of[name], 16), state)
        # Reps interleaved across variants, the order rotating each rep: a load that changes over the
        # run hits every variant alike, and no variant always runs first.
        all_runs: dict[str, list[dict[str, float]]] = {name: [] for name in variants}
        for rep in range(args.reps):
            for name in variants[rep % len(variants):] + variants[:rep % len(variants)]:
                all_runs[name].append(run_variant(name, model, prompts, tokens_of[name], state))
        for name in variants:
            new_tokens = tokens_of[name]
            context = args.system_tokens + args.question_tokens + new_tokens / 2
            bound_step_s = bytes_per_step(model, rows, context) / bandwidth
            runs = all_runs[name]
            best = min(runs, key=lambda r: r["seconds"])
            tokens = rows * new_tokens
            step_ms = 1e3 * (best["decode_s"] / best["decode_steps"] if best.get("decode_steps") else
                             best["seconds"] / new_tokens)
            row = {"rows": rows, "variant": name, "new_tokens": new_tokens, "seconds": best["seconds"], "tokens": tokens,
                   "tokens_per_s": tokens / best["seconds"], "ms_per_decode_step": step_ms,
                   "bound_ms_per_step": 1e3 * bound_step_s, "bound_tokens_per_s": rows / bound_step_s, "runs": runs}
            results[f"{name}@{rows}"] = row
            table.append([name, rows, new_tokens, row["tokens_per_s"], step_ms, 1e3 * bound_step_s, row["bound_tokens_per_s"],
                          best["seconds"]])
            console.print(f"{name} @ {rows} rows: {row['tokens_per_s']:,.0f} tokens/s, {step_ms:.2f} ms/step", highlight=False)
        for old in (v for v in variants if v.startswith("old:") and "engine" in variants):
            # Tokens/s of the engine over the old variant, rep by rep (the two ran back to back).
            paired = Samples([(tokens_of["engine"] / e["seconds"]) / (tokens_of[old] / o["seconds"])
                              for e, o in zip(all_runs["engine"], all_runs[old])])
            interval = ratio_interval(paired)
            results[f"engine_over_{old}@{rows}"] = {**interval, "paired_ratios": paired.values}
            console.print(f"engine / {old} tokens/s @ {rows} rows: {interval['ratio']:.2f}x "
                          f"[{interval['low']:.2f}, {interval['high']:.2f}] (95% bootstrap over {interval['n']} paired reps)",
                          highlight=False)
    for engine in state.values():
        if isinstance(engine, RolloutEngine):
            engine.close()
    print_table("Rollout throughput (every row decodes all its new tokens)", [
        "variant", "rows", "new tokens", "tokens/s", "ms/decode step", "bound ms/step", "bound tokens/s", "seconds"], table)
    settings = {k: v for k, v in vars(args).items() if k not in ("json_out", "old")}
    settings["copy_bandwidth_gb_s"] = bandwidth / 1e9
    if device.type == "cuda":
        settings["gpu"] = torch.cuda.get_device_name(device)
    path = write_json(args.json_out, "bench_rollout", settings, results, machine_info())
    if path:
        console.print(f"wrote {path}")


if __name__ == "__main__":
    main()
