"""Load a Qwen2-architecture causal LM and tokenizer for training: device, dtype, LoRA, QLoRA, full.

`name_or_path` is a hub name (`Qwen/Qwen2.5-1.5B-Instruct`), a local directory, or `embedded`
(the project's tiny CPU model, built on first use; see `skyrl_tool_agent.policy.embedded`).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from skyrl_tool_agent.config import EMBEDDED, ModelConfig, UserInputError, require_extra
from skyrl_tool_agent.policy.device import DTYPES, resolve_dtype
from skyrl_tool_agent.policy.manifest import verify_manifest

if TYPE_CHECKING:  # transformers is imported where a model is loaded: a launch's ranks resolve the
    # model's path while agreeing on the launch (distributed.agreement), before the policy's imports
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

logger = logging.getLogger(__name__)


class ModelLoadError(UserInputError):
    """A model or tokenizer could not be loaded; the message says which path and why (one line)."""


def resolve_model_path(config: ModelConfig) -> str:
    """The path or hub name to load; an embedded model's files are checked against its manifest."""
    if config.name_or_path != EMBEDDED:
        name = config.name_or_path
        # A hub id is `name` or `org/name`; anything that looks like a path must exist (else the hub
        # client's "Repo id must be in the form ..." is all the user sees).
        if name.startswith(("/", "./", "../", "~")) and not Path(name).expanduser().is_dir():
            raise ModelLoadError(f"model directory {name!r} does not exist")
        return name
    path = config.resolved_embedded_dir()
    try:
        verify_manifest(path)
    except ValueError as exc:
        if config.uses_shipped_model():
            raise ModelLoadError(f"the shipped embedded model is unusable: {exc}") from exc
        raise ModelLoadError(
            f"embedded model not built (or only partly) at {path}: {exc}; run `python "
            f"training/scripts/build_default_model.py --out {path}` (train_grpo.py does this automatically)"
        ) from exc
    return str(path)


def load_tokenizer(path: str, config: ModelConfig) -> PreTrainedTokenizerBase:
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(
            path, revision=config.revision, trust_remote_code=config.trust_remote_code
        )
    except Exception as exc:  # noqa: BLE001 - any failure is reported as one clear line
        raise ModelLoadError(f"cannot load tokenizer from {path!r}: {type(exc).__name__}: {exc}") from exc
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"  # generation batches are left-padded
    return tokenizer


def _quantization_kwargs(config: ModelConfig, device: torch.device) -> dict[str, Any]:
    if not config.quantization.load_in_4bit:
        return {}
    require_extra("bitsandbytes", "qlora", "model.quantization.load_in_4bit (QLoRA)")
    from transformers import BitsAndBytesConfig
    bnb = BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type=config.quantization.quant_type,
        bnb_4bit_compute_dtype=DTYPES[config.quantization.compute_dtype],
        bnb_4bit_use_double_quant=config.quantization.double_quant,
    )
    return {"quantization_config": bnb, "device_map": {"": device}}


def from_pretrained(path: str, config: ModelConfig, dtype: torch.dtype, **kwargs: Any) -> PreTrainedModel:
    """The causal LM at `path` in `dtype`, with `config`'s revision, attention and remote-code
    settings (and `kwargs`); a failure is one `ModelLoadError` line."""
    from transformers import AutoModelForCausalLM

    try:
        return AutoModelForCausalLM.from_pretrained(path, revision=config.revision, dtype=dtype,
                                                    attn_implementation=config.attn_implementation,
                                                    trust_remote_code=config.trust_remote_code, **kwargs)
    except Exception as exc:  # noqa: BLE001 - any failure is reported as one clear line
        raise ModelLoadError(f"cannot load model from {path!r}: {type(exc).__name__}: {exc}") from exc


def load_model(path: str, config: ModelConfig, device: torch.device, *, mode: str) -> PreTrainedModel:
    """Load the base model, then wrap it for `mode` ('lora' adds peft adapters; 'full' trains all)."""
    quant = _quantization_kwargs(config, device)
    model = from_pretrained(path, config, resolve_dtype(config.dtype, device), **quant)
    if not quant:
        model.to(device)
    else:
        pin_4bit_training_layout(model)
    if config.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.config.use_cache = False
    if mode == "lora":
        model = _add_lora(model, config, quantized=bool(quant))
    elif quant:
        raise ModelLoadError("4-bit quantization only trains adapters: use --mode lora with load_in_4bit")
    return model


def _add_lora(model: PreTrainedModel, config: ModelConfig, *, quantized: bool) -> PreTrainedModel:
    from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training

    if quantized:
        # peft's k-bit preparation upcasts what is not 4-bit to float32, which only fp16 needs for its
        # range; for bf16 it would double the embedding and head and make every kept activation fp32.
        bf16 = [p for p in model.parameters() if p.dtype == torch.bfloat16 and type(p).__name__ != "Params4bit"]
        model = prepare_model_for_kbit_training(
            model, use_gradient_checkpointing=config.gradient_checkpointing
        )
        for param in bf16:
            param.data = param.data.to(torch.bfloat16)
    lora = LoraConfig(
        r=config.lora.r,
        lora_alpha=config.lora.alpha,
        lora_dropout=config.lora.dropout,
        target_modules=list(config.lora.target_modules),
        task_type="CAUSAL_LM",
    )
    peft_model = get_peft_model(model, lora)
    trainable, total = peft_model.get_nb_trainable_parameters()
    logger.info("LoRA: %d trainable of %d parameters (%.2f%%)", trainable, total, 100 * trainable / total)
    return peft_model


# ---------------------------------------------------------------------------- QLoRA on CPU
def pin_4bit_training_layout(model: torch.nn.Module) -> int:
    """Stop bitsandbytes from repacking 4-bit weights for its CPU inference kernel; returns the
    number of 4-bit layers.

    On CPUs with AVX512-BF16, bitsandbytes (0.48+) repacks a `Linear4bit` weight the first time it
    runs in eval mode without gradients; the packed layout has no backward (a later training
    forward raises or silently drops the gradient), and the policy samples in eval mode between
    updates. `check_4bit_training_layout` catches a bitsandbytes that packs anyway.
    """
    try:
        from bitsandbytes.nn import Linear4bit
    except ImportError:  # pragma: no cover - no 4-bit layers without bitsandbytes
        return 0
    layers = [m for m in model.modules() if isinstance(m, Linear4bit)]
    for layer in layers:
        layer.support_avx512bf16_for_cpu = False  # bitsandbytes' own switch for the repacking
    return len(layers)


def check_4bit_training_layout(model: torch.nn.Module) -> None:
    """Raise if any 4-bit weight is in bitsandbytes' CPU inference layout (see
    `pin_4bit_training_layout`), which cannot be trained through."""
    for name, module in model.named_modules():
        state = getattr(getattr(module, "weight", None), "quant_state", None)
        if state is not None and getattr(state, "packing_format_for_cpu", False):
            raise RuntimeError(
                f"QLoRA: the 4-bit weight of {name} was repacked by bitsandbytes for CPU inference "
                "(its AVX512-BF16 kernel, used by eval-mode forwards without gradients such as generate); "
                "that layout has no backward, so training through it would fail or drop gradients. "
                "Load the model with skyrl_tool_agent.policy.loading.load_model, which switches the "
                "repacking off; if it did, this bitsandbytes version no longer honours "
                "Linear4bit.support_avx512bf16_for_cpu (tested with bitsandbytes 0.50)"
            )
