"""The embedded default model: a BPE tokenizer trained on the project's corpus and a tiny Qwen2.

It exists so the main job runs on a laptop CPU with no download. The tokenizer (Qwen2's split
regex, byte-level BPE) is saved as a `Qwen2Tokenizer`, so `AutoTokenizer` reloads identical ids.
"""

from __future__ import annotations

from collections.abc import Iterable

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM


# Qwen2's pre-tokenizer split pattern (tokenizer.json of Qwen2/Qwen2.5).
QWEN2_SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# The turn format's markers, written here because this layer cannot import `env.chat_format`, which
# spells them for the prompt: tests/test_policy_collector.py checks that the two agree.
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# Qwen2.5 also has these as added (non-special) tokens: one id each keeps tool syntax easy to emit.
TOOL_TOKENS = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "<answer>", "</answer>"]
# ChatML as Qwen2.5's template renders a conversation whose tools are already in the system message
# (the same text as `env.chat_format.render_conversation`: tests/test_policy_collector.py).
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def train_tokenizer(corpus: Iterable[str], vocab_size: int = 2048) -> PreTrainedTokenizerFast:
    """Byte-level BPE with Qwen2's pre-tokenizer, wrapped as a transformers fast tokenizer."""
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_SPLIT_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus, trainer=trainer)
    tok.add_tokens(TOOL_TOKENS)
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>", "<|im_end|>"],
        clean_up_tokenization_spaces=False,
        model_max_length=4096,
    )
    wrapped.chat_template = CHAT_TEMPLATE
    return wrapped


def new_tiny_qwen2(tokenizer: PreTrainedTokenizerFast, *, hidden_size: int = 256, layers: int = 4,
                   heads: int = 4, kv_heads: int = 2, intermediate_size: int = 704,
                   max_positions: int = 4096, seed: int = 0, vocab_size: int | None = None) -> Qwen2ForCausalLM:
    """A freshly initialised Qwen2 with tied embeddings (~3.5M parameters at the defaults); its
    vocabulary is the tokenizer's unless `vocab_size`."""
    import torch

    torch.manual_seed(seed)
    config = Qwen2Config(
        vocab_size=vocab_size or len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=max_positions,
        tie_word_embeddings=True,
        rope_theta=10000.0,
        bos_token_id=None,
        eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"),
        pad_token_id=tokenizer.pad_token_id,
    )
    return Qwen2ForCausalLM(config)
