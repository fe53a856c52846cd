"""Warm-start SFT on a real tiny Qwen2: bf16 autocast path, fp32 path, masking of the loss."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from skyrl_tool_agent.policy.embedded import new_tiny_qwen2, train_tokenizer
from skyrl_tool_agent.warmstart.sft import (
    PackedExamples,
    SFTSettings,
    _autocast,
    fast_cpu_bf16,
    supervised_finetune,
)

CORPUS = [
    f"<|im_start|>user\nHow many rows in table t{i}?<|im_end|>\n<|im_start|>assistant\n"
    f"<answer>SELECT COUNT(*) FROM t{i}</answer><|im_end|>\n"
    for i in range(40)
]


@pytest.fixture(scope="module")
def tokenizer():
    return train_tokenizer(CORPUS, 300)


def _examples(tokenizer) -> list[tuple[list[int], list[int]]]:
    out = []
    for text in CORPUS:
        prompt, answer = text.split("<|im_start|>assistant\n")
        p = tokenizer(prompt + "<|im_start|>assistant\n", add_special_tokens=False)["input_ids"]
        a = tokenizer(answer, add_special_tokens=False)["input_ids"]
        out.append((p + a, [0] * len(p) + [1] * len(a)))
    return out


def _model(tokenizer):
    return new_tiny_qwen2(tokenizer, hidden_size=64, layers=2, heads=2, kv_heads=1, intermediate_size=128, seed=3)


def test_autocast_choice() -> None:
    model = torch.nn.Linear(2, 2)
    assert not _autocast(model, False)._enabled
    on = _autocast(model, True)
    assert on._enabled and on.fast_dtype == torch.bfloat16
    assert _autocast(model, None)._enabled == fast_cpu_bf16()  # auto on CPU = bf16 matrix instructions


def test_fast_cpu_bf16_reads_cpu_flags() -> None:
    cpuinfo = Path("/proc/cpuinfo")
    if not cpuinfo.is_file():
        assert fast_cpu_bf16() is False
        return
    flags = next((line for line in cpuinfo.read_text().splitlines() if line.startswith("flags")), "").split()
    assert fast_cpu_bf16() == ("amx_bf16" in flags or "avx512_bf16" in flags)


@pytest.mark.parametrize("bf16", [False, True])
def test_sft_learns_with_and_without_bf16_autocast(tokenizer, bf16: bool) -> None:
    examples = _examples(tokenizer)
    model = _model(tokenizer)
    settings = SFTSettings(steps=30, batch_size=8, learning_rate=5e-3, warmup_steps=5, bf16_autocast=bf16)
    history = supervised_finetune(model, examples, tokenizer.pad_token_id, settings)
    first, last = history.loss[0][1], history.loss[-1][1]
    assert last < 0.5 * first, (first, last)
    assert all(p.dtype == torch.float32 for p in model.parameters())  # autocast never changes the weights


def test_bf16_and_fp32_first_losses_agree(tokenizer) -> None:
    """Same init, same batch: the autocast loss equals the fp32 one up to bf16 rounding."""
    examples = _examples(tokenizer)
    losses = []
    for bf16 in (False, True):
        model = _model(tokenizer)
        history = supervised_finetune(model, examples, tokenizer.pad_token_id,
                                      SFTSettings(steps=1, batch_size=8, bf16_autocast=bf16))
        losses.append(history.loss[0][1])
    assert losses[0] == pytest.approx(losses[1], rel=0.02)


def test_loss_is_mean_nll_of_masked_in_tokens(tokenizer) -> None:
    """The SFT loss is the mean next-token NLL over the assistant (mask 1) tokens only, as a
    plain full-sequence forward computes it."""
    ids, mask = _examples(tokenizer)[0]
    model = _model(tokenizer)
    settings = SFTSettings(steps=1, batch_size=1, learning_rate=0.0, warmup_steps=1, bf16_autocast=False)
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=torch.tensor([ids])).logits[0, :-1].float(), -1)
        nll = -logp.gather(-1, torch.tensor(ids[1:]).unsqueeze(-1)).squeeze(-1)
    target = torch.tensor(mask[1:], dtype=torch.bool)
    loss = supervised_finetune(model, [(ids, mask)], tokenizer.pad_token_id, settings).loss[0][1]
    assert loss == pytest.approx(float(nll[target].mean()), rel=1e-4)
    assert loss != pytest.approx(float(nll.mean()), rel=1e-3)  # prompt tokens are not in it


class StepClock:
    """A monotonic clock that advances `tick` seconds at every read: each training step reads it a
    fixed number of times, so what a budget holds is the same on every machine (never this CPU's speed)."""

    def __init__(self, tick: float) -> None:
        self.now, self.tick = 1000.0, tick

    def __call__(self) -> float:
        self.now += self.tick
        return self.now


def test_time_budget_stops_the_warm_start_and_the_last_step_is_evaluated(tokenizer) -> None:
    """When steps are slow for the budget, the wall-clock cap, not the step count, ends the warm
    start, and the step it stopped at still gets its held-out figures. Time is a fake clock: a fast
    CPU and a slow one see the same steps (before: a 1.2 s real budget, which a fast CPU filled
    with all 10,000 steps' plan, failing the test)."""
    examples = _examples(tokenizer)
    evaluated: list[int] = []

    def evaluate(step: int) -> dict[str, float]:
        evaluated.append(step)
        return {"execution_accuracy": 0.0}

    def run(tick: float, steps: int = 10_000):
        evaluated.clear()
        settings = SFTSettings(steps=steps, batch_size=4, eval_every=5_000, bf16_autocast=False,
                               time_budget_minutes=0.2)
        return supervised_finetune(_model(tokenizer), examples, tokenizer.pad_token_id, settings, evaluate=evaluate,
                                   clock=StepClock(tick))

    history = run(tick=0.4)  # 2 reads a step: 0.8 s a step, ~15 steps in the 12 s budget on any machine
    done = len(history.loss)
    # The first 10 steps' speed fitted the cosine schedule to what 12 s holds: the same count on any CPU.
    assert 10 < history.planned_steps < 30
    assert 10 <= done <= history.planned_steps
    assert evaluated == [done] and history.evals[-1]["step"] == done
    # Without a cap the step count rules, and a step that was just evaluated is not evaluated twice.
    evaluated.clear()
    settings = SFTSettings(steps=4, batch_size=4, eval_every=2, bf16_autocast=False, time_budget_minutes=None)
    history = supervised_finetune(_model(tokenizer), examples, tokenizer.pad_token_id, settings, evaluate=evaluate)
    assert len(history.loss) == 4 and evaluated == [2, 4] and history.planned_steps == 4


def test_packed_examples_batch_as_the_examples_padded_to_the_batchs_longest(tokenizer) -> None:
    examples = _examples(tokenizer)
    examples[5] = (examples[5][0] + [7, 8, 9], examples[5][1] + [1, 1, 0])  # the longest of all
    packed = PackedExamples.pack(examples, tokenizer.pad_token_id, "cpu", max_length=1536)
    batch = packed.batch([3, 1])  # not the longest: trimmed to these two rows' width
    width = max(len(examples[3][0]), len(examples[1][0]))
    assert batch["input_ids"].shape == (2, width) < packed.input_ids.shape
    for row, i in enumerate([3, 1]):
        ids, mask = examples[i]
        assert batch["input_ids"][row, :len(ids)].tolist() == ids
        assert batch["attention_mask"][row].tolist() == [1] * len(ids) + [0] * (width - len(ids))
        assert batch["labels"][row, :len(ids)].tolist() == [t if m else -100 for t, m in zip(ids, mask)]
        assert batch["labels"][row, len(ids):].eq(-100).all()
    assert PackedExamples.pack(examples, 0, "cpu", max_length=4).input_ids.shape[1] == 4


def test_training_on_packed_examples_is_training_on_the_examples(tokenizer) -> None:
    examples = _examples(tokenizer)
    settings = SFTSettings(steps=6, batch_size=4, bf16_autocast=False, time_budget_minutes=None)
    plain = supervised_finetune(_model(tokenizer), examples, tokenizer.pad_token_id, settings).loss
    packed = PackedExamples.pack(examples, tokenizer.pad_token_id, "cpu", settings.max_length)
    assert supervised_finetune(_model(tokenizer), packed, tokenizer.pad_token_id, settings).loss == plain
    assert plain[-1][1] < plain[0][1]
