"""Memory of one GRPO update, by part, for any Qwen2 shape: a formula, not a measurement.

The rollout engine keeps its KV cache through every update, so its plan (`policy.memory_plan`)
leaves room for the update's peak: the trainer estimates it here (`update_reserve_bytes`) and hands
it to the policy. The accounting, in bytes: weights (bf16 = 2 a parameter; NF4 with double
quantisation ~0.52 for the decoder's linear layers, the rest fp32 after peft's k-bit preparation;
ZeRO-3 shards them over N ranks); trainable state with AdamW (LoRA adapters in fp32: 4 weight + 4
grad + 8 moments; full ZeRO-3: 2 bf16 grad + 12 fp32 master and moments, over N); the KL reference
(LoRA: the same weights, adapters off; full: a sharded bf16 copy); activations of a micro-batch of T
tokens kept for backward (~(7h + 3 kv + 4 I) values a token a layer; with checkpointing one h a
token a layer plus one layer's worth); the output head's chunk (log-probs are taken ~1,700 tokens at
a time, never the [T, V] logits); ZeRO-3's gathered layers.
"""

from __future__ import annotations

from skyrl_tool_agent.policy.memory_plan import ModelDims, SlotPlan, format_bytes, plan_slots, snapshot_bytes

#: Tokens the output head scores at once in the update (`kernels.logprobs.fused_chunk_tokens`' scale).
HEAD_CHUNK_TOKENS = 1700


def update_bytes(s: ModelDims, *, mode: str, tokens: int, gpus: int = 1, kl: bool = True, four_bit: bool = False,
                 checkpointing: bool = True, dtype_bytes: int = 2) -> dict[str, float]:
    """Bytes per device for one update on a micro-batch of `tokens` tokens, by part (module doc).
    `dtype_bytes`: 2 = bf16 weights and activations, 4 = fp32. QLoRA: peft's k-bit preparation
    upcasts every parameter that is not 4-bit to fp32, so embeddings, norms and activations are fp32."""
    n = gpus if mode == "full" else 1
    act_bytes = 4 if four_bit else dtype_bytes
    if four_bit:
        weights = 0.516 * s.linear_params + 4 * (s.params - s.linear_params)
    else:
        weights = dtype_bytes * s.params / n
    if mode == "full":
        trainable = (dtype_bytes + (4 if dtype_bytes < 4 else 0) + 8) * s.params / n
        reference = dtype_bytes * s.params / n if kl else 0.0
        layer_params = (s.params - s.embedding_params) / s.layers
        working = dtype_bytes * (2 * layer_params + s.vocab * s.hidden) if n > 1 else 0.0
    else:
        trainable, reference, working = 16 * s.lora_params, 0.0, 0.0
    per_token_layer = 7 * s.hidden + 3 * s.kv_dim + 4 * s.intermediate
    layers_kept = s.layers * s.hidden + per_token_layer if checkpointing else s.layers * per_token_layer
    parts = {"weights": weights, "trainable_state": trainable, "reference": reference, "zero3_working": working,
             "activations": act_bytes * tokens * layers_kept,
             "head_chunk": 2 * 4 * min(tokens, HEAD_CHUNK_TOKENS) * s.vocab}
    parts["total"] = sum(parts.values())
    return parts


def update_reserve_bytes(dims: ModelDims, *, mode: str, tokens: int, gpus: int, kl: bool, four_bit: bool,
                         checkpointing: bool, dtype_bytes: int) -> int:
    """What the engine leaves free for the update: the parts of `update_bytes` not yet allocated
    when the engine is built (all but the weights and the reference: optimizer state, gradients,
    activations, the head's chunk)."""
    parts = update_bytes(dims, mode=mode, tokens=tokens, gpus=gpus, kl=kl, four_bit=four_bit,
                         checkpointing=checkpointing, dtype_bytes=dtype_bytes)
    return int(parts["total"] - parts["weights"] - parts["reference"])


#: The memory table's modes: (label, mode, four-bit weights).
MODES = (("LoRA", "lora", False), ("QLoRA", "lora", True), ("full ZeRO-3", "full", False))


def slots_beside_update(s: ModelDims, *, mode: str, four_bit: bool, device_bytes: int, gpus: int, episodes: int,
                        capacity: int, micro_batch_tokens: int, fraction: float, prefill_tokens: int = 16384,
                        kl: bool = True) -> SlotPlan:
    """The engine's slots on one of `gpus` devices of `device_bytes` each, for its share of
    `episodes`, beside one update of `micro_batch_tokens` tokens (checkpointed) and the engine's
    snapshot: what `RolloutEngine` plans at run time, with the update's parts estimated
    (`update_bytes`) instead of read from the device."""
    update = update_bytes(s, mode=mode, tokens=micro_batch_tokens, gpus=gpus, kl=kl, four_bit=four_bit)["total"]
    snapshot = snapshot_bytes(s, mode=mode, four_bit=four_bit)
    if four_bit and snapshot > (device_bytes * fraction - update) / 2:
        snapshot = 0  # as `QwenPolicy.sampling_weights` decides: sampled through the 4-bit matmul, no copy
    demand = max(1, episodes // gpus)
    working = s.working_set_bytes(rows=demand, capacity=capacity, prefill_tokens=prefill_tokens)
    return plan_slots(demand=demand, capacity=capacity, bytes_per_token=s.kv_bytes_per_token(), memory_bytes=device_bytes,
                      fraction=fraction, reserved_bytes=int(update + snapshot + working),
                      explanation=f"update {format_bytes(int(update))} + snapshot {format_bytes(snapshot) if snapshot else 'none (4-bit matmul)'} "
                                  f"+ working set {format_bytes(working)}")
