"""A run's memory plan from its config: where the model, the device and the world are known.

- `plan_for`: the plan of a run as configured (the trainer calls it before its first step, on the
  device it measures; `doctor --plan` on a device it is told).
- `size_gpu_profile`: what `--profile auto` scales on a GPU, before anything is loaded: the gpu
  profile's values are each knob's H100 value for Qwen2.5-1.5B on 80 GB; a bigger model takes
  `LARGE_MODEL_LR`, and the update's token budget left at its profile value is the one the plan
  chooses beside the engine's episodes (`memory.plan.plan_run`). Nothing fits: one `error:` line.
"""

from __future__ import annotations

import math
from typing import Any

from skyrl_tool_agent.config import Config
from skyrl_tool_agent.memory.device import GIB
from skyrl_tool_agent.memory.model import Setup
from skyrl_tool_agent.memory.plan import CUDA_CONTEXT_BYTES, RunPlan, plan_run
from skyrl_tool_agent.memory.shape import ModelShape

#: Parameters from which the learning rate is the large model's.
LARGE_MODEL_PARAMS = 5e9
LARGE_MODEL_LR = 1e-5
#: The engine's prefill chunk by default (tokens), and its stop-check interval, per device kind.
PREFILL_TOKENS = {"cuda": 16384, "cpu": 4096}
STOP_CHECK_INTERVAL = {"cuda": 8, "cpu": 1}


def knobs_at_profile(config: Config) -> set[str]:
    """The knobs `size_gpu_profile` may size: those still at their H100 value (a value set by `--set`
    or in a file is the user's)."""
    from skyrl_tool_agent.config.base import h100_value
    from skyrl_tool_agent.config.training import TrainingConfig

    return {f"training.{k}" for k in ("learning_rate", "micro_batch_tokens")
            if getattr(config.training, k) == h100_value(TrainingConfig.model_fields[k])}


def setup_for(config: Config, shape: ModelShape, *, world: int, dtype_bytes: int = 2, zero3: bool = True) -> Setup:
    """The memory model's view of a run of `config` on `world` ranks (`zero3`: full mode's weights
    partitioned, as in any launched run)."""
    return Setup(shape, mode=config.training.mode, four_bit=config.model.quantization.load_in_4bit, world=world,
                 lora_r=config.model.lora.r, kl=config.grpo.kl_coef > 0,
                 checkpointing=config.model.gradient_checkpointing, dtype_bytes=dtype_bytes, zero3=zero3,
                 kbit_upcast=config.model.dtype == "float16")


def episodes_in_flight(config: Config, world: int) -> int:
    """Episodes one rank wants in flight at once: its share of a step's, at most the collector's concurrency."""
    g = config.grpo
    tasks = g.batcher.max_batch if g.batcher.enabled else config.training.tasks_per_step
    return max(1, min(config.env.collector.concurrency, math.ceil(tasks * g.group_size / world)))


def plan_for(config: Config, shape: ModelShape, *, device_bytes: int, world: int, device_kind: str,
             dtype_bytes: int = 2, choose_update: bool = False, zero3: bool = True) -> RunPlan:
    """The plan of a run of `config` on one of `world` devices of `device_bytes` ('cuda' or 'cpu'):
    the update's budget as configured, or chosen by the plan when `choose_update`."""
    t, g = config.training, config.grpo
    configured = t.micro_batch_tokens or t.micro_batch_size * g.max_total_tokens
    return plan_run(setup_for(config, shape, world=world, dtype_bytes=dtype_bytes, zero3=zero3), device_bytes=device_bytes,
                    fraction=config.model.engine_memory_fraction, demand=episodes_in_flight(config, world),
                    max_total_tokens=g.max_total_tokens, update_tokens=None if choose_update else configured,
                    update_cap=configured, prefill_default=PREFILL_TOKENS[device_kind],
                    stop_check_interval=STOP_CHECK_INTERVAL[device_kind],
                    overhead_bytes=CUDA_CONTEXT_BYTES if device_kind == "cuda" else 0)


def size_gpu_profile(config: Config, shape: ModelShape | None, *, device_bytes: int, world: int,
                     at_profile: set[str]) -> tuple[dict[str, Any], list[str], RunPlan | None]:
    """The gpu profile's knobs sized to `shape` on `world` devices of `device_bytes`: (dotted knob ->
    value, for those that change among `at_profile`, the knobs still at their H100 value; one
    reason per knob, in words; the plan). Raises `PlanError` when nothing fits."""
    if shape is None:
        return {}, ["the model's config.json could not be read (not a local model, not in the Hugging Face "
                    "cache, and not downloadable here): the 1.5B-on-80-GB values are kept"], None
    changes: dict[str, Any] = {}
    why: list[str] = []
    size = f"{shape.params / 1e9:.1f} B parameters ({shape.source})"
    lr = config.training.learning_rate
    if "training.learning_rate" in at_profile and shape.params >= LARGE_MODEL_PARAMS and lr > LARGE_MODEL_LR:
        changes["training.learning_rate"] = LARGE_MODEL_LR
        why.append(f"training.learning_rate {lr:g} -> {LARGE_MODEL_LR:g}: {size}, at least {LARGE_MODEL_PARAMS / 1e9:g} B")
    else:
        why.append(f"training.learning_rate {lr:g} kept: {size}")
    choose = "training.micro_batch_tokens" in at_profile
    plan = plan_for(config, shape, device_bytes=device_bytes, world=world, device_kind="cuda", choose_update=choose)
    tokens = config.training.micro_batch_tokens
    if choose and plan.update_tokens != tokens:
        changes["training.micro_batch_tokens"] = plan.update_tokens
        why.append(f"training.micro_batch_tokens {tokens} -> {plan.update_tokens}: the memory plan's, beside "
                   f"{plan.slots} of {plan.demand} episodes in flight on {device_bytes / GIB:.0f} GiB")
    else:
        why.append(f"training.micro_batch_tokens {tokens} kept")
    return changes, why, plan
