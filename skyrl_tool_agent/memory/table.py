"""The memory model's tables for Qwen2.5-1.5B and 7B in every mode: the plan a GPU run gets
(docs/distributed.md; tests/test_memory_plan.py checks the doc holds this very table) and one
update's parts (`memory_profile --estimate`). Formulas of `memory.model`, not measurements."""

from __future__ import annotations

from skyrl_tool_agent.memory import model as mm
from skyrl_tool_agent.memory.device import GIB
from skyrl_tool_agent.memory.plan import PlanError, plan_run
from skyrl_tool_agent.memory.shape import QWEN25, qwen25

#: The table's modes: (label, mode, four-bit weights).
MODES = (("LoRA", "lora", False), ("QLoRA", "lora", True), ("full ZeRO-3", "full", False))
#: The table's devices: (label, GiB a device, devices).
DEVICES = (("24 GB", 24, 1), ("80 GB", 80, 1), ("8 x 80 GB (per GPU)", 80, 8))


def slot_table_markdown(episodes: int = 256, max_total_tokens: int = 6144, update_cap: int = 49152,
                        fraction: float = 0.9) -> str:
    """The plan of each QWEN25 shape and mode on `DEVICES` (gpu profile values: `episodes` in flight
    split over the devices, episodes of `max_total_tokens`, the update's budget chosen up to
    `update_cap`, KL on, gradient checkpointing): "slots of demand" and the update's tokens, or the
    first knob that would fit. A markdown table."""
    head = ["model", "mode", *(label for label, _, _ in DEVICES)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name in QWEN25:
        for label, mode, four_bit in MODES:
            cells = []
            for _, gib, gpus in DEVICES:
                setup = mm.Setup(qwen25(name), mode=mode, four_bit=four_bit, world=gpus if mode == "full" else 1)
                try:
                    plan = plan_run(setup, device_bytes=gib * GIB, fraction=fraction, demand=episodes // gpus,
                                    max_total_tokens=max_total_tokens, update_tokens=None, update_cap=update_cap)
                    snapshot = ", through the modules" if plan.through_modules else ""
                    cells.append(f"{plan.slots} of {plan.demand} (update {plan.update_tokens:,}{snapshot})")
                except PlanError as error:
                    fix = str(error).partition("would fit: ")[2].split(";")[0]
                    cells.append(f"error: does not fit (would: {fix})")
            lines.append(f"| {name} | {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


#: (label, mode, gpus, kl, four_bit, checkpointing) of the update table.
SCENARIOS = [
    ("LoRA +KL, no ckpt", "lora", 1, True, False, False),
    ("LoRA +KL, ckpt", "lora", 1, True, False, True),
    ("QLoRA +KL, ckpt", "lora", 1, True, True, True),
    ("full ZeRO-3 x8 +KL, ckpt", "full", 8, True, False, True),
]


def print_estimates(token_budgets: tuple[int, ...] = (4096, 16384)) -> None:
    """Rich table of one update's parts (`memory.model.update_bytes`) for both Qwen2.5 sizes, the
    SCENARIOS and micro-batch token budgets, GiB per GPU."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title="Estimated GiB per GPU for one GRPO update (bf16, AdamW, LoRA r=16 on all projections)")
    keys = ("weights", "gradients", "optimizer_state", "reference", "zero3_gathered", "activations", "backward", "total")
    for col in ("model", "scenario", "tokens", "weights", "grads", "AdamW", "ref", "ZeRO gathered", "activ.",
                "backward", "total"):
        table.add_column(col, justify="left" if col in ("model", "scenario") else "right")
    for name in QWEN25:
        for label, mode, gpus, kl, four_bit, ckpt in SCENARIOS:
            setup = mm.Setup(qwen25(name), mode=mode, four_bit=four_bit, world=gpus, kl=kl, checkpointing=ckpt)
            for tokens in token_budgets:
                parts = mm.update_bytes(setup, tokens)
                table.add_row(name, label, str(tokens), *(f"{parts[k] / GIB:.1f}" for k in keys))
    Console(width=150).print(table)
