"""What CI cannot check on CPU, on a GPU: the engine's CUDA-graph decode equals its eager decode, the
Triton decode attention equals the torch reference in bf16, and how far bf16 sampling log-probs are
from the training forward's (the tolerance to state). Writes one JSON object.

    python benchmarks/check_engine_gpu.py [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from skyrl_tool_agent.config import ModelConfig  # noqa: E402
from skyrl_tool_agent.kernels.decode_attention import decode_attention, reference_decode_attention  # noqa: E402
from skyrl_tool_agent.policy.engine import RolloutEngine  # noqa: E402
from skyrl_tool_agent.policy.sampling_params import SamplingParams  # noqa: E402
from skyrl_tool_agent.kernels.logprobs import token_logprobs  # noqa: E402
from skyrl_tool_agent.policy.qwen import QwenPolicy  # noqa: E402


def prompts(vocab: int, rows: int, group: int = 8) -> list[list[int]]:
    g = torch.Generator().manual_seed(0)
    system = torch.randint(3, vocab, (300,), generator=g).tolist()
    tasks = [system + torch.randint(3, vocab, (int(n),), generator=g).tolist()
             for n in torch.randint(5, 40, (rows // group,), generator=g)]
    return [t for t in tasks for _ in range(group)]


def run(engine: RolloutEngine, batch: list[list[int]], temperature: float, max_new: int = 48) -> list:
    return engine.generate(batch, SamplingParams(temperature=temperature), max_new_tokens=max_new,
                           seeds=[7 * i + 1 for i in range(len(batch))])


def main() -> None:
    parser = argparse.ArgumentParser(allow_abbrev=False)
    parser.add_argument("--out", default="-")
    args = parser.parse_args()
    dev = "cuda" if torch.cuda.is_available() else "cpu"  # cpu: a dry run (TRITON_INTERPRET=1), no graphs
    out: dict = {"device": torch.cuda.get_device_name() if dev == "cuda" else "cpu"}
    # 1. Triton decode attention vs the torch reference, bf16, the 1.5B head layout.
    torch.manual_seed(0)
    keys = torch.randn(9, 2, 2048, 128, device=dev, dtype=torch.bfloat16)
    values = torch.randn_like(keys)
    q = torch.randn(16, 12, 128, device=dev, dtype=torch.bfloat16)
    slots = torch.randint(0, 8, (16,), device=dev)  # slot 8 is the root: half the rows read its first 600 positions
    root_lens = torch.tensor([600, 0] * 8, device=dev)
    lengths = root_lens + torch.randint(1, 1449, (16,), device=dev)
    root = torch.tensor([8], device=dev)
    args_ = (slots, lengths, root_lens, root, 128 ** -0.5)
    ref = reference_decode_attention(q.float(), keys.float(), values.float(), *args_)
    tri = decode_attention(q, keys, values, *args_).float()
    bf = reference_decode_attention(q, keys, values, *args_).float()
    out["attention_max_abs_err_triton_vs_fp32"] = float((tri - ref).abs().max())
    out["attention_max_abs_err_torch_bf16_vs_fp32"] = float((bf - ref).abs().max())
    # 2. The embedded model in bf16 on CUDA: graphs vs eager, triton vs torch attention, log-probs.
    policy = QwenPolicy.from_config(ModelConfig(device=dev, dtype="bfloat16"), mode="lora")
    model = policy.model
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(std=0.01)
    batch = prompts(model.config.vocab_size, 32)
    results = {}
    for label, kwargs in {"graphs": {}, "eager": {"cuda_graphs": False},
                          "eager_torch_attention": {"cuda_graphs": False, "attention": "torch"}}.items():
        engine = RolloutEngine(model, slots=32, capacity=512, stop_ids=[], pad_id=0, **kwargs)
        results[label] = {t: run(engine, batch, t) for t in (0.0, 1.0)}
        engine.close()
    for other in ("eager", "eager_torch_attention"):
        for t in (0.0, 1.0):
            same = sum(a[0] == b[0] for a, b in zip(results["graphs"][t], results[other][t]))
            out[f"rows_identical_graphs_vs_{other}_T{t:g}"] = f"{same}/{len(batch)}"
    # Sampled log-probs vs the training forward (bf16 HF model, teacher forced) at T=1.
    worst, mean_err, n = 0.0, 0.0, 0
    for prompt, (ids, logps, _) in zip(batch, results["graphs"][1.0]):
        full = torch.tensor([prompt + ids], device=dev)
        with torch.no_grad():
            logits = model(input_ids=full).logits
        teacher = token_logprobs(logits[:, len(prompt) - 1:-1], full[:, len(prompt):], 1.0)[0].float().cpu()
        err = (teacher - torch.tensor(logps)).abs()
        worst, mean_err, n = max(worst, float(err.max())), mean_err + float(err.sum()), n + err.numel()
    out["logprob_max_abs_err_bf16_vs_training_forward"] = worst
    out["logprob_mean_abs_err_bf16_vs_training_forward"] = mean_err / n
    # Continuous batching on the GPU: an episode alone vs among 31 others (bf16 matmuls may round
    # differently at another batch size; count how many rows still agree token for token).
    solo = RolloutEngine(model, slots=1, capacity=512, stop_ids=[], pad_id=0)
    alone = [solo.generate([p], max_new_tokens=48, temperature=1.0, top_p=1.0, seeds=[7 * i + 1])[0]
             for i, p in enumerate(batch[:8])]
    solo.close()
    same = sum(a[0] == b[0] for a, b in zip(alone, results["graphs"][1.0][:8]))
    out["rows_identical_alone_vs_batched_T1"] = f"{same}/8"
    text = json.dumps(out, indent=1)
    print(text)
    if args.out != "-":
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
