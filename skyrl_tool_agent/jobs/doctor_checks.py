"""The doctor's checks (`jobs.doctor` runs them). Each returns (PASS / WARN / FAIL / SKIP, what it
measured); GPU-only checks SKIP without CUDA; NCCL and DeepSpeed run in a child process, so a hang
or crash there is a FAIL line, not the doctor's."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from skyrl_tool_agent.config import ModelConfig
from skyrl_tool_agent.memory.device import GIB

PASS, WARN, FAIL, SKIP = "PASS", "WARN", "FAIL", "SKIP"
#: Seconds a one-rank child (NCCL, DeepSpeed) may take, imports included, before it is a FAIL.
RANK_CHECK_TIMEOUT_S = 180
#: Free disk under which the check warns: a 7B's final/ + 2 checkpoints on a GPU; runs of the
#: embedded model on a CPU.
DISK_WARN_GIB = {"cuda": 60.0, "cpu": 2.0}
#: A real question through the chat template: the training step's prompt.
PROMPT = "Database: library\nQuestion: How many books are in the 'History' genre?"


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
        status = PASS if vm.available >= 2 * GIB else WARN
        return status, f"RAM {vm.available / GIB:.1f} GiB available of {vm.total / GIB:.1f} (the embedded model needs < 1)"
    free, total = torch.cuda.mem_get_info(device)
    return PASS, f"{free / GIB:.1f} GiB free of {total / GIB:.1f} (the memory plan below says what a run of yours gets)"


def check_memory_plan(config: Any, device: torch.device, *, gpu_memory_gib: float | None = None,
                      world: int = 1) -> tuple[str, str]:
    """The memory plan train would make for `config` on one of `world` GPUs of `gpu_memory_gib`, else
    on `device`: PASS with the plan's line, FAIL with what would fit, WARN without the model's shape."""
    import psutil

    from skyrl_tool_agent.memory.plan import PlanError
    from skyrl_tool_agent.memory.shape import shape_of
    from skyrl_tool_agent.memory.sizing import knobs_at_profile, plan_for
    from skyrl_tool_agent.policy.loading import resolve_model_path

    if gpu_memory_gib is not None:
        device_kind, device_bytes = "cuda", int(gpu_memory_gib * GIB)
    elif device.type == "cuda":
        device_kind, device_bytes = "cuda", int(torch.cuda.get_device_properties(device).total_memory)
    else:
        device_kind, device_bytes = "cpu", psutil.virtual_memory().available
    model = config.model.name_or_path
    shape = shape_of(str(resolve_model_path(config.model)) if model == "embedded" else model)
    if shape is None:
        return WARN, f"the config.json of {model} could not be read (offline and not cached?): no plan"
    choose = device_kind == "cuda" and "training.micro_batch_tokens" in knobs_at_profile(config)  # as train sizes it
    try:
        plan = plan_for(config, shape, device_bytes=device_bytes, world=world, device_kind=device_kind,
                        choose_update=choose)
    except PlanError as error:
        return FAIL, str(error)
    where = f"{world} x " if world > 1 else ""
    return PASS, f"{config.training.mode} {model} on {where}{device_bytes / GIB:.0f} GiB: {plan.describe()}"


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
    from skyrl_tool_agent.policy.sampling_params import GREEDY

    policy = _policy(device)
    prompt = _prompt_ids(policy.tokenizer)
    rows, new = 16, 32
    batch = [prompt[: len(prompt) - i % 4] for i in range(rows)]  # a few lengths: several slots' positions
    runs: dict[str, Any] = {}
    failed = False
    for label, graphs in (("graphs", True), ("eager", False)):
        engine = RolloutEngine(policy.model, slots=rows, capacity=len(prompt) + new, stop_ids=[],
                               pad_id=policy.tokenizer.pad_token_id, cuda_graphs=graphs)
        start = time.perf_counter()
        runs[label] = [r[0] for r in engine.generate(batch, GREEDY, max_new_tokens=new,
                                                      seeds=list(range(rows)))]
        torch.cuda.synchronize(device)
        runs[f"{label}_s"] = time.perf_counter() - start
        failed = failed or (graphs and capture_failed(engine))
        engine.close()
    same = sum(a == b for a, b in zip(runs["graphs"], runs["eager"]))
    if failed:  # the engine fell back to eager: both runs were eager, so their agreement proves nothing
        return FAIL, (f"CUDA-graph capture failed and the engine decoded eagerly (both runs eager; {same}/{rows} rows "
                      "agree, which proves nothing): rollouts run without graphs, several times slower")
    status = PASS if same == rows else FAIL
    return status, (f"captured decode = eager decode in {same}/{rows} rows of {new} greedy tokens "
                    f"(embedded model, bf16; graphs {runs['graphs_s']:.2f} s incl. capture, eager {runs['eager_s']:.2f} s)")


def capture_failed(engine: Any) -> bool:
    """Whether `engine` (a `RolloutEngine`) tried to capture its decode step as a CUDA graph and
    fell back to eager: its stats' `capture_failed`."""
    return bool(engine is not None and engine.stats.get("capture_failed"))


def sampling_engine(policy: Any) -> Any:
    """The rollout engine `policy` sampled with (None when it has none): the one place the doctor
    reaches into the policy for it."""
    return getattr(policy, "_engine", None)


def check_training_step(device: torch.device) -> tuple[str, str]:
    from skyrl_tool_agent.grpo.advantages import group_advantages
    from skyrl_tool_agent.grpo.losses import grpo_loss
    from skyrl_tool_agent.policy.sampling_params import SamplingParams

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    policy = _policy(device)
    prompt = _prompt_ids(policy.tokenizer)
    group = 4
    torch.manual_seed(1)
    gens = policy.generate([prompt] * group, SamplingParams(temperature=1.0), max_new_tokens=24,
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
    graphs_failed = capture_failed(sampling_engine(policy))
    ok = bool(torch.isfinite(loss)) and grad_ok and moved == len(params) and drift < tolerance and not graphs_failed
    memory = (f", peak {torch.cuda.max_memory_allocated(device) / GIB:.2f} GiB" if device.type == "cuda" else "")
    return (PASS if ok else FAIL), (
        ("its engine's CUDA-graph capture FAILED (sampled eagerly); " if graphs_failed else "") +
        f"{group} episodes sampled ({policy.sampler()} sampler, {int(mask.sum())} tokens), loss "
        f"{loss.item():.4f}, gradients {'finite' if grad_ok else 'NOT finite'}, {moved}/{len(params)} adapter "
        f"tensors updated, sampling vs training log-prob max |diff| {drift:.1e} (limit {tolerance:g}){memory}")


def check_4bit_matmul(device: torch.device) -> tuple[str, str]:
    """bitsandbytes' NF4 linear layer (what QLoRA trains through) against the same weights
    dequantised, on the device."""
    if device.type != "cuda":
        return SKIP, "GPU-only (no CUDA device): QLoRA's 4-bit kernels run on CUDA"
    try:
        import bitsandbytes as bnb
    except ImportError as exc:
        return WARN, f"bitsandbytes is not importable ({exc}): model.quantization.load_in_4bit (QLoRA) cannot run"
    torch.manual_seed(0)
    layer = bnb.nn.Linear4bit(512, 256, bias=False, compute_dtype=torch.bfloat16, quant_type="nf4")
    layer.weight = bnb.nn.Params4bit(torch.randn(256, 512) * 0.02, requires_grad=False, quant_type="nf4")
    layer = layer.to(device)
    x = torch.randn(8, 512, device=device, dtype=torch.bfloat16)
    out = layer(x).float()
    weight = bnb.functional.dequantize_4bit(layer.weight.data, layer.weight.quant_state).float()
    exact = x.float() @ weight.t()
    error = ((out - exact).norm() / exact.norm()).item()
    return (PASS if error < 2e-2 else FAIL), (f"bitsandbytes {bnb.__version__} NF4 512x256 on {device}: relative error "
                                               f"{error:.1e} against its dequantised weights (limit 2e-2)")


#: A one-rank child's program (`python -c`): `nccl` joins a process group of one and all-reduces;
#: `zero3` initialises DeepSpeed ZeRO-3 on one rank and takes one optimizer step. Prints OK + detail.
RANK_PROGRAM = r"""
import os, sys, time
import torch
kind, device = sys.argv[1], sys.argv[2]
start = time.perf_counter()
if kind == "nccl":
    import torch.distributed as dist
    backend = "nccl" if device == "cuda" else "gloo"
    dist.init_process_group(backend=backend, rank=0, world_size=1)
    t = torch.ones(4, device=device)
    dist.all_reduce(t)
    ok = t.tolist() == [1.0] * 4
    dist.destroy_process_group()
    print(("OK " if ok else "BAD ") + f"{backend} process group of 1 rank, all_reduce {'exact' if ok else 'WRONG'}"
          f" ({torch.cuda.nccl.version() if backend == 'nccl' else 'gloo'})")
else:
    if device == "cpu":
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
        from skyrl_tool_agent.distributed.comm import skip_cpu_shared_memory_op
        skip_cpu_shared_memory_op()
    import deepspeed
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    config = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1, "zero_allow_untested_optimizer": True,
              "zero_optimization": {"stage": 3}, "bf16": {"enabled": device == "cuda"}}
    # torch's AdamW, as the trainer: DeepSpeed's own would compile its op first
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
    x = torch.randn(2, 64, device=engine.device, dtype=torch.bfloat16 if device == "cuda" else torch.float32)
    loss = engine(x).float().pow(2).mean()
    engine.backward(loss)
    engine.step()
    ok = bool(torch.isfinite(loss)) and engine.zero_optimization_stage() == 3
    print(("OK " if ok else "BAD ") + f"DeepSpeed {deepspeed.__version__} ZeRO-3 on 1 rank ({device}): "
          f"initialised, one step, loss {loss.item():.4f}")
"""


def one_rank(kind: str, device: torch.device, timeout_s: float = RANK_CHECK_TIMEOUT_S) -> tuple[str, str]:
    """Run `RANK_PROGRAM` `kind` in a child process as rank 0 of 1 on a free local port: its OK line
    is a PASS; anything else (an error, a hang past `timeout_s`) is a FAIL with its last line."""
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {**os.environ, "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    try:
        done = subprocess.run([sys.executable, "-c", RANK_PROGRAM, kind, device.type], capture_output=True, text=True,
                              timeout=timeout_s, env=env, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return FAIL, f"no answer in {timeout_s:g} s (a hang at initialisation)"
    lines = [line for line in done.stdout.splitlines() if line.startswith(("OK ", "BAD "))]
    if done.returncode == 0 and lines and lines[-1].startswith("OK "):
        return PASS, lines[-1][3:]
    tail = [line for line in (done.stderr + done.stdout).splitlines() if line.strip()]
    return FAIL, f"exit {done.returncode}: {(lines[-1] if lines else tail[-1] if tail else 'no output')[:300]}"


def check_nccl(device: torch.device) -> tuple[str, str]:
    if device.type != "cuda":
        return SKIP, "GPU-only (no CUDA device): several GPUs reduce through NCCL"
    return one_rank("nccl", device)


def check_deepspeed(device: torch.device) -> tuple[str, str]:
    try:
        import importlib.metadata

        importlib.metadata.version("deepspeed")
    except importlib.metadata.PackageNotFoundError:
        return WARN, "DeepSpeed is not installed: full mode on several GPUs (ZeRO-3) cannot run"
    if device.type != "cuda":
        return SKIP, "GPU-only (no CUDA device): full mode's ZeRO-3 runs on GPUs (tests/test_deepspeed.py runs it on CPU ranks)"
    return one_rank("zero3", device)


def check_mcp_servers() -> tuple[str, str]:
    """The configured MCP servers start and list their tools (on the configured databases)."""
    from skyrl_tool_agent.config import load_config
    from skyrl_tool_agent.eval.splits import TaskSplits
    from skyrl_tool_agent.jobs.run import open_run

    config = load_config()
    with open_run(config, TaskSplits.load(config).db_root) as run:  # starts every server and lists its tools
        listed = {server.name: [t.name for t in run.runtime.all_tools if t.server == server.name]
                  for server in config.env.mcp_servers}
    empty = [name for name, tools in listed.items() if not tools]
    detail = "; ".join(f"{name}: {', '.join(tools) or 'no tools'}" for name, tools in listed.items())
    return (WARN if empty else PASS), f"{len(listed)} server(s) started and listed their tools ({detail})"


def check_data() -> tuple[str, str]:
    """The configured dataset's tasks and databases load (every record checked at load)."""
    from skyrl_tool_agent.config import load_config
    from skyrl_tool_agent.eval.splits import TaskSplits

    config = load_config()
    splits = TaskSplits.load(config)
    return PASS, (f"dataset {config.training.data.dataset}: {len(splits.train)} train and {len(splits.dev)} dev tasks, "
                  f"databases in {splits.db_root}")


def check_spider() -> tuple[str, str]:
    from skyrl_tool_agent.config import load_config

    root = Path(load_config().training.data.spider_root).expanduser()
    missing = [name for name in ("dev.json", "train_spider.json", "database") if not (root / name).exists()]
    if missing:
        return SKIP, (f"Spider not at {root.resolve()} (no {', '.join(missing)}): needed only for "
                      "training.data.dataset=spider (set training.data.spider_root)")
    dbs = sum(1 for p in (root / "database").iterdir() if p.is_dir())
    return PASS, f"Spider at {root.resolve()}: dev.json, train_spider.json, {dbs} databases"


def check_disk(device: torch.device) -> tuple[str, str]:
    """Free space where runs are written (the working directory) and where models are cached."""
    from huggingface_hub.constants import HF_HUB_CACHE

    cache = Path(HF_HUB_CACHE)
    while not cache.exists():
        cache = cache.parent
    warn = DISK_WARN_GIB["cuda" if device.type == "cuda" else "cpu"]
    spots = {"runs (.)": Path.cwd(), f"model cache ({cache})": cache}
    free = {label: shutil.disk_usage(path).free / GIB for label, path in spots.items()}
    detail = ", ".join(f"{label} {gib:.1f} GiB free" for label, gib in free.items())
    low = [label for label, gib in free.items() if gib < warn]
    if low:
        return WARN, f"{detail}: under {warn:g} GiB at {', '.join(low)} (checkpoints and final/ need room)"
    return PASS, f"{detail} (warns under {warn:g} GiB)"


CHECKS: tuple[tuple[str, Callable[..., tuple[str, str]], bool], ...] = (
    ("torch", check_torch, False),
    ("device", check_device, True),
    ("memory", check_memory, True),
    ("bf16 matmul", check_bf16_matmul, True),
    ("engine graph capture", check_graph_capture, True),
    ("training step", check_training_step, True),
    ("4-bit matmul", check_4bit_matmul, True),
    ("NCCL one rank", check_nccl, True),
    ("DeepSpeed ZeRO-3 one rank", check_deepspeed, True),
    ("MCP servers", check_mcp_servers, False),
    ("dataset", check_data, False),
    ("Spider", check_spider, False),
    ("disk", check_disk, True),
)
