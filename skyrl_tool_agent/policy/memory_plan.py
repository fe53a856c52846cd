"""How many episodes `engine.RolloutEngine` holds at once: its slot KV cache sized from memory.

One slot holds one episode from its first turn to its end: `capacity` positions of keys and values
in every layer plus the token history. Allocating a slot per episode in flight whatever the device
has (the gpu profile's 256 episodes x 6,144 tokens of a 7B shape is ~84 GiB of cache) fails late,
with an out-of-memory error; instead the engine plans its slots before it allocates them, the way
serving engines size their cache (vLLM's `gpu_memory_utilization`):

    budget = memory x fraction - reserved
    slots  = min(episodes in flight, budget // bytes per slot - 2)     (a scratch slot pads batches, a root slot holds the shared prefix)

- CUDA: memory = the device's total; reserved = what is in use when the engine is built (this
  process's tensors: the weights, the reference, the engine's weight snapshot; and other processes
  on the device), the engine's own working set (a prefill chunk's activations, the logits), and the
  update's peak beside them (`update_bytes`: the engine is built once per run and its cache stays
  through every update, so the two must fit together).
- CPU: memory = the RAM available now (psutil; what this process holds is already outside it);
  reserved = the working set and the update.

`update_bytes` is the accounting of one update, by part (a formula, not a measurement, for any
Qwen2 shape: `ModelDims`): weights (bf16 = 2 bytes a parameter; NF4 with double quantisation ~0.52
for the decoder's linear layers, the rest fp32 after peft's k-bit preparation; ZeRO-3 shards them
over N ranks); trainable state with AdamW (LoRA adapters in fp32: 4 weight + 4 grad + 8 moments;
full ZeRO-3: 2 bf16 grad + 12 fp32 master and moments, over N); the KL reference (LoRA: the same
weights, adapters off; full: a sharded bf16 copy); activations of a micro-batch of T tokens kept
for backward (~(7h + 3 kv + 4 I) values a token a layer; with checkpointing one h a token a layer
plus one layer's worth); the output head's chunk (log-probs are taken ~1,700 tokens at a time,
never the [T, V] logits); ZeRO-3's gathered layers. `snapshot_bytes` is the engine's weight copy.

Episodes beyond the slots wait in the engine for a slot an ended episode frees. `fraction` is
`model.engine_memory_fraction`. `plan_slots` is the arithmetic (pure); `device_memory` reads the
device.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from skyrl_tool_agent.config import UserInputError

GIB = 2**30
MIB = 2**20
#: Tokens the output head scores at once in the update (`logprobs.fused_chunk_tokens`' scale).
HEAD_CHUNK_TOKENS = 1700


@dataclass(frozen=True)
class ModelDims:
    """A Qwen2's sizes, for memory accounting (exact parameter counts from its config)."""

    params: int
    linear_params: int  # in the decoder layers (what NF4 quantises and LoRA adapts)
    embedding_params: int  # embed_tokens (+ lm_head when untied)
    lora_params: int
    hidden: int
    kv_dim: int
    intermediate: int
    layers: int
    vocab: int
    heads: int

    @classmethod
    def from_config(cls, config: object, lora_r: int = 16) -> ModelDims:
        """From a `Qwen2Config` (or anything with its fields), LoRA of rank `lora_r` on every projection."""
        h, inner, layers, vocab = (config.hidden_size, config.intermediate_size,  # type: ignore[attr-defined]
                                   config.num_hidden_layers, config.vocab_size)  # type: ignore[attr-defined]
        kv = config.num_key_value_heads * (getattr(config, "head_dim", None) or h // config.num_attention_heads)  # type: ignore[attr-defined]
        shapes = [(h, h), (h, kv), (h, kv), (h, h), (h, inner), (h, inner), (inner, h)]  # q k v o gate up down
        linear = layers * sum(i * o for i, o in shapes)
        embedding = vocab * h * (1 if getattr(config, "tie_word_embeddings", False) else 2)
        params = linear + layers * (h + 2 * kv + 2 * h) + h + embedding  # + q/k/v biases, two norms a layer, final norm
        return cls(params, linear, embedding, layers * lora_r * sum(i + o for i, o in shapes), h, kv, inner, layers,
                   vocab, config.num_attention_heads)  # type: ignore[attr-defined]

    def kv_bytes_per_token(self, dtype_bytes: int = 2) -> int:
        """Bytes an engine slot holds per position: keys and values of every layer, the id and its log-prob."""
        return 2 * self.layers * self.kv_dim * dtype_bytes + 8 + 4

    def working_set_bytes(self, *, rows: int, capacity: int, prefill_tokens: int, dtype_bytes: int = 2) -> int:
        """An estimate of the engine's largest transient memory beside its cache: a prefill chunk's
        activations (residual stream, fused projections, MLP), its attention scores (float32) and
        masks, the keys/values of one layer gathered for up to `rows` rows, and the logits of `rows` rows."""
        q_dim = self.hidden  # heads x head_dim
        activations = prefill_tokens * dtype_bytes * (7 * self.hidden + q_dim + 2 * self.kv_dim + 3 * self.intermediate)
        scores = prefill_tokens * self.heads * capacity * (4 + 1)
        gathered = min(rows, prefill_tokens) * capacity * 2 * self.kv_dim * dtype_bytes
        return activations + scores + gathered + rows * self.vocab * 4 * 2


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


def snapshot_bytes(s: ModelDims, *, mode: str, four_bit: bool = False, dtype_bytes: int = 2) -> int:
    """The engine's weight copy beside the model's own: LoRA folds adapters into every projection
    (a copy of the linear weights); QLoRA dequantizes them (and the fp32 embedding to bf16); full
    mode gathers the whole model from its shards."""
    if mode == "full":
        return dtype_bytes * s.params
    return dtype_bytes * (s.linear_params + (s.embedding_params if four_bit else 0))


@dataclass(frozen=True)
class DeviceMemory:
    """What a budget is drawn from: `total` bytes the fraction applies to, `in_use` of them taken."""

    total: int
    in_use: int
    where: str  # "of cuda:0" or "of available RAM"


@dataclass(frozen=True)
class SlotPlan:
    """The engine's slots and why: `slots` of the `demand`ed, each `bytes_per_slot`, out of
    `budget_bytes` (what was left after `reserved_bytes`)."""

    slots: int
    demand: int
    bytes_per_slot: int
    budget_bytes: int
    reserved_bytes: int
    explanation: str  # how the budget was reached, for the log

    def describe(self) -> str:
        """One log line: how many slots, of how many wanted, and why."""
        limit = "all wanted" if self.slots == self.demand else "the budget's limit; the other episodes wait for a slot"
        return (f"rollout engine: {self.slots} of {self.demand} slots ({limit}); "
                f"{format_bytes(self.bytes_per_slot)} per slot, budget {format_bytes(self.budget_bytes)} = {self.explanation}")


def plan_slots(*, demand: int, capacity: int, bytes_per_token: int, memory_bytes: int, fraction: float,
               reserved_bytes: int, explanation: str = "") -> SlotPlan:
    """Slots for `demand` episodes of `capacity` positions at `bytes_per_token` each (keys and
    values of every layer plus the token history), within `memory_bytes x fraction - reserved_bytes`
    (module docstring). Raises `UserInputError` when not even one slot fits."""
    if demand < 1 or capacity < 1 or bytes_per_token < 1:
        raise ValueError(f"demand, capacity and bytes_per_token must be >= 1 (got {demand}, {capacity}, {bytes_per_token})")
    if not 0 < fraction <= 1:
        raise ValueError(f"fraction must be in (0, 1], got {fraction}")
    bytes_per_slot = capacity * bytes_per_token
    budget = int(memory_bytes * fraction) - reserved_bytes
    fits = budget // bytes_per_slot - 2  # the engine allocates a scratch slot and the root slot beside them
    why = explanation or f"{fraction:g} x {format_bytes(memory_bytes)} - {format_bytes(reserved_bytes)} reserved"
    if fits < 1:
        raise UserInputError(
            f"the rollout engine cannot hold one episode: a slot of {capacity} positions needs {format_bytes(bytes_per_slot)} "
            f"(3 slots with the scratch and root ones), the budget is {format_bytes(max(budget, 0))} = {why}; raise "
            f"model.engine_memory_fraction, lower grpo.max_total_tokens or free memory")
    return SlotPlan(min(demand, fits), demand, bytes_per_slot, budget, reserved_bytes, why)


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


def device_memory(device: torch.device) -> DeviceMemory:
    """The memory a budget on `device` is drawn from (module docstring)."""
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        # The caching allocator's free blocks count as free: the cache reuses them.
        others = total - free - torch.cuda.memory_reserved(device)
        return DeviceMemory(total, others + torch.cuda.memory_allocated(device), f"of {device}")
    import psutil

    return DeviceMemory(psutil.virtual_memory().available, 0, "of available RAM")


def format_bytes(n: int) -> str:
    """`n` bytes in GiB, MiB or KiB (the largest unit it fills)."""
    for unit, size in (("GiB", GIB), ("MiB", MIB)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n / 1024:.1f} KiB"
