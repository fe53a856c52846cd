"""Per-GPU memory estimates for one GRPO update (formula, not a measurement) for Qwen2.5-1.5B/7B.

Parameter counts are exact (the architectures are instantiated on the meta device); the rest is
the usual accounting, in bytes:

* weights: bf16 = 2/param; NF4 with double quantisation = ~0.52/param for the decoder's linear
  layers, the rest (embeddings, lm_head, norms) fp32 after peft's k-bit preparation; ZeRO-3
  shards weights over N GPUs.
* trainable state with AdamW: LoRA adapters in fp32 (peft upcasts them) = 4 weight + 4 grad + 8
  moments = 16/adapter param; full ZeRO-3 = (2 bf16 grad + 12 fp32 master and moments)/N per param.
* reference for KL: LoRA = the same weights with adapters off (0); full = a second bf16 copy, sharded.
* activations per micro-batch of T tokens (bf16, sdpa): ~(7h + 3 kv + 4 I) values/token/layer kept
  for backward; with gradient checkpointing one h/token/layer plus one layer's worth.
* logits: the [T, V] logits and their gradient = 2 x T x V x (2 bf16 | 4 fp32) bytes (the
  log-probs themselves are chunked, so no further [T, V] fp32 copy).
* ZeRO-3 working set: the parameters gathered for the layers in flight (~2 layers + the embedding).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

#: Public Qwen2.5 architectures (config.json of the hub repos).
QWEN25 = {
    "Qwen2.5-1.5B": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                         num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True),
    "Qwen2.5-7B": dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
                       num_key_value_heads=4, vocab_size=152064, tie_word_embeddings=False),
}
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
GB = 1024**3


@dataclass(frozen=True)
class Shapes:
    params: int
    linear_params: int  # in the decoder layers (what NF4 quantises)
    embedding_params: int  # embed_tokens (+ lm_head when untied)
    lora_params: int
    hidden: int
    kv_dim: int
    intermediate: int
    layers: int
    vocab: int


def shapes(name: str, lora_r: int = 16) -> Shapes:
    """Exact parameter counts of a `QWEN25` architecture (meta device: no memory, no download)."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(**QWEN25[name])
    with torch.device("meta"):
        model = Qwen2ForCausalLM(cfg)
    params = sum(p.numel() for p in model.parameters())
    linear = lora = 0
    for module_name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear) and module_name.startswith("model.layers."):
            linear += module.weight.numel()
            if module_name.rsplit(".", 1)[-1] in LORA_TARGETS:
                lora += lora_r * (module.in_features + module.out_features)
    head_dim = cfg.hidden_size // cfg.num_attention_heads
    embedding = model.model.embed_tokens.weight.numel() + (0 if cfg.tie_word_embeddings else model.lm_head.weight.numel())
    return Shapes(params, linear, embedding, lora, cfg.hidden_size, cfg.num_key_value_heads * head_dim,
                  cfg.intermediate_size, cfg.num_hidden_layers, cfg.vocab_size)


def estimate(s: Shapes, *, mode: str, tokens: int, gpus: int = 1, kl: bool = True, four_bit: bool = False,
             checkpointing: bool = True, dtype_bytes: int = 2) -> dict[str, float]:
    """Bytes per GPU for one update on a micro-batch of `tokens` tokens (module doc), by component.

    `dtype_bytes`: 2 = bf16 weights and activations (GPU), 4 = fp32 (the CPU default). QLoRA:
    peft's `prepare_model_for_kbit_training` upcasts every parameter that is not 4-bit to fp32,
    so embeddings, norms, the residual stream and the logits are fp32.
    """
    n = gpus if mode == "full" else 1
    act_bytes = 4 if four_bit else dtype_bytes
    if four_bit:
        weights = 0.516 * s.linear_params + 4 * (s.params - s.linear_params)
    else:
        weights = dtype_bytes * s.params / n
    if mode == "full":
        # grads in the model dtype; fp32 master weights (when training in 16 bit) + two AdamW moments
        trainable = (dtype_bytes + (4 if dtype_bytes < 4 else 0) + 8) * s.params / n
        reference = dtype_bytes * s.params / n if kl else 0.0
        layer_params = (s.params - s.embedding_params) / s.layers
        working = dtype_bytes * (2 * layer_params + s.vocab * s.hidden) if n > 1 else 0.0
    else:
        trainable, reference, working = 16 * s.lora_params, 0.0, 0.0
    per_token_layer = 7 * s.hidden + 3 * s.kv_dim + 4 * s.intermediate
    if checkpointing:
        activations = act_bytes * tokens * (s.layers * s.hidden + per_token_layer)
    else:
        activations = act_bytes * tokens * s.layers * per_token_layer
    logits = 2 * act_bytes * tokens * s.vocab
    parts = {"weights": weights, "trainable_state": trainable, "reference": reference, "zero3_working": working,
             "activations": activations, "logits": logits}
    parts["total"] = sum(parts.values())
    return parts


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
    for col in ("model", "scenario", "tokens", "weights", "trainable", "ref", "ZeRO buf", "activ.", "logits", "total"):
        table.add_column(col, justify="left" if col in ("model", "scenario") else "right")
    for name in QWEN25:
        s = shapes(name)
        for label, mode, gpus, kl, four_bit, ckpt in SCENARIOS:
            for tokens in token_budgets:
                e = estimate(s, mode=mode, tokens=tokens, gpus=gpus, kl=kl, four_bit=four_bit, checkpointing=ckpt)
                table.add_row(f"{name}", label, str(tokens), *(f"{e[k] / GB:.1f}" for k in (
                    "weights", "trainable_state", "reference", "zero3_working", "activations", "logits", "total")))
    Console(width=150).print(table)


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
