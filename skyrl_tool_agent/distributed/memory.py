"""Per-GPU memory for Qwen2.5-1.5B/7B in every mode: one update's parts and the rollout engine's
slots beside it (formulas of `grpo.memory` and `policy.memory_plan`, not measurements), as tables; and random-weight
models of those exact shapes for GPU timing (`write_random_model`).
"""

from __future__ import annotations

from pathlib import Path

from skyrl_tool_agent.grpo.memory import update_bytes
from skyrl_tool_agent.policy.memory_plan import GIB, ModelDims, snapshot_bytes

#: Public Qwen2.5 architectures (config.json of the hub repos).
QWEN25 = {
    "Qwen2.5-1.5B": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                         num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True),
    "Qwen2.5-7B": dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
                       num_key_value_heads=4, vocab_size=152064, tie_word_embeddings=False),
}
GB = GIB


def shapes(name: str, lora_r: int = 16) -> ModelDims:
    """The sizes of a `QWEN25` architecture."""
    from transformers import Qwen2Config

    return ModelDims.from_config(Qwen2Config(**QWEN25[name]), lora_r)


#: (label, mode, gpus, kl, four_bit, checkpointing)
SCENARIOS = [
    ("LoRA +KL, no ckpt", "lora", 1, True, False, False),
    ("LoRA +KL, ckpt", "lora", 1, True, False, True),
    ("QLoRA +KL, ckpt", "lora", 1, True, True, True),
    ("full ZeRO-3 x8 +KL, ckpt", "full", 8, True, False, True),
]


def print_estimates(token_budgets: tuple[int, ...] = (4096, 16384)) -> None:
    """Rich table of `estimate` for both Qwen2.5 sizes, the SCENARIOS and micro-batch token
    budgets (episodes x tokens per episode in one forward/backward), GB per GPU."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title="Estimated GB per GPU for one GRPO update (bf16, AdamW, LoRA r=16 on all projections)")
    for col in ("model", "scenario", "tokens", "weights", "trainable", "ref", "ZeRO buf", "activ.", "head", "total"):
        table.add_column(col, justify="left" if col in ("model", "scenario") else "right")
    for name in QWEN25:
        s = shapes(name)
        for label, mode, gpus, kl, four_bit, ckpt in SCENARIOS:
            for tokens in token_budgets:
                e = update_bytes(s, mode=mode, tokens=tokens, gpus=gpus, kl=kl, four_bit=four_bit, checkpointing=ckpt)
                table.add_row(f"{name}", label, str(tokens), *(f"{e[k] / GB:.1f}" for k in (
                    "weights", "trainable_state", "reference", "zero3_working", "activations", "head_chunk", "total")))
    Console(width=150).print(table)


#: The slot table's devices: (label, GiB a device, devices, micro-batch tokens of the update beside the engine).
DEVICES = (("24 GB", 24, 1, 8192), ("80 GB", 80, 1, 49152), ("8 x 80 GB", 80, 8, 49152))


def slot_table_markdown(episodes: int = 256, max_total_tokens: int = 6144, fraction: float = 0.9) -> str:
    """The rollout engine's slots per device for each QWEN25 shape and mode (`grpo.memory.MODES`)
    on `DEVICES`: the gpu profile's `episodes` in flight (split over the devices) of
    `max_total_tokens`, beside an update (checkpointed, KL on) and the engine's snapshot, as the
    engine plans them at `fraction` (`slots_beside_update`). A markdown table (docs/distributed.md;
    tests/test_memory_plan.py checks the doc holds this very table)."""
    from skyrl_tool_agent.config import UserInputError
    from skyrl_tool_agent.grpo.memory import MODES, slots_beside_update

    capacity = max_total_tokens + 8 + 2  # the engine's cache positions on CUDA (stop-check interval 8)
    head = ["model", "mode", *(f"{label} (update of {tokens:,} tokens)" for label, _, _, tokens in DEVICES)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name in QWEN25:
        s = shapes(name)
        for label, mode, four_bit in MODES:
            cells = []
            for _, gib, gpus, tokens in DEVICES:
                try:
                    plan = slots_beside_update(s, mode=mode, four_bit=four_bit, device_bytes=gib * GIB, gpus=gpus,
                                               episodes=episodes, capacity=capacity, micro_batch_tokens=tokens,
                                               fraction=fraction)
                    direct = four_bit and "4-bit matmul" in plan.explanation
                    cells.append(f"{plan.slots} of {plan.demand}" + (" (4-bit matmul)" if direct else ""))
                except UserInputError:
                    need = update_bytes(s, mode=mode, tokens=tokens, gpus=gpus, four_bit=four_bit)["total"]
                    copy = 0 if four_bit else snapshot_bytes(s, mode=mode)
                    cells.append(f"none (update {need / GIB:.0f} GiB" + (f" + snapshot {copy / GIB:.0f} GiB)" if copy else ")"))
            lines.append(f"| {name} | {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


#: Names `build-model --random-shape` takes -> a `QWEN25` architecture.
RANDOM_SHAPES = {name.lower(): name for name in QWEN25}


def write_random_model(shape: str, out: Path, tokenizer_dir: Path, *, seed: int = 0) -> int:
    """Write a model directory with a `QWEN25` architecture's exact shape (`shape`: a RANDOM_SHAPES
    key, e.g. 'qwen2.5-1.5b') and random bf16 weights, plus the tokenizer files of `tokenizer_dir`
    (the embedded model's: ids past its vocabulary decode to nothing). For timing and memory on a
    GPU machine that cannot download the real weights: random weights never emit a stop token or a
    tool call, so every turn runs to its token cap (a rollout's worst case) and every reward is 0.
    Returns the parameter count."""
    import shutil

    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(**QWEN25[RANDOM_SHAPES[shape]], max_position_embeddings=32768, eos_token_id=2, pad_token_id=0)
    torch.manual_seed(seed)
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):  # initialising 7B on a CPU takes minutes
        model = Qwen2ForCausalLM(cfg).to(torch.bfloat16)
    model.save_pretrained(out)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json"):
        if (tokenizer_dir / name).is_file():
            shutil.copy(tokenizer_dir / name, out)
    return sum(p.numel() for p in model.parameters())
