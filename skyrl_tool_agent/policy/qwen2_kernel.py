"""A sampling-only Qwen2 forward: LoRA merged into the weights, fused projections, per-row KV cache.

`model.generate` and the HF forward pay, per layer and per decode step, for things a sampler does
not need: peft's LoRA path runs two extra small matmuls per projection (and its bookkeeping), q/k/v
and gate/up are separate matmuls, and the attention mask and cache classes are rebuilt at every
step. For a 3.5M-parameter model on a 2-core CPU that overhead, not the matmuls, is most of a
rollout. `Qwen2Kernel` snapshots the weights once per optimizer step (LoRA deltas folded in, q/k/v
and gate/up concatenated) and runs the same arithmetic as `Qwen2ForCausalLM` in eval mode:
RMSNorm in float32, the model's own rotary embedding, GQA attention (softmax scale head_dim^-0.5),
SiLU-gated MLP, tied or untied LM head. Gradients never flow through it: training uses the model.

The cache is `[rows, kv_heads, capacity, head_dim]` per layer; each row holds its own tokens at
positions 0..length-1 (rows of different lengths share one tensor, the tail is unused), so a row's
cache can be copied to another row or kept for the episode's next turn.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

# Modules peft may wrap that this kernel folds into its fused weights.
_LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass
class _Layer:
    qkv_w: Tensor
    qkv_b: Tensor | None
    o_w: Tensor
    gate_up_w: Tensor
    down_w: Tensor
    norm1: Tensor
    norm2: Tensor


@dataclass
class KVCache:
    """Per-layer keys and values of each row, `[rows, kv_heads, capacity, head_dim]`, after an
    optional `root` every row shares: per-layer `[kv_heads, root_len, head_dim]` keys and values of
    positions 0..root_len-1, stored once (row position p is at index p - root_len)."""

    keys: list[Tensor]
    values: list[Tensor]
    root_keys: list[Tensor] | None = None
    root_values: list[Tensor] | None = None

    @property
    def rows(self) -> int:
        return self.keys[0].shape[0]

    @property
    def root_len(self) -> int:
        return 0 if self.root_keys is None else self.root_keys[0].shape[1]

    def select(self, rows: Tensor) -> KVCache:
        """A new cache holding `rows` of this one (in that order), on the same root."""
        return KVCache([k.index_select(0, rows) for k in self.keys], [v.index_select(0, rows) for v in self.values],
                       self.root_keys, self.root_values)


def _base_model(model: torch.nn.Module) -> torch.nn.Module:
    """The `Qwen2ForCausalLM` under a peft wrapper (or the model itself)."""
    get_base = getattr(model, "get_base_model", None)
    return get_base() if callable(get_base) else model


def unsupported_reason(model: torch.nn.Module) -> str | None:
    """Why `Qwen2Kernel` cannot sample for `model` (None: it can). The caller falls back to the HF path."""
    base = _base_model(model)
    config = getattr(base, "config", None)
    if getattr(config, "model_type", None) != "qwen2":
        return f"model_type {getattr(config, 'model_type', None)!r} is not qwen2"
    if getattr(config, "use_sliding_window", False):
        return "sliding-window attention"
    for name, module in base.named_modules():
        if getattr(getattr(module, "weight", None), "quant_state", None) is not None:
            return f"quantized weight in {name}"
        if hasattr(module, "lora_A") and name.rsplit(".", 1)[-1] not in _LINEARS:
            return f"adapter on {name} (only the attention and MLP projections are folded)"
        if any(getattr(module, "use_dora", {}).values()):
            return f"DoRA adapter on {name}"
        if any(getattr(module, "lora_bias", {}).values()):
            return f"LoRA bias on {name}"
    return None


def weights_version(model: torch.nn.Module) -> tuple[int, ...]:
    """Changes whenever any parameter is written in place (optimizer steps, checkpoint loads):
    the snapshot is rebuilt then and only then."""
    return tuple(p._version for p in model.parameters())


def effective_weight(module: torch.nn.Module) -> tuple[Tensor, Tensor | None]:
    """(weight, bias) of a linear layer as its forward applies them: the active LoRA adapters'
    deltas added when `module` is a peft LoRA layer whose adapters are enabled and not merged."""
    base = getattr(module, "base_layer", module)
    weight, bias = base.weight.detach(), None if base.bias is None else base.bias.detach()
    if hasattr(module, "lora_A") and not getattr(module, "merged", False) and not getattr(module, "disable_adapters", False):
        for adapter in module.active_adapters:
            if adapter in module.lora_A:
                weight = weight + module.get_delta_weight(adapter).detach().to(weight.dtype)
    return weight, bias


class Qwen2Kernel:
    """The weights of a Qwen2 model as of `weights_version(model)`, and its forward over a `KVCache`."""

    def __init__(self, model: torch.nn.Module) -> None:
        reason = unsupported_reason(model)
        if reason is not None:
            raise ValueError(f"Qwen2Kernel cannot run this model: {reason}")
        base = _base_model(model)
        self.version = weights_version(model)
        cfg = base.config
        self.heads = cfg.num_attention_heads
        self.kv_heads = cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // self.heads
        self.layers_n = cfg.num_hidden_layers
        inner = base.model
        self.rotary = inner.rotary_emb
        self.eps = inner.norm.variance_epsilon
        self.embed = inner.embed_tokens.weight.detach()
        self.final_norm = inner.norm.weight.detach()
        self.lm_head = effective_weight(base.lm_head)[0]
        with torch.no_grad():
            self.layers = [self._fuse(layer) for layer in inner.layers]
        self.dtype = self.embed.dtype
        self.device = self.embed.device

    def tensors(self) -> list[Tensor]:
        """Every weight tensor of the snapshot, in a fixed order."""
        out = [self.embed, self.final_norm, self.lm_head]
        for layer in self.layers:
            out += [t for t in vars(layer).values() if t is not None]
        return out

    @torch.no_grad()
    def refresh_(self, model: torch.nn.Module) -> None:
        """Bring the snapshot to the current weights of `model` by writing into the same tensors
        (a CUDA graph captured over them stays valid). Tensors that are views of the model's own
        parameters (no adapter on them) are current already."""
        fresh = Qwen2Kernel(model)
        for mine, theirs in zip(self.tensors(), fresh.tensors(), strict=True):
            if mine.data_ptr() != theirs.data_ptr():
                mine.copy_(theirs)
        self.version = fresh.version

    @staticmethod
    def _fuse(layer: torch.nn.Module) -> _Layer:
        attn, mlp = layer.self_attn, layer.mlp
        q, k, v = (effective_weight(m) for m in (attn.q_proj, attn.k_proj, attn.v_proj))
        biases = [b for _, b in (q, k, v)]
        qkv_b = None if all(b is None for b in biases) else torch.cat(
            [b if b is not None else torch.zeros(w.shape[0], dtype=w.dtype, device=w.device) for (w, _), b in zip((q, k, v), biases)])
        return _Layer(
            qkv_w=torch.cat([q[0], k[0], v[0]]), qkv_b=qkv_b, o_w=effective_weight(attn.o_proj)[0],
            gate_up_w=torch.cat([effective_weight(mlp.gate_proj)[0], effective_weight(mlp.up_proj)[0]]),
            down_w=effective_weight(mlp.down_proj)[0],
            norm1=layer.input_layernorm.weight.detach(), norm2=layer.post_attention_layernorm.weight.detach(),
        )

    def new_cache(self, rows: int, capacity: int, root: KVCache | None = None) -> KVCache:
        """`capacity` positions per row after the first row of `root` (shared, not copied), if given.

        Zeroed: masked-out positions still enter the attention matmuls, and uninitialised memory
        may hold NaN, which a mask does not cancel (NaN * 0 = NaN)."""
        shape = (rows, self.kv_heads, capacity, self.head_dim)
        cache = KVCache([torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in range(self.layers_n)],
                        [torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in range(self.layers_n)])
        if root is not None:
            assert root.root_keys is None, "a root is one cache row without a root of its own"
            cache.root_keys = [k[0] for k in root.keys]
            cache.root_values = [v[0] for v in root.values]
        return cache

    def _norm(self, x: Tensor, weight: Tensor) -> Tensor:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return weight * h.to(x.dtype)

    @torch.no_grad()
    def forward(self, cache: KVCache, ids: Tensor, starts: Tensor, last: Tensor | None = None) -> Tensor:
        """Run `ids` [B, S] as the tokens at positions `starts[b] + j` of cache row b, writing their
        keys/values there; returns the logits [B, V] at column `last[b]` (default: the last column).

        Query j of row b attends to the root and the row's positions up to starts[b]+j, so padding
        columns after a row's own tokens only write to positions beyond them, which later tokens
        overwrite.
        """
        batch, width = ids.shape
        root = cache.root_len
        positions = starts.unsqueeze(1) + torch.arange(width, device=ids.device)  # [B, S], absolute
        slots = positions - root  # indices into the rows' own part
        used = int(slots.max()) + 1  # attend only to the used part of the cache
        x = F.embedding(ids, self.embed)
        cos, sin = self.rotary(x, positions)
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)  # [B, 1, S, d]
        groups = self.heads // self.kv_heads
        # Queries of the `groups` heads sharing a KV head are stacked along the query axis (one
        # matmul per KV head, no repeated keys); each stacked row keeps its column's causal mask.
        hidden = torch.arange(used, device=ids.device) > slots.unsqueeze(-1)  # [B, S, T]
        hidden = hidden.unsqueeze(1).repeat(1, 1, groups, 1) if groups > 1 else hidden.unsqueeze(1)
        hidden = hidden.view(batch, 1, groups * width, used)
        rows = torch.arange(batch, device=ids.device).unsqueeze(1).expand(batch, width)
        q_size, kv_size = self.heads * self.head_dim, self.kv_heads * self.head_dim
        for i, (layer, k_cache, v_cache) in enumerate(zip(self.layers, cache.keys, cache.values)):
            h = self._norm(x, layer.norm1)
            qkv = F.linear(h, layer.qkv_w, layer.qkv_b)
            q, k, v = qkv.split([q_size, kv_size, kv_size], dim=-1)
            q = q.view(batch, width, self.heads, self.head_dim).transpose(1, 2)
            k = k.view(batch, width, self.kv_heads, self.head_dim).transpose(1, 2)
            q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
            k_cache[rows, :, slots] = k.transpose(1, 2)
            v_cache[rows, :, slots] = v.view(batch, width, self.kv_heads, self.head_dim)
            q = q.reshape(batch, self.kv_heads, groups * width, self.head_dim) * self.head_dim ** -0.5
            own = torch.matmul(q, k_cache[:, :, :used].transpose(-1, -2)).masked_fill_(hidden, float("-inf"))
            if root:
                # The shared root is read once for all rows: one [B*G*S, d] x [d, root] matmul per
                # KV head (cascade attention), instead of a copy of it per row.
                rk, rv = cache.root_keys[i], cache.root_values[i]  # type: ignore[index]
                flat = q.transpose(0, 1).reshape(self.kv_heads, -1, self.head_dim)
                shared = torch.matmul(flat, rk.transpose(-1, -2)).view(self.kv_heads, batch, -1, root).transpose(0, 1)
                weights = torch.softmax(torch.cat([shared, own], dim=-1), dim=-1)
                to_root = weights[..., :root].transpose(0, 1).reshape(self.kv_heads, -1, root)
                attn = torch.matmul(to_root, rv).view(self.kv_heads, batch, -1, self.head_dim).transpose(0, 1)
                attn = attn + torch.matmul(weights[..., root:], v_cache[:, :, :used])
            else:
                attn = torch.matmul(torch.softmax(own, dim=-1), v_cache[:, :, :used])
            attn = attn.reshape(batch, self.heads, width, self.head_dim).transpose(1, 2).reshape(batch, width, q_size)
            x = x + F.linear(attn, layer.o_w)
            gate, up = F.linear(self._norm(x, layer.norm2), layer.gate_up_w).chunk(2, dim=-1)
            x = x + F.linear(F.silu(gate) * up, layer.down_w)
        picked = x[:, -1] if last is None else x[torch.arange(batch, device=ids.device), last]
        return F.linear(self._norm(picked, self.final_norm), self.lm_head)


def _rotate(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotary embedding as `transformers`' `apply_rotary_pos_emb` (rotate_half convention)."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


def pad_rows(rows: Sequence[Sequence[int]], pad_id: int, device: torch.device) -> tuple[Tensor, Tensor]:
    """Right-padded ids [B, max len] and each row's last column [B]."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = torch.tensor(list(r), dtype=torch.long)
    return ids.to(device), torch.tensor([len(r) - 1 for r in rows], device=device)
