"""Models of the public Qwen2.5 shapes with random weights, for timing and memory on a GPU machine
that cannot download the real ones (`build-model --random-shape`)."""

from __future__ import annotations

from pathlib import Path

from skyrl_tool_agent.memory.shape import QWEN25

#: Names `build-model --random-shape` takes -> a `QWEN25` architecture.
RANDOM_SHAPES = {name.lower(): name for name in QWEN25}


def write_random_model(shape: str, out: Path, tokenizer_dir: Path, *, seed: int = 0) -> int:
    """Write a model directory with a `QWEN25` architecture's exact shape (`shape`: a RANDOM_SHAPES
    key, e.g. 'qwen2.5-1.5b') and random bf16 weights, plus the tokenizer files of `tokenizer_dir`
    (the embedded model's). For timing and memory where the real weights cannot be downloaded:
    every turn runs to its token cap (a rollout's worst case). Returns the parameter count."""
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
