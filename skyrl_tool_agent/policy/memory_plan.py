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
  update's peak beside them (the engine is built once per run and its cache stays through every
  update, so the two must fit together).
- CPU: memory = the RAM available now (psutil; what this process holds is already outside it);
  reserved = the working set and the update.

The update's peak is estimated by the trainer (`grpo.memory.update_bytes`) and handed to the
engine as `reserved`; `ModelDims` (a Qwen2's sizes from its config), `snapshot_bytes` (the engine's
weight copy) and the slot arithmetic are here.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from skyrl_tool_agent.config import UserInputError

GIB = 2**30
MIB = 2**20


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
