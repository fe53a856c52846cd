"""`SamplingWeights`: the rollout engine's copy of a Qwen2's weights, as sampling needs them.

Once per optimizer step the engine takes a snapshot as sampling needs it: LoRA deltas folded in,
q/k/v and gate/up concatenated, 4-bit weights dequantized, ZeRO-3 shards gathered layer by layer
(what TRL, OpenRLHF and verl do when they feed vLLM); its arithmetic is `Qwen2ForCausalLM`'s in
eval mode. Where that second copy of every projection would cost episodes in flight, a LoRA or
QLoRA model is sampled `through_modules` instead (the base weights as they are, peft's adapters
beside them, as vLLM's LoRA serving does): no bytes, nothing to refresh, two small extra matmuls.

The snapshot is refreshed *in place* (`refresh_`), so captured CUDA graphs stay valid; a weight
that needs no change is a view of the parameter itself. A sharded model's refresh is collective,
so it runs only when the policy asks (`DeepSpeedPolicy.prepare_sampling`), never lazily.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from skyrl_tool_agent.memory.shape import ModelShape

# Modules peft may wrap that the snapshot folds into its fused weights.
_LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass
class LayerWeights:
    """One decoder layer's projections: fused weights, or (sampling `through_modules`) the model's
    own q, k, v, o, gate, up and down modules (the base matmul, bf16 or 4-bit, and peft's adapters)."""

    norm1: Tensor
    norm2: Tensor
    qkv_w: Tensor | None = None
    qkv_b: Tensor | None = None
    o_w: Tensor | None = None
    gate_up_w: Tensor | None = None
    down_w: Tensor | None = None
    modules: tuple[torch.nn.Module, ...] | None = None

    def qkv(self, x: Tensor) -> Tensor:
        if self.modules is not None:
            return torch.cat([m(x) for m in self.modules[:3]], dim=-1)
        return F.linear(x, self.qkv_w, self.qkv_b)

    def o(self, x: Tensor) -> Tensor:
        return self.modules[3](x) if self.modules is not None else F.linear(x, self.o_w)

    def gate_up(self, x: Tensor) -> Tensor:
        if self.modules is not None:
            return torch.cat([self.modules[4](x), self.modules[5](x)], dim=-1)
        return F.linear(x, self.gate_up_w)

    def down(self, x: Tensor) -> Tensor:
        return self.modules[6](x) if self.modules is not None else F.linear(x, self.down_w)


def base_model(model: torch.nn.Module) -> torch.nn.Module:
    """The `Qwen2ForCausalLM` under a peft wrapper or a DeepSpeed engine (or the model itself)."""
    model = getattr(model, "module", model)  # a DeepSpeed engine wraps the model as .module
    get_base = getattr(model, "get_base_model", None)
    return get_base() if callable(get_base) else model


def is_sharded(model: torch.nn.Module) -> bool:
    """True when the weights are ZeRO-3 partitioned (gathered only inside a forward)."""
    return any(hasattr(p, "ds_id") for p in model.parameters())


def _is_4bit(weight: Tensor) -> bool:
    return getattr(weight, "quant_state", None) is not None


def unsupported_reason(model: torch.nn.Module) -> str | None:
    """Why the engine cannot sample for `model` (None: it can); the policy then samples through
    `model.generate` and logs this reason."""
    base = base_model(model)
    config = getattr(base, "config", None)
    if getattr(config, "model_type", None) != "qwen2":
        return f"model_type {getattr(config, 'model_type', None)!r} is not qwen2"
    if getattr(config, "use_sliding_window", False):
        return "sliding-window attention"
    for name, module in base.named_modules():
        if hasattr(module, "lora_A") and name.rsplit(".", 1)[-1] not in _LINEARS:
            return f"adapter on {name} (only the attention and MLP projections are folded)"
        if any(getattr(module, "use_dora", {}).values()):
            return f"DoRA adapter on {name}"
        if any(getattr(module, "lora_bias", {}).values()):
            return f"LoRA bias on {name}"
    return None


def weights_version(model: torch.nn.Module) -> tuple[int, ...]:
    """Changes whenever any parameter is written in place (optimizer steps, checkpoint loads)."""
    return tuple(p._version for p in model.parameters())


@contextlib.contextmanager
def gathered(*modules: torch.nn.Module) -> Iterator[None]:
    """The ZeRO-3 shards of `modules`' parameters gathered on every rank for reading (collective);
    nothing to do for a model that is not sharded."""
    params = list({id(p): p for m in modules for p in m.parameters() if hasattr(p, "ds_id")}.values())
    if not params:
        yield
        return
    import deepspeed

    with deepspeed.zero.GatheredParameters(params, modifier_rank=None):
        yield


def effective_weight(module: torch.nn.Module, dtype: torch.dtype) -> tuple[Tensor, Tensor | None]:
    """(weight, bias) of a linear layer as its forward applies them, in `dtype`: a 4-bit weight
    dequantized, and the active LoRA adapters' deltas added when `module` is a peft LoRA layer whose
    adapters are enabled and not merged. A view of the parameter where nothing changes."""
    base = getattr(module, "base_layer", module)
    if _is_4bit(base.weight):  # (a detached Params4bit loses its quant_state)
        import bitsandbytes.functional as bnbf

        weight = bnbf.dequantize_4bit(base.weight.data, base.weight.quant_state)
    else:
        weight = base.weight.detach()
    weight = weight.to(dtype)
    bias = None if base.bias is None else base.bias.detach().to(dtype)
    if hasattr(module, "lora_A") and not getattr(module, "merged", False) and not getattr(module, "disable_adapters", False):
        for adapter in module.active_adapters:
            if adapter in module.lora_A:
                weight = weight + module.get_delta_weight(adapter).detach().to(dtype)
    return weight, bias


def sampling_dtype(model: torch.nn.Module) -> torch.dtype:
    """The dtype the engine samples in: the dtype the model was loaded in (a 4-bit weight's
    quantization state remembers it; an fp16 QLoRA's other parameters are float32, `policy.loading`)."""
    base = base_model(model)
    for module in base.modules():
        weight = getattr(module, "weight", None)
        if weight is not None and _is_4bit(weight):
            return weight.quant_state.dtype
    return base.model.embed_tokens.weight.dtype


class SamplingWeights:
    """The weights of a Qwen2 `model` as of the last `refresh_` (module docstring). The embedding
    and the head are read in their own dtype; only norms not in the sampling dtype are copied."""

    def __init__(self, model: torch.nn.Module, *, through_modules: bool = False) -> None:
        reason = unsupported_reason(model)
        if reason is not None:
            raise ValueError(f"the rollout engine cannot run this model: {reason}")
        if through_modules and is_sharded(model):  # a partitioned module's weight exists only inside its forward
            raise ValueError("a ZeRO-3 sharded model is sampled from a gathered snapshot, not through its modules")
        self.model = model
        base = base_model(model)
        cfg = base.config
        self.shape = ModelShape.from_config(cfg)  # heads, kv_heads, head_dim, layers: what the engine's shapes use
        self.rotary = base.model.rotary_emb
        self.eps = base.model.norm.variance_epsilon
        self.dtype = sampling_dtype(model)
        self.sharded = is_sharded(model)
        self.through_modules = through_modules
        # A sharded parameter's storage is freed after its gather: the snapshot owns copies.
        self.tensors = {name: t.clone() if self.sharded else t for name, t in self._components()}
        # Refreshes copy into these tensors in place, so these names stay valid for the run.
        self.embed, self.lm_head, self.final_norm = (self.tensors[k] for k in ("embed", "lm_head", "final_norm"))
        self.device = self.embed.device
        self.version = weights_version(model)
        self.refreshes = 0  # how many times the weights were copied in (tests, logs)

    @property
    def layers(self) -> list[LayerWeights]:
        if getattr(self, "_layers", None) is None:
            t, fields = self.tensors, [f for f in LayerWeights.__dataclass_fields__ if f != "modules"]
            self._layers = [LayerWeights(**{f: t.get(f"layers.{i}.{f}") for f in fields}, modules=_modules(layer)
                                         if self.through_modules else None)
                            for i, layer in enumerate(base_model(self.model).model.layers)]
        return self._layers

    def nbytes(self) -> int:
        """Bytes the snapshot holds beyond the model's own parameters (its copies)."""
        params = {p.data_ptr() for p in self.model.parameters()}
        return sum(t.numel() * t.element_size() for t in self.tensors.values() if t.data_ptr() not in params)

    # -------------------------------------------------------------- build and refresh
    def _components(self) -> Iterator[tuple[str, Tensor]]:
        """Every tensor of the snapshot by name, each layer's computed while its shards are gathered."""
        base, dtype = base_model(self.model), self.dtype
        inner = base.model
        # Through the modules, the embedding and the head stay as they are (an fp16 QLoRA's are
        # float32: a copy of both is ~2 GB for a 7B); the engine casts at the edges.
        keep = self.through_modules
        with torch.no_grad(), gathered(inner.embed_tokens, inner.norm, base.lm_head):
            yield "embed", inner.embed_tokens.weight.detach() if keep else inner.embed_tokens.weight.detach().to(dtype)
            yield "final_norm", inner.norm.weight.detach().to(dtype)
            yield "lm_head", effective_weight(base.lm_head, base.lm_head.weight.dtype if keep else dtype)[0]
        for i, layer in enumerate(inner.layers):
            with torch.no_grad(), gathered(layer):
                fused = _fuse(layer, dtype, norms_only=self.through_modules)
                yield from ((f"layers.{i}.{name}", tensor) for name, tensor in fused.items() if tensor is not None)

    def is_current(self) -> bool:
        """False when the model's weights changed since the snapshot (never for a sharded model,
        whose refresh is collective and explicit)."""
        return self.sharded or weights_version(self.model) == self.version

    @torch.no_grad()
    def refresh_(self) -> None:
        """Copy the model's current weights into the snapshot's own tensors (collective for a
        sharded model: call it on every rank at once)."""
        for name, tensor in self._components():
            mine = self.tensors[name]
            if mine.data_ptr() != tensor.data_ptr():
                mine.copy_(tensor)
        self.version = weights_version(self.model)
        self.refreshes += 1

    def norm(self, x: Tensor, weight: Tensor) -> Tensor:
        """RMSNorm as Qwen2's: in float32, scaled by `weight` in the input's dtype."""
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return weight * h.to(x.dtype)


def _modules(layer: torch.nn.Module) -> tuple[torch.nn.Module, ...]:
    attn, mlp = layer.self_attn, layer.mlp
    return attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj, mlp.gate_proj, mlp.up_proj, mlp.down_proj


def _fuse(layer: torch.nn.Module, dtype: torch.dtype, *, norms_only: bool = False) -> dict[str, Tensor | None]:
    norms = {"norm1": layer.input_layernorm.weight.detach().to(dtype),
             "norm2": layer.post_attention_layernorm.weight.detach().to(dtype)}
    if norms_only:
        return norms
    attn, mlp = layer.self_attn, layer.mlp
    q, k, v = (effective_weight(m, dtype) for m in (attn.q_proj, attn.k_proj, attn.v_proj))
    biases = [b for _, b in (q, k, v)]
    qkv_b = None if all(b is None for b in biases) else torch.cat(
        [b if b is not None else w.new_zeros(w.shape[0]) for (w, _), b in zip((q, k, v), biases)])
    return {
        "qkv_w": torch.cat([q[0], k[0], v[0]]), "qkv_b": qkv_b, "o_w": effective_weight(attn.o_proj, dtype)[0],
        "gate_up_w": torch.cat([effective_weight(mlp.gate_proj, dtype)[0], effective_weight(mlp.up_proj, dtype)[0]]),
        "down_w": effective_weight(mlp.down_proj, dtype)[0], **norms,
    }


def rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotary embedding as `transformers`' `apply_rotary_pos_emb` (rotate_half convention)."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin
