"""`ModelConfig` (configs/model_config.yaml): which model to load, where, in what precision, LoRA/QLoRA."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from pydantic import Field

from skyrl_tool_agent.config.base import Section, expand_path, knob

EMBEDDED = "embedded"
#: Environment variable naming the project's cache root (default ~/.cache/skyrl_tool_agent).
CACHE_ENV_VAR = "SKYRL_TOOL_AGENT_CACHE"
DEFAULT_CACHE_ROOT = "~/.cache/skyrl_tool_agent"
#: The embedded model that ships inside the package (built by build_default_model.py --ship).
SHIPPED_EMBEDDED_DIR = Path(__file__).resolve().parents[1] / "assets" / "embedded"

DType = Literal["auto", "float32", "bfloat16", "float16"]
Device = Literal["auto", "cpu", "mps", "cuda"]
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


class LoraConfig(Section):
    """LoRA adapter (used when training.mode is lora)."""

    r: int = knob(16, "Adapter rank.", ge=1)
    alpha: float = knob(32.0, "LoRA scaling numerator (scale = alpha / r).", gt=0)
    dropout: float = knob(0.05, "Dropout on the adapter input.", ge=0, lt=1)
    target_modules: list[str] = knob(
        default_factory=lambda: list(LORA_TARGETS),
        description="Module names that get adapters. The default covers all attention and MLP "
        "projections of Qwen2 (PEFT also accepts 'all-linear').",
        min_length=1,
    )


class QuantizationConfig(Section):
    """bitsandbytes 4-bit loading of the frozen base (QLoRA); needs CUDA and training.mode lora."""

    load_in_4bit: bool = knob(False, "Load the base model in 4 bit (QLoRA).")
    quant_type: Literal["nf4", "fp4"] = knob("nf4", "4-bit data type (bnb_4bit_quant_type).")
    compute_dtype: Literal["bfloat16", "float16", "float32"] = knob(
        "bfloat16", "Dtype of the matmuls on dequantized weights (bnb_4bit_compute_dtype)."
    )
    double_quant: bool = knob(True, "Also quantize the quantization constants (bnb_4bit_use_double_quant).")


class ModelConfig(Section):
    """The policy model: which checkpoint, device and dtype, attention kernel, LoRA and quantization."""

    name_or_path: str = knob(
        EMBEDDED,
        "Model to train: 'embedded', a hub name or a local directory. 'embedded' = the project's "
        "tiny Qwen2-architecture model: the warm-started copy shipped in the package (no download, "
        "no build), or one built into embedded_dir.",
        h100="Qwen/Qwen2.5-1.5B-Instruct",
        min_length=1,
    )
    embedded_dir: str | None = knob(
        None,
        "Where the embedded model comes from. null = the copy shipped in the package "
        "(skyrl_tool_agent/assets/embedded, its files checked against their recorded sha256 at "
        "load); a directory = a model built there by build_default_model.py, built on first use "
        "when missing (train_grpo.py --rebuild builds into $SKYRL_TOOL_AGENT_CACHE/embedded, else "
        "~/.cache/skyrl_tool_agent/embedded). `~` and $VARS are expanded.",
    )
    revision: str | None = knob(None, "Hub revision (branch, tag or commit); null = the default branch.")
    dtype: DType = knob(
        "auto",
        "Parameter dtype. auto = bfloat16 on CUDA, float32 elsewhere (CPU bf16 matmuls are slow).",
    )
    device: Device = knob(
        "auto",
        "Device for the policy. auto = cuda if available, else mps, else cpu. Under a distributed "
        "launcher, cuda means the local rank's GPU.",
    )
    attn_implementation: Literal["sdpa", "eager", "flash_attention_2"] = knob(
        "sdpa",
        "Attention kernel. flash_attention_2 needs CUDA and the flash-attn package; sdpa already "
        "uses flash kernels on H100.",
    )
    gradient_checkpointing: bool = knob(
        False,
        "Recompute activations in backward to save memory (about 30% slower).",
        h100=True,
    )
    trust_remote_code: bool = knob(
        False, "Allow custom modeling code from the hub (Qwen2 is built into transformers)."
    )
    engine_memory_fraction: float = knob(
        0.9,
        "Share of device memory the rollout engine's KV cache may fill (as vLLM's gpu_memory_utilization). "
        "On CUDA the cache gets this fraction of the GPU's total memory less what is in use (weights, "
        "reference, optimizer state, other processes) and the forward's working set; on CPU this "
        "fraction of the RAM available. The engine takes one slot "
        "per episode in flight up to what fits (the log says how many and why); the other episodes "
        "wait for a slot. Too small for one slot is an error naming the sizes.",
        gt=0,
        le=1,
    )
    lora: LoraConfig = Field(default_factory=LoraConfig, description="LoRA adapter settings.")
    quantization: QuantizationConfig = Field(
        default_factory=QuantizationConfig, description="4-bit base model (QLoRA) settings."
    )

    def is_embedded(self) -> bool:
        """Whether `name_or_path` asks for the project's embedded tiny model."""
        return self.name_or_path == EMBEDDED

    def uses_shipped_model(self) -> bool:
        """Whether the embedded model is the copy shipped in the package (`embedded_dir` null)."""
        return self.is_embedded() and self.embedded_dir is None

    def resolved_embedded_dir(self) -> Path:
        """The embedded model's directory (see `embedded_dir`), `~` and $VARS expanded."""
        if self.embedded_dir is not None:
            return expand_path(self.embedded_dir)
        return SHIPPED_EMBEDDED_DIR


def cache_root() -> Path:
    """The project's cache: $SKYRL_TOOL_AGENT_CACHE, else ~/.cache/skyrl_tool_agent (`~`, $VARS expanded)."""
    return expand_path(os.environ.get(CACHE_ENV_VAR) or DEFAULT_CACHE_ROOT)


def default_build_dir() -> Path:
    """Where the embedded model is built when no directory is given: the project's cache."""
    return cache_root() / "embedded"
