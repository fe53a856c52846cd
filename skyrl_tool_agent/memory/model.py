"""The memory model: every quantity a training run holds on one device, each written once.

Bytes, for a `Setup` (a model's shape and how it is trained), from the code that allocates them:

- **weights**: bf16 = 2 a parameter; NF4 = `NF4_BYTES` per decoder projection weight, the rest in
  the model's dtype (peft's k-bit preparation upcasts them to fp32; a bf16 model's are put back,
  `policy.loading`, so only an fp16 QLoRA keeps them fp32: `kbit_upcast`); full mode is ZeRO-3
  sharded over the world.
- **gradients and optimizer state** with AdamW: LoRA adapters in fp32 (4 grad; 4 weight + 8
  moments); full mode a bf16 gradient and fp32 master weights + moments (2; 4 + 8), sharded.
- **reference** for the KL term: LoRA disables its adapters on the same weights (free); full mode
  keeps a sharded copy. ZeRO-3 also gathers about two layers and the embedding at a time.
- **update activations** and **the backward's transient** (the head's chunk or a layer's
  backward, whichever is larger; never the [T, vocab] logits): their functions below.
- **sampling snapshot** (`policy.weights.SamplingWeights`): LoRA folded = a copy of the projections;
  sampled through the model's modules = none (the adapters run beside the base weights, the
  embedding and head are read in their own dtype); a folded fp16 QLoRA copy also holds its fp32
  embedding and head in the sampling dtype; full mode gathers the whole model on
  every rank (a single unsharded process: only its concatenated projections).
- **KV cache** and **engine working sets** (a prefill chunk, a decode step): their functions below.
"""

from __future__ import annotations

from dataclasses import dataclass

from skyrl_tool_agent.kernels.logprobs import fused_chunk_tokens
from skyrl_tool_agent.memory.shape import ModelShape

#: Bytes an NF4 weight takes with double quantisation (4 bits + ~1/64 byte of scales per value).
NF4_BYTES = 0.516
#: Bytes of the token history per cache position: the id (int64) and its sampling log-prob (fp32).
HISTORY_BYTES = 8 + 4


@dataclass(frozen=True)
class Setup:
    """What is trained, and how: the inputs of every figure below."""

    shape: ModelShape
    mode: str = "lora"  # "lora" or "full"
    four_bit: bool = False  # QLoRA: NF4 projections
    world: int = 1  # ranks; full mode shards its weights and state over them (ZeRO-3)
    lora_r: int = 16
    kl: bool = True
    checkpointing: bool = True
    dtype_bytes: int = 2  # the weights' and the cache's dtype (2 = bf16; 4 = fp32 on a CPU)
    zero3: bool = True  # full mode's weights ZeRO-3 partitioned (any launched run); False: one plain process
    kbit_upcast: bool = False  # an fp16 QLoRA: what is not 4-bit is float32 (peft's k-bit preparation)

    @property
    def shards(self) -> int:
        return self.world if self.mode == "full" else 1


def weights_bytes(s: Setup) -> float:
    if s.four_bit:
        return NF4_BYTES * s.shape.linear_params + _rest_bytes(s) * (s.shape.params - s.shape.linear_params)
    return s.dtype_bytes * s.shape.params / s.shards


def gradient_bytes(s: Setup) -> float:
    """The trainable parameters' gradients: LoRA's fp32 adapters', or full mode's (weights' dtype, sharded)."""
    if s.mode == "full":
        return s.dtype_bytes * s.shape.params / s.shards
    return 4 * s.shape.lora_params(s.lora_r)


def optimizer_state_bytes(s: Setup) -> float:
    """AdamW's state: LoRA's fp32 adapters and their two moments; full mode's fp32 master weights
    (beside bf16 ones) and moments, sharded."""
    if s.mode == "full":
        master = 4 if s.dtype_bytes < 4 else 0
        return (master + 8) * s.shape.params / s.shards
    return 12 * s.shape.lora_params(s.lora_r)


def reference_bytes(s: Setup) -> float:
    return s.dtype_bytes * s.shape.params / s.shards if s.mode == "full" and s.kl else 0.0


def zero3_gathered_bytes(s: Setup) -> float:
    """ZeRO-3's gathered working set: about two layers and the embedding at once."""
    if s.mode != "full" or s.world < 2:
        return 0.0
    sh = s.shape
    layer = (sh.params - sh.embedding_params) / sh.layers
    return s.dtype_bytes * (2 * layer + sh.vocab * sh.hidden)


def activation_bytes(s: Setup, tokens: int) -> float:
    """Activations a micro-batch of `tokens` keeps through its forward: with gradient checkpointing,
    each layer's input; without, every layer's own (~7h + 3kv + 4I values a token), in the
    residual stream's dtype (fp32 in an upcast QLoRA)."""
    sh = s.shape
    kept = sh.layers * sh.hidden if s.checkpointing else sh.layers * _layer_values(sh)
    return _rest_bytes(s) * tokens * kept


def _rest_bytes(s: Setup) -> int:
    """Bytes of a parameter that is not 4-bit (the embedding, the head, the norms): float32 where
    k-bit preparation's upcast is kept (`kbit_upcast`), else the model's dtype."""
    return 4 if s.four_bit and s.kbit_upcast else s.dtype_bytes


def _layer_values(sh: ModelShape) -> int:
    return 7 * sh.hidden + 3 * sh.kv_dim + 4 * sh.intermediate


def backward_layer_bytes(s: Setup, tokens: int) -> float:
    """What a layer's backward adds: its recomputed activations (with checkpointing) and the
    gradients of its widest tensors (the MLP's gate and up, the residual)."""
    sh = s.shape
    recomputed = _layer_values(sh) if s.checkpointing else 0
    return _rest_bytes(s) * tokens * (recomputed + 2 * sh.intermediate + sh.hidden)


def head_bytes(s: Setup, tokens: int) -> float:
    """The output head's chunk in the update (`head_token_stats`' backward): a chunk of tokens' fp32
    log-probs and probabilities (4 + 4), their gradient cast to the hidden states' dtype (none for
    float32 ones), and in full mode, where the head trains, that gradient again in fp32 for the
    weight's."""
    cast = 0 if _rest_bytes(s) == 4 else s.dtype_bytes
    weight_grad = 4 if s.mode == "full" else 0
    return (8 + cast + weight_grad) * min(tokens, fused_chunk_tokens(s.shape.vocab)) * s.shape.vocab


def update_bytes(s: Setup, tokens: int) -> dict[str, float]:
    """One update of a micro-batch of `tokens` tokens on one device, by part, and their total. The
    backward's transient is the larger of the head's chunk (first) and a layer's backward (after)."""
    parts = {"weights": weights_bytes(s), "reference": reference_bytes(s), "optimizer_state": optimizer_state_bytes(s),
             "gradients": gradient_bytes(s), "zero3_gathered": zero3_gathered_bytes(s),
             "activations": activation_bytes(s, tokens),
             "backward": max(head_bytes(s, tokens), backward_layer_bytes(s, tokens))}
    parts["total"] = sum(parts.values())
    return parts


def update_pass_bytes(s: Setup, tokens: int) -> float:
    """What one micro-batch's forward and backward allocate at their peak: the activations kept, the
    backward's transient and the gradients."""
    parts = update_bytes(s, tokens)
    return parts["activations"] + parts["backward"] + parts["gradients"]


def update_reserve_bytes(s: Setup, tokens: int) -> float:
    """What an update allocates beyond what is resident when the rollout engine is planned (the
    weights and the reference are): the engine's cache must leave this free."""
    parts = update_bytes(s, tokens)
    return parts["total"] - parts["weights"] - parts["reference"]


def snapshot_bytes(s: Setup, *, through_modules: bool = False) -> float:
    """The rollout engine's weight copy beside the model's own (module docstring)."""
    sh = s.shape
    if s.mode == "full" and s.zero3:
        return s.dtype_bytes * sh.params  # gathered from the shards
    if s.mode == "full":  # the parameters themselves, but q/k/v and gate/up concatenated
        return s.dtype_bytes * sh.layers * sh.hidden * (sh.q_dim + 2 * sh.kv_dim + 2 * sh.intermediate)
    if through_modules:
        return 0.0  # the projections through their modules; the embedding and head read as they are
    # An upcast QLoRA's embedding and head are fp32: a copy of both in the sampling dtype.
    embedding = s.dtype_bytes * 2 * sh.vocab * sh.hidden if _rest_bytes(s) != s.dtype_bytes else 0.0
    return embedding + s.dtype_bytes * sh.linear_params


def kv_bytes_per_token(s: Setup) -> int:
    """One cache position of one slot: keys and values of every layer, and the token history."""
    return 2 * s.shape.layers * s.shape.kv_dim * s.dtype_bytes + HISTORY_BYTES


def cache_bytes(s: Setup, *, slots: int, capacity: int) -> int:
    """The engine's cache: `slots` slots plus its scratch and root slots, `capacity` positions each
    (and one more position of token history, for the token drawn at the last)."""
    return (slots + 2) * (capacity * kv_bytes_per_token(s) + HISTORY_BYTES)


def prefill_working_bytes(s: Setup, *, chunk_tokens: int, capacity: int) -> float:
    """The largest transient of a prefill of `chunk_tokens` (padded) tokens against up to `capacity`
    positions: one layer's activations (the residual stream and its norm's float32 copy, q/k/v,
    the gated MLP's three [tokens, intermediate] tensors) and its attention scores."""
    sh = s.shape
    per_token = s.dtype_bytes * (2 * sh.hidden + sh.q_dim + 2 * sh.kv_dim + 3 * sh.intermediate) + 4 * sh.hidden
    activations = chunk_tokens * per_token
    return activations + chunk_tokens * sh.heads * capacity * score_bytes(s)


def score_bytes(s: Setup) -> float:
    """Bytes per attention score alive at a prefill's peak (`prefill_attention`): only the visibility
    mask, per query group: two bool masks and torch's additive one in the weights' dtype
    (measured on CPU)."""
    return (2 + s.dtype_bytes) / s.shape.kv_heads


def decode_working_bytes(s: Setup, *, rows: int, capacity: int) -> float:
    """A decode step's transient: one layer's keys/values gathered for `rows` rows (the torch
    attention's copies) and the rows' fp32 logits and probabilities."""
    sh = s.shape
    return rows * capacity * 2 * sh.kv_dim * s.dtype_bytes + rows * sh.vocab * 4 * 2


def engine_working_bytes(s: Setup, *, rows: int, capacity: int, chunk_tokens: int) -> float:
    return max(prefill_working_bytes(s, chunk_tokens=chunk_tokens, capacity=capacity),
               decode_working_bytes(s, rows=rows, capacity=capacity))
