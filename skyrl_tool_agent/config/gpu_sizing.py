"""What `--profile auto` scales on a GPU: the gpu profile's values are each knob's H100 value for
Qwen2.5-1.5B on 80 GB; a bigger model or a smaller card gets values sized to it.

- `training.learning_rate`: a model of `LARGE_MODEL_PARAMS` or more takes `LARGE_MODEL_LR` (the
  low end of the knob's documented LoRA range, its full-tuning value), not the 1.5B's 2e-5.
- `training.micro_batch_tokens`: the update's token budget that fits the device by the usual
  accounting (bf16 weights, or NF4 with `model.quantization.load_in_4bit`; gradient-checkpointed
  activations of ~(L*h + 7h + 3kv + 4I) values per token; the logits are chunked, never whole),
  within `UPDATE_MEMORY_FRACTION` of the device, in whole rows of `grpo.max_total_tokens`, at most
  the profile's value. The rollout engine keeps its KV cache through every update and plans its
  slots from what the update leaves (`policy.memory_plan`): a card the update nearly fills leaves
  the engine few slots (the log says how many; docs/distributed.md has the table).

The model's shape comes from its config.json (a model, adapter or checkpoint directory; a hub name
read from the local Hugging Face cache, never the network); without one, nothing is scaled (said).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

GIB = 2**30
#: Parameters from which the learning rate is the large model's.
LARGE_MODEL_PARAMS = 5e9
LARGE_MODEL_LR = 1e-5
#: Share of the device's memory one update may take (the rest: the rollout engine's cache, the CUDA
#: context, fragmentation).
UPDATE_MEMORY_FRACTION = 0.85


@dataclass(frozen=True)
class ModelShape:
    """A Qwen2-style decoder's size, from its config.json."""

    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    vocab: int
    tied: bool
    source: str  # where the shape was read

    @property
    def params(self) -> int:
        kv_dim = self.kv_heads * (self.hidden // max(self.heads, 1))
        layer = 2 * self.hidden * self.hidden + 2 * self.hidden * kv_dim + 3 * self.hidden * self.intermediate
        return self.layers * layer + self.vocab * self.hidden * (1 if self.tied else 2)

    @property
    def activation_bytes_per_token(self) -> int:
        """bf16 activations kept per token with gradient checkpointing (distributed/memory.py's formula)."""
        kv_dim = self.kv_heads * (self.hidden // max(self.heads, 1))
        return 2 * (self.layers * self.hidden + 7 * self.hidden + 3 * kv_dim + 4 * self.intermediate)


def _config_json(model: str) -> Path | None:
    """The config.json describing `model`'s base: a directory's own, its adapter's base's, a
    checkpoint's weights/, or a hub name's copy in the local cache (no download)."""
    path = Path(model).expanduser()
    for _ in range(4):
        if path.is_dir():
            if (path / "adapter_config.json").is_file():
                try:
                    base = json.loads((path / "adapter_config.json").read_text()).get("base_model_name_or_path")
                except (OSError, ValueError):
                    return None
                if not isinstance(base, str):
                    return None
                path = Path(base).expanduser()
                if not path.is_dir():
                    return _cached_config(base)
                continue
            if (path / "config.json").is_file():
                return path / "config.json"
            path = path / "weights"  # a checkpoint step-XXXXXX/
            continue
        return _cached_config(model)
    return None


def _cached_config(repo: str) -> Path | None:
    if not re.fullmatch(r"[\w.-]+/[\w.-]+", repo):
        return None
    try:
        from huggingface_hub import try_to_load_from_cache

        found = try_to_load_from_cache(repo, "config.json")
    except Exception:  # noqa: BLE001 - no cache, no shape: nothing is scaled
        return None
    return Path(found) if isinstance(found, str) else None


def model_shape(model: str) -> ModelShape | None:
    """`model`'s shape from its config.json, or None when none is at hand."""
    found = _config_json(model)
    if found is None:
        return None
    try:
        cfg = json.loads(found.read_text())
        return ModelShape(int(cfg["hidden_size"]), int(cfg["intermediate_size"]), int(cfg["num_hidden_layers"]),
                          int(cfg["num_attention_heads"]), int(cfg.get("num_key_value_heads") or cfg["num_attention_heads"]),
                          int(cfg["vocab_size"]), bool(cfg.get("tie_word_embeddings", False)), str(found))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def gpu_values(shape: ModelShape | None, memory_bytes: int, values: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """The gpu profile's knobs scaled to `shape` on a device of `memory_bytes`: (dotted knob ->
    value, for those that change; one reason per knob looked at, in words). `values` holds the
    profile's current `training.learning_rate`, `training.micro_batch_tokens`,
    `grpo.max_total_tokens`, `model.quantization.load_in_4bit` and `training.mode`."""
    if shape is None:
        return {}, ["the model's config.json is not at hand (a hub name not in the local cache): "
                    "the 1.5B-on-80-GB values are kept"]
    changes: dict[str, Any] = {}
    why: list[str] = []
    params = shape.params
    size = f"{params / 1e9:.1f} B parameters ({shape.source})"
    lr = values["training.learning_rate"]
    if params >= LARGE_MODEL_PARAMS and lr > LARGE_MODEL_LR:
        changes["training.learning_rate"] = LARGE_MODEL_LR
        why.append(f"training.learning_rate {lr:g} -> {LARGE_MODEL_LR:g}: {size}, at least {LARGE_MODEL_PARAMS / 1e9:g} B")
    else:
        why.append(f"training.learning_rate {lr:g} kept: {size}")
    tokens = values["training.micro_batch_tokens"]
    row = int(values["grpo.max_total_tokens"])
    four_bit = bool(values["model.quantization.load_in_4bit"])
    weights = (0.55 if four_bit else 2.0) * params * (1 if values["training.mode"] == "lora" else 8)
    room = UPDATE_MEMORY_FRACTION * memory_bytes - weights
    fits = max(0, int(room // shape.activation_bytes_per_token) // row * row)
    memory = f"{memory_bytes / GIB:.1f} GiB device"
    if tokens is not None and fits < tokens:
        if fits < row:
            why.append(f"training.micro_batch_tokens {tokens} kept, but even one row of {row} tokens may not fit "
                       f"{memory} beside the {'NF4' if four_bit else 'bf16'} weights ({weights / GIB:.1f} GiB): "
                       "try model.quantization.load_in_4bit=true or a shorter grpo.max_total_tokens")
        else:
            changes["training.micro_batch_tokens"] = fits
            why.append(f"training.micro_batch_tokens {tokens} -> {fits}: what {UPDATE_MEMORY_FRACTION:.0%} of the "
                       f"{memory} holds beside {weights / GIB:.1f} GiB of weights (full mode: and their optimizer state), "
                       f"{shape.activation_bytes_per_token / 1024:.0f} KiB of activations a token")
    else:
        why.append(f"training.micro_batch_tokens {tokens} kept: fits the {memory}")
    return changes, why
