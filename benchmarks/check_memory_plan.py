"""The memory plan against the device's own count, part by part (issue 55's GPU check).

    python benchmarks/check_memory_plan.py --model /tmp/q15 --mode lora      # CUDA: the 1.5B shape
    python benchmarks/check_memory_plan.py --model DIR --device cpu         # anywhere, small shapes

Loads `--model` as train would (gpu profile, gradient checkpointing, bf16), makes the run's plan
(`memory.sizing.plan_for`, the device's total memory), prints it, builds the rollout engine at its
planned slots, and measures each part against the plan: the engine's cache and weight snapshot
(their buffers), one prefill chunk of the plan's size over a shared root, and one update micro-batch
of the plan's tokens (forward and backward). On CUDA the measure is `torch.cuda.max_memory_allocated`
above what was allocated before; on a CPU, the bytes torch's ops allocate at their peak
(tests/fixtures/peak_bytes.py). One line a part: planned, measured, ratio.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from skyrl_tool_agent.config import load_config  # noqa: E402
from skyrl_tool_agent.memory import model as mm  # noqa: E402
from skyrl_tool_agent.memory.device import device_memory, format_bytes  # noqa: E402
from skyrl_tool_agent.memory.shape import ModelShape  # noqa: E402
from skyrl_tool_agent.memory.sizing import plan_for  # noqa: E402
from skyrl_tool_agent.policy.sampling_params import SamplingParams  # noqa: E402


def peak_of(fn, device: torch.device) -> int:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        base = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        fn()
        torch.cuda.synchronize(device)
        return torch.cuda.max_memory_allocated(device) - base
    from tests.fixtures.peak_bytes import PeakBytes

    with PeakBytes() as meter:
        fn()
    return meter.peak


def main() -> None:
    p = argparse.ArgumentParser(allow_abbrev=False)
    p.add_argument("--model", required=True)
    p.add_argument("--mode", choices=["lora", "qlora"], default="lora")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--max-total-tokens", type=int, default=None, help="grpo.max_total_tokens (default: the gpu profile's)")
    p.add_argument("--json-out", default=None)
    args = p.parse_args()
    from skyrl_tool_agent.policy.checkpointing import recompute_activations
    from skyrl_tool_agent.policy.qwen import QwenPolicy
    from skyrl_tool_agent.policy.weights import base_model, sampling_dtype

    sets = [f"model.name_or_path={args.model}", f"model.device={args.device}", "model.dtype=bfloat16",
            "training.mode=lora", f"model.quantization.load_in_4bit={str(args.mode == 'qlora').lower()}"]
    if args.max_total_tokens:
        sets.append(f"grpo.max_total_tokens={args.max_total_tokens}")
    config = load_config(profile="gpu", overrides=sets)
    policy = QwenPolicy.from_config(config.model, mode="lora")
    device = policy.device
    shape = ModelShape.from_config(base_model(policy.model).config, args.model)
    kind = "cuda" if device.type == "cuda" else "cpu"
    plan = plan_for(config, shape, device_bytes=device_memory(device).total, world=1, device_kind=kind,
                    dtype_bytes=sampling_dtype(policy.model).itemsize, choose_update=True)
    print(plan.describe(), flush=True)
    policy.use_plan(plan)
    setup = plan.setup
    rows: list[dict] = []

    def report(part: str, planned: float, measured: float) -> None:
        ratio = measured / planned if planned else float("nan")
        rows.append({"part": part, "planned": planned, "measured": measured, "ratio": ratio})
        print(f"{part}: planned {format_bytes(int(planned))}, measured {format_bytes(int(measured))} ({ratio:.2f}x)",
              flush=True)

    tokens = plan.update_tokens
    width = config.grpo.max_total_tokens
    ids = torch.randint(3, shape.vocab - 1, (max(1, tokens // width), width), device=device)

    def update() -> None:
        with recompute_activations(policy.model, True), policy.training_precision():
            logp, _ = policy.token_logprobs(ids, torch.ones_like(ids))
            logp.sum().backward()

    report("update forward+backward", mm.update_pass_bytes(setup, ids.numel()), peak_of(update, device))
    for param in policy.model.parameters():
        param.grad = None

    engine = policy.rollout_engine(slots=plan.demand, capacity=width)
    step = engine.step
    print(f"engine: {engine.slots} slots (planned {plan.slots}), prefill chunk {step.prefill_tokens}", flush=True)
    cache = sum(t.numel() * t.element_size() for t in (*step.keys, *step.values, step.history, step.history_logp))
    report("KV cache", mm.cache_bytes(setup, slots=engine.slots, capacity=engine.capacity), cache)
    report("snapshot", mm.snapshot_bytes(setup, through_modules=plan.through_modules), engine.weights.nbytes())
    root = 600
    step.prefill([(step.root, 0, torch.randint(3, shape.vocab - 1, (root,)).tolist())], sample=False)
    per_row = min(width - root - 8, step.prefill_tokens)
    n = max(1, step.prefill_tokens // per_row)
    step.set_slots(range(n), [1] * n, [SamplingParams()] * n, [root] * n)
    work = [(i, root, torch.randint(3, shape.vocab - 1, (per_row,)).tolist()) for i in range(n)]
    report("prefill working set", mm.prefill_working_bytes(setup, chunk_tokens=n * per_row, capacity=root + per_row),
           peak_of(lambda: step.prefill(work, sample=True), device))
    policy.release_rollout_engine()
    if args.json_out:
        Path(args.json_out).write_text(json.dumps({"plan": plan.describe(), "parts": rows}, indent=1))


if __name__ == "__main__":
    main()
