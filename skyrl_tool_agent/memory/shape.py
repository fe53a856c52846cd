"""A Qwen2 decoder's shape, the one input of the memory model: read once from its config.json.

`shape_of(model)` finds the config.json of a model directory, an adapter's base, a checkpoint's
weights/, or a hub name (the HF cache, else downloaded once unless HF_HUB_OFFLINE is set).
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: Public Qwen2.5 architectures (config.json of the hub repos), for the docs' table and random-weight
#: GPU checks.
QWEN25: dict[str, dict[str, Any]] = {
    "Qwen2.5-1.5B": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                         num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True),
    "Qwen2.5-7B": dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
                       num_key_value_heads=4, vocab_size=152064, tie_word_embeddings=False),
}


@dataclass(frozen=True)
class ModelShape:
    """A Qwen2's sizes (from its config): what every memory figure is computed from."""

    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied: bool
    source: str = ""  # where the shape was read (for log lines)

    @classmethod
    def from_config(cls, config: Any, source: str = "") -> ModelShape:
        """From a `Qwen2Config`, or a config.json's dict."""
        get = (lambda k, d=None: config.get(k, d)) if isinstance(config, dict) else (
            lambda k, d=None: getattr(config, k, d))
        heads = int(get("num_attention_heads"))
        hidden = int(get("hidden_size"))
        return cls(hidden, int(get("intermediate_size")), int(get("num_hidden_layers")), heads,
                   int(get("num_key_value_heads") or heads), int(get("head_dim") or hidden // heads),
                   int(get("vocab_size")), bool(get("tie_word_embeddings", False)), source)

    @property
    def kv_dim(self) -> int:
        return self.kv_heads * self.head_dim

    @property
    def q_dim(self) -> int:
        return self.heads * self.head_dim

    def _projections(self) -> list[tuple[int, int]]:
        h, kv, q, inner = self.hidden, self.kv_dim, self.q_dim, self.intermediate
        return [(h, q), (h, kv), (h, kv), (q, h), (h, inner), (h, inner), (inner, h)]  # q k v o gate up down

    @functools.cached_property
    def linear_params(self) -> int:  # (the planner asks often)
        """The decoder layers' projection weights (what NF4 quantises and LoRA adapts)."""
        return self.layers * sum(i * o for i, o in self._projections())

    @property
    def embedding_params(self) -> int:
        """embed_tokens, and lm_head when it is not tied to it."""
        return self.vocab * self.hidden * (1 if self.tied else 2)

    @functools.cached_property
    def params(self) -> int:
        """Every parameter: projections, q/k/v biases, two norms a layer, the final norm, embeddings."""
        return self.linear_params + self.layers * (self.q_dim + 2 * self.kv_dim + 2 * self.hidden) + self.hidden \
            + self.embedding_params

    def lora_params(self, r: int) -> int:
        """LoRA adapters of rank `r` on all seven projections."""
        return self.layers * r * sum(i + o for i, o in self._projections())


def qwen25(name: str) -> ModelShape:
    """The shape of a `QWEN25` architecture."""
    return ModelShape.from_config(QWEN25[name], name)


def config_json(model: str) -> Path | None:
    """The config.json describing `model`'s base: a directory's own, its adapter's base's, a
    checkpoint's weights/, or a hub name's (local cache, else one download of that file)."""
    path = Path(model).expanduser()
    if not path.is_dir():
        return _hub_config(model)
    for _ in range(4):
        if not path.is_dir():
            return None
        if (path / "adapter_config.json").is_file():
            try:
                base = json.loads((path / "adapter_config.json").read_text()).get("base_model_name_or_path")
            except (OSError, ValueError):
                return None
            if not isinstance(base, str):
                return None
            path = Path(base).expanduser()
            if not path.is_dir():
                return _hub_config(base)
            continue
        if (path / "config.json").is_file():
            return path / "config.json"
        path = path / "weights"  # a checkpoint step-XXXXXX/
    return None


@functools.lru_cache(maxsize=32)
def _hub_config(repo: str) -> Path | None:
    if not re.fullmatch(r"[\w.-]+/[\w.-]+", repo):
        return None
    try:
        from huggingface_hub import hf_hub_download, try_to_load_from_cache

        found = try_to_load_from_cache(repo, "config.json")
        if isinstance(found, str):
            return Path(found)
        return Path(hf_hub_download(repo, "config.json"))  # honours HF_HUB_OFFLINE (then raises)
    except Exception:  # noqa: BLE001 - offline, unknown or private repo: no shape, said by the caller
        return None


def shape_of(model: str) -> ModelShape | None:
    """`model`'s shape from its config.json, or None when none can be read."""
    found = config_json(model)
    if found is None:
        return None
    try:
        return ModelShape.from_config(json.loads(found.read_text()), str(found))
    except (OSError, ValueError, KeyError, TypeError):
        return None
