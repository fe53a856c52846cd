"""`skyrl-tool-agent doctor`: is this machine ready to train? A smoke test a user runs from a clone
(or an installed wheel), needing no file outside the package: the device, its memory, bf16 matmuls,
the rollout engine's CUDA-graph capture (graphs = eager, token for token) and one tiny GRPO training
step (sample a group, recompute its log-probs, one clipped-loss update of the LoRA adapters) on the
embedded model. Each check is one line, PASS / WARN / FAIL / SKIP with what it measured; GPU-only
checks are skipped with a line saying so on a machine without CUDA. About a minute on a GPU (most
of it loading torch and capturing graphs), seconds on a CPU.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from skyrl_tool_agent.config import ModelConfig

logger = logging.getLogger(__name__)

PASS, WARN, FAIL, SKIP = "PASS", "WARN", "FAIL", "SKIP"
#: Peak GPU memory of the gpu profile's worst-case LoRA step on Qwen2.5-1.5B's shape (random bf16
#: weights, 16 x 16 episodes of 8 x 512-token turns; H200, 2026-11-26, docs/distributed.md).
GPU_PROFILE_PEAK_GIB = 50.6
#: A real question through the chat template: the training step's prompt.
PROMPT = "Database: library\nQuestion: How many books are in the 'History' genre?"


@dataclass
class Check:
    """One line of the report."""

    status: str
    name: str
    detail: str
    seconds: float = 0.0

    def line(self) -> str:
        return f"{self.status:<4}  {self.name}: {self.detail} ({self.seconds:.1f} s)"


def _gib(n: float) -> float:
    return n / 1024**3


def check_torch() -> tuple[str, str]:
    import transformers

    cuda = torch.version.cuda or "none (CPU build)"
    return PASS, f"torch {torch.__version__}, CUDA build {cuda}, transformers {transformers.__version__}"


def check_device(device: torch.device) -> tuple[str, str]:
    if device.type != "cuda":
        return SKIP, "no CUDA device: the checks run on the CPU; GPU-only checks are skipped"
    props = torch.cuda.get_device_properties(device)
    return PASS, (f"{device} {props.name}, compute capability {props.major}.{props.minor}, "
                  f"{props.multi_processor_count} SMs, {torch.cuda.device_count()} GPU(s) visible")


def check_memory(device: torch.device) -> tuple[str, str]:
    if device.type != "cuda":
        import psutil

        vm = psutil.virtual_memory()
        status = PASS if vm.available >= 2 * 1024**3 else WARN
        return status, f"RAM {_gib(vm.available):.1f} GiB available of {_gib(vm.total):.1f} (the embedded model needs < 1)"
    free, total = torch.cuda.mem_get_info(device)
    detail = f"{_gib(free):.1f} GiB free of {_gib(total):.1f}"
    if _gib(free) < GPU_PROFILE_PEAK_GIB:
        return WARN, (f"{detail}: under the {GPU_PROFILE_PEAK_GIB} GiB the gpu profile's step peaked at on a 1.5B "
                      "model (H200, random weights); lower training.micro_batch_size or grpo.max_total_tokens")
    return PASS, f"{detail} (the gpu profile's 1.5B step peaked at {GPU_PROFILE_PEAK_GIB} GiB)"


def check_bf16_matmul(device: torch.device) -> tuple[str, str]:
    if device.type != "cuda":
        return SKIP, "GPU-only (no CUDA device)"
    n = 4096
    g = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(n, n, device=device, generator=g)
    b = torch.randn(n, n, device=device, generator=g)
    exact = a @ b
    a16, b16 = a.bfloat16(), b.bfloat16()
    (a16 @ b16).float()
    torch.cuda.synchronize(device)
    start, reps = time.perf_counter(), 20
    for _ in range(reps):
        out = a16 @ b16
    torch.cuda.synchronize(device)
    tflops = 2 * n**3 * reps / (time.perf_counter() - start) / 1e12
    error = ((out.float() - exact).norm() / exact.norm()).item()
    status = PASS if error < 1e-2 else FAIL
    return status, f"{n}x{n} bf16: {tflops:.0f} TFLOP/s, relative error {error:.1e} against fp32"


def _policy(device: torch.device):
    from skyrl_tool_agent.policy.qwen import QwenPolicy

    dtype = "bfloat16" if device.type == "cuda" else "float32"
    policy = QwenPolicy.from_config(ModelConfig(device=device.type, dtype=dtype), mode="lora")  # type: ignore[arg-type]
    torch.manual_seed(0)
    with torch.no_grad():  # adapters off zero, as after training: they then change every token
        for name, p in policy.model.named_parameters():
            if "lora_B" in name:
                p.normal_(std=0.01)
    return policy


def _prompt_ids(tokenizer) -> list[int]:
    ids = tokenizer.apply_chat_template([{"role": "user", "content": PROMPT}], add_generation_prompt=True,
                                        return_dict=True)["input_ids"]
    return list(ids[0] if ids and isinstance(ids[0], list) else ids)


def check_graph_capture(device: torch.device) -> tuple[str, str]:
    if device.type != "cuda":
        return SKIP, "GPU-only (no CUDA device): the CPU samples without CUDA graphs"
    from skyrl_tool_agent.policy.engine import RolloutEngine

    policy = _policy(device)
    prompt = _prompt_ids(policy.tokenizer)
    rows, new = 16, 32
    batch = [prompt[: len(prompt) - i % 4] for i in range(rows)]  # a few lengths: several slots' positions
    runs = {}
    for label, graphs in (("graphs", True), ("eager", False)):
        engine = RolloutEngine(policy.model, slots=rows, capacity=len(prompt) + new, stop_ids=[],
                               pad_id=policy.tokenizer.pad_token_id, cuda_graphs=graphs)
        start = time.perf_counter()
        runs[label] = [r[0] for r in engine.generate(batch, max_new_tokens=new, temperature=0.0, top_p=1.0,
                                                      seeds=list(range(rows)))]
        torch.cuda.synchronize(device)
        runs[f"{label}_s"] = time.perf_counter() - start
        engine.close()
    same = sum(a == b for a, b in zip(runs["graphs"], runs["eager"]))
    status = PASS if same == rows else FAIL
    return status, (f"captured decode = eager decode in {same}/{rows} rows of {new} greedy tokens "
                    f"(embedded model, bf16; graphs {runs['graphs_s']:.2f} s incl. capture, eager {runs['eager_s']:.2f} s)")


def check_training_step(device: torch.device) -> tuple[str, str]:
    from skyrl_tool_agent.grpo.advantages import group_advantages
    from skyrl_tool_agent.grpo.losses import grpo_loss
    from skyrl_tool_agent.policy.qwen import SamplingParams

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    policy = _policy(device)
    prompt = _prompt_ids(policy.tokenizer)
    group = 4
    torch.manual_seed(1)
    gens = policy.generate([prompt] * group, SamplingParams(temperature=1.0, max_new_tokens=24),
                           seeds=list(range(1, group + 1)))
    width = len(prompt) + max(len(g.token_ids) for g in gens)
    pad = policy.tokenizer.pad_token_id
    input_ids = torch.full((group, width), pad, dtype=torch.long)
    attention = torch.zeros((group, width), dtype=torch.long)
    loss_mask = torch.zeros((group, width - 1))
    old_logp = torch.zeros((group, width - 1))
    for i, g in enumerate(gens):
        n = len(prompt) + len(g.token_ids)
        input_ids[i, :n] = torch.tensor(prompt + g.token_ids)
        attention[i, :n] = 1
        loss_mask[i, len(prompt) - 1 : n - 1] = 1  # position t scores token t+1: the sampled tokens
        old_logp[i, len(prompt) - 1 : n - 1] = torch.tensor(g.logprobs)
    rewards = torch.tensor([[1.0, 0.0, 1.0, 0.0]])  # a mixed group: every episode gets an advantage
    advantages = group_advantages(rewards)[0].to(device)
    params = policy.trainable_parameters()
    before = [p.detach().clone() for p in params]
    optimizer = torch.optim.AdamW(params, lr=1e-3)
    logp, _ = policy.token_logprobs(input_ids.to(device), attention.to(device))
    mask, old = loss_mask.to(device), old_logp.to(device)
    loss, stats = grpo_loss(logp.float(), old, advantages, mask, aggregation="token_mean")
    loss.backward()
    grad_ok = all(p.grad is not None and bool(torch.isfinite(p.grad).all()) for p in params)
    optimizer.step()
    moved = sum(not torch.equal(a, p.detach()) for a, p in zip(before, params))
    drift = ((logp.detach().float() - old).abs() * mask).max().item()  # sampling vs training log-probs
    tolerance = 0.5 if device.type == "cuda" else 1e-3  # bf16 kernels differ (docs/distributed.md: max 0.196)
    ok = bool(torch.isfinite(loss)) and grad_ok and moved == len(params) and drift < tolerance
    memory = (f", peak {_gib(torch.cuda.max_memory_allocated(device)):.2f} GiB" if device.type == "cuda" else "")
    return (PASS if ok else FAIL), (
        f"{group} episodes sampled ({policy.sampler()} sampler, {int(mask.sum())} tokens), loss "
        f"{loss.item():.4f}, gradients {'finite' if grad_ok else 'NOT finite'}, {moved}/{len(params)} adapter "
        f"tensors updated, sampling vs training log-prob max |diff| {drift:.1e} (limit {tolerance:g}){memory}")


CHECKS: tuple[tuple[str, Callable[..., tuple[str, str]], bool], ...] = (
    ("torch", check_torch, False),
    ("device", check_device, True),
    ("memory", check_memory, True),
    ("bf16 matmul", check_bf16_matmul, True),
    ("engine graph capture", check_graph_capture, True),
    ("training step", check_training_step, True),
)


def run_checks(device: torch.device, emit: Callable[[Check], None] = lambda c: None) -> list[Check]:
    """Run every check on `device`, each timed and isolated (an exception is that check's FAIL line);
    `emit` gets each result as it comes."""
    results = []
    for name, check, takes_device in CHECKS:
        start = time.perf_counter()
        try:
            status, detail = check(device) if takes_device else check()
        except Exception as exc:  # noqa: BLE001 - a failing check is a FAIL line, the others still run
            logger.debug("check %s failed", name, exc_info=True)
            status, detail = FAIL, f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"
        result = Check(status, name, detail, time.perf_counter() - start)
        results.append(result)
        emit(result)
    return results
