"""The memory plan of a run: the rollout engine's slots and the update's micro-batch, chosen together.

The engine keeps its KV cache through every update, so one device holds all of `memory.model` at
once. `plan_run` chooses, within `fraction` of the device:

1. **episodes in flight first** (`demand`), with the smallest footprint of everything else: a GRPO
   step ends when its slowest group ends, so a slot short stretches the whole rollout;
2. then **the update's token budget**, up to `UPDATE_SATURATION_TOKENS` (and the configured budget):
   beyond it a micro-batch is no faster per token, it only holds memory;
3. then a **snapshot copy** (fused projections sample faster than the adapters beside the weights)
   and the **largest prefill chunk** (the default), where they still fit.

Where not even one slot fits, `PlanError` says which knobs and values would fit (`suggestions`).
`plan_slots` is the engine's own arithmetic at run time, from the memory it measures.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from skyrl_tool_agent.config import UserInputError
from skyrl_tool_agent.memory import model as mm
from skyrl_tool_agent.memory.device import GIB, format_bytes

#: Tokens from which a bigger micro-batch makes the update no faster per token, only bigger: a
#: micro-batch's GEMMs have `tokens` rows, and an H100's reach their throughput well below this
#: (cuBLAS at 4k+ rows). Not measured on this project's update (no GPU since 2026-11-27).
UPDATE_SATURATION_TOKENS = 16384
#: The smallest prefill chunk the plan takes (tokens): smaller ones only slow admission.
MIN_PREFILL_TOKENS = 512
#: What a CUDA process holds outside its tensors: the context, cuBLAS workspaces, NCCL buffers.
CUDA_CONTEXT_BYTES = GIB


class PlanError(UserInputError):
    """Not even one episode fits beside the update: the message names knobs that would fit."""


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
    """Slots for `demand` episodes of `capacity` positions at `bytes_per_token` each, within
    `memory_bytes x fraction - reserved_bytes`, beside the engine's scratch and root slots. Raises
    `UserInputError` when not even one slot fits."""
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
            f"(3 slots with the scratch and root ones), the budget is {format_bytes(max(budget, 0))} = {why}; lower "
            "training.micro_batch_tokens or grpo.max_total_tokens, raise model.engine_memory_fraction, or free memory")
    return SlotPlan(min(demand, fits), demand, bytes_per_slot, budget, reserved_bytes, why)


@dataclass(frozen=True)
class RunPlan:
    """What one device holds during a run, as chosen by `plan_run`."""

    setup: mm.Setup
    device_bytes: int
    fraction: float
    demand: int  # episodes in flight this rank wants
    slots: int  # episodes in flight it gets
    capacity: int  # cache positions per slot
    update_tokens: int  # the update's micro-batch budget
    prefill_tokens: int  # the engine's prefill chunk
    through_modules: bool  # sampled through the model's modules (no snapshot copy)
    parts: dict[str, float]  # bytes by part (weights, reference, snapshot, cache, engine working set, update)

    def describe(self) -> str:
        """The plan in one line (logged before the first step; `doctor` prints it)."""
        limit = ("all the step's episodes on this device" if self.slots >= self.demand
                 else "memory (the rest of the step's episodes wait for a slot)")
        p = {k: format_bytes(int(v)) for k, v in self.parts.items()}
        snapshot = "none (adapters beside the weights)" if self.through_modules and not self.parts["snapshot"] else p["snapshot"]
        return (f"memory plan: {self.slots} of {self.demand} episodes in flight (bound by {limit}), update of "
                f"{self.update_tokens:,} tokens a micro-batch, prefill chunk {self.prefill_tokens:,} tokens; of "
                f"{self.fraction:g} x {format_bytes(self.device_bytes)}: weights {p['weights']}, snapshot {snapshot}, "
                f"cache {p['cache']}, engine working set {p['engine_working']}, update {p['update']}")


def _parts(s: mm.Setup, *, slots: int, capacity: int, rows: int, update_tokens: int, prefill_tokens: int,
           through_modules: bool, overhead_bytes: int) -> dict[str, float]:
    return {"weights": mm.weights_bytes(s) + mm.reference_bytes(s) + overhead_bytes,
            "snapshot": mm.snapshot_bytes(s, through_modules=through_modules),
            "cache": mm.cache_bytes(s, slots=slots, capacity=capacity),
            "engine_working": mm.engine_working_bytes(s, rows=rows, capacity=capacity, chunk_tokens=prefill_tokens),
            "update": mm.update_reserve_bytes(s, update_tokens)}


def _slots_that_fit(s: mm.Setup, budget: float, *, capacity: int, rows: int, update_tokens: int, prefill_tokens: int,
                    through_modules: bool, overhead_bytes: int) -> int:
    rest = _parts(s, slots=0, capacity=capacity, rows=rows, update_tokens=update_tokens, prefill_tokens=prefill_tokens,
                  through_modules=through_modules, overhead_bytes=overhead_bytes)
    rest.pop("cache")
    per_slot = capacity * mm.kv_bytes_per_token(s)
    return int((budget - sum(rest.values())) // per_slot) - 2  # the scratch and root slots


def plan_run(s: mm.Setup, *, device_bytes: int, fraction: float, demand: int, max_total_tokens: int,
             update_tokens: int | None, update_cap: int | None = None, prefill_default: int = 16384,
             stop_check_interval: int = 8, overhead_bytes: int = CUDA_CONTEXT_BYTES, explain: bool = True) -> RunPlan:
    """The run's plan on one device (module docstring). `update_tokens` None: chosen (whole rows of
    `max_total_tokens`, up to `update_cap`); `demand`: episodes in flight this rank wants. Raises
    `PlanError` when not even one episode fits (`explain` False: without suggestions, for
    `suggestions`' own re-planning)."""
    capacity = max_total_tokens + stop_check_interval + 2
    budget = device_bytes * fraction
    row = max_total_tokens
    if update_tokens is not None:
        updates = [update_tokens]
    else:
        top = min(update_cap or UPDATE_SATURATION_TOKENS, max(row, UPDATE_SATURATION_TOKENS // row * row))
        updates = list(range(max(row, top // row * row), 0, -row))
    prefills = [p for p in (prefill_default // 2**k for k in range(6)) if p >= MIN_PREFILL_TOKENS] or [prefill_default]
    snapshots = [False, True] if s.mode == "lora" else [False]  # full mode samples a gathered (or plain) copy
    smallest = dict(update_tokens=updates[-1], prefill_tokens=prefills[-1], through_modules=snapshots[-1])

    def fits(**choice: object) -> int:
        return _slots_that_fit(s, budget, capacity=capacity, rows=demand, overhead_bytes=overhead_bytes,
                               **{**smallest, **choice})  # type: ignore[arg-type]

    most = fits()
    if most < 1:
        raise PlanError(_nothing_fits(s, device_bytes=device_bytes, fraction=fraction, capacity=capacity,
                                      max_total_tokens=max_total_tokens, smallest=smallest, demand=demand,
                                      update_tokens=update_tokens, prefill_default=prefill_default,
                                      stop_check_interval=stop_check_interval, overhead_bytes=overhead_bytes)
                        if explain else "nothing fits")
    slots = min(demand, most)
    choice = dict(smallest)
    choice["update_tokens"] = next(u for u in updates if fits(**{**choice, "update_tokens": u}) >= slots)
    if fits(**{**choice, "through_modules": False}) >= slots:
        choice["through_modules"] = False
    choice["prefill_tokens"] = next(p for p in prefills if fits(**{**choice, "prefill_tokens": p}) >= slots)
    parts = _parts(s, slots=slots, capacity=capacity, rows=slots, overhead_bytes=overhead_bytes, **choice)  # type: ignore[arg-type]
    return RunPlan(s, device_bytes, fraction, demand, slots, capacity, parts=parts, **choice)  # type: ignore[arg-type]


def _nothing_fits(s: mm.Setup, *, device_bytes: int, fraction: float, capacity: int, max_total_tokens: int,
                  smallest: dict[str, object], demand: int, update_tokens: int | None, **rest: object) -> str:
    need = _parts(s, slots=1, capacity=capacity, rows=1, overhead_bytes=rest["overhead_bytes"], **smallest)  # type: ignore[arg-type]
    parts = ", ".join(f"{k.replace('_', ' ')} {format_bytes(int(v))}" for k, v in need.items() if v)
    mode = "full" if s.mode == "full" else ("QLoRA" if s.four_bit else "LoRA")
    return (f"nothing fits {fraction:g} x {format_bytes(device_bytes)} per device for {mode} training of a "
            f"{s.shape.params / 1e9:.1f}B model ({s.shape.source or 'its config'}): one episode of {max_total_tokens:,} "
            f"tokens beside the smallest update needs {parts}; would fit: "
            + ("; ".join(suggestions(s, device_bytes=device_bytes, fraction=fraction, demand=demand,
                                     max_total_tokens=max_total_tokens, update_tokens=update_tokens, **rest))
               or "nothing this project can change on this device (use a larger one)"))


def suggestions(s: mm.Setup, *, device_bytes: int, fraction: float, demand: int, max_total_tokens: int,
                update_tokens: int | None, **rest: object) -> list[str]:
    """Knob values that would make `plan_run` fit, each alone (for an error line)."""
    def ok(setup: mm.Setup = s, **changes: object) -> bool:
        args = dict(device_bytes=device_bytes, fraction=fraction, demand=demand, max_total_tokens=max_total_tokens,
                    update_tokens=update_tokens, **rest)
        args.update(changes)
        try:
            plan_run(setup, **args, explain=False)  # type: ignore[arg-type]
        except PlanError:
            return False
        return True

    found = []
    if update_tokens is not None and update_tokens > max_total_tokens and ok(update_tokens=max_total_tokens):
        found.append(f"training.micro_batch_tokens={max_total_tokens}")
    shorter = max_total_tokens // 2
    while shorter >= 512 and not ok(max_total_tokens=shorter, update_tokens=None if update_tokens is None else shorter):
        shorter //= 2
    if shorter >= 512:
        found.append(f"grpo.max_total_tokens={shorter}")
    if s.mode == "lora" and not s.four_bit and ok(replace(s, four_bit=True)):
        found.append("model.quantization.load_in_4bit=true")
    if s.mode == "full":
        world = next((w for w in (2, 4, 8, 16, 32, 64) if w > s.world and ok(replace(s, world=w))), None)
        if world:
            found.append(f"{world} GPUs (ZeRO-3 shards the weights and optimizer state)")
        if ok(replace(s, mode="lora")):
            found.append("--mode lora")
    if fraction < 0.95 and ok(fraction=0.95):
        found.append("model.engine_memory_fraction=0.95")
    return found
