"""The plateau build: its stopping rule on hand-made curves, and exact resumption of the supervised
run it is made of (a real tiny Qwen2, interrupted at an evaluation and continued from the saved
state through torch.load(weights_only=True))."""

from __future__ import annotations

import copy
import io

import pytest
import torch

from skyrl_tool_agent.policy.embedded import new_tiny_qwen2, train_tokenizer
from skyrl_tool_agent.warmstart.plateau import (PlateauRule, continuation_settings, plateau_reached, stop_reason,
                                                 tail_gain)
from skyrl_tool_agent.warmstart.sft import SFTSettings, supervised_finetune

from tests.test_warmstart import CORPUS, _examples  # the same tiny chat corpus and masks


def _curve(values: list[float], every: int = 100) -> list[dict]:
    return [{"step": every * (i + 1), "execution_accuracy": v} for i, v in enumerate(values)]


def test_tail_gain_compares_the_last_fifth_of_steps_smoothed() -> None:
    rule = PlateauRule(tail_fraction=0.2, smooth=2, min_steps=0)
    # steps 100..1000; 80% of 1000 = 800: mean(EX@700, EX@800) vs mean(EX@900, EX@1000)
    values = [0.1, 0.2, 0.3, 0.4, 0.45, 0.5, 0.52, 0.54, 0.55, 0.555]
    assert tail_gain(_curve(values), rule) == pytest.approx((0.55 + 0.555) / 2 - (0.52 + 0.54) / 2)
    assert plateau_reached(_curve(values), PlateauRule(min_gain=0.01, smooth=2, min_steps=0)) is False  # +2.25 points
    flat = values[:8] + [0.541, 0.536]
    assert plateau_reached(_curve(flat), PlateauRule(min_gain=0.01, smooth=2, min_steps=0)) is True


def test_no_plateau_before_min_steps_or_with_too_few_evaluations() -> None:
    flat = _curve([0.5] * 10)
    assert plateau_reached(flat, PlateauRule(min_steps=2000)) is False  # last step 1000
    assert plateau_reached(flat, PlateauRule(min_steps=1000)) is True
    assert tail_gain(_curve([0.5, 0.5, 0.5]), PlateauRule(smooth=2)) is None  # windows would overlap
    assert tail_gain([], PlateauRule()) is None


def test_stop_reason_names_a_flat_curve_or_the_step_cap() -> None:
    rule = PlateauRule(min_gain=0.01, smooth=2, min_steps=0)
    rising = _curve([0.1, 0.2, 0.3, 0.4, 0.5])
    assert stop_reason(rising, rule, max_steps=None) is None
    assert stop_reason(rising, rule, max_steps=500) == "max_steps 500 reached before the plateau"
    assert stop_reason(_curve([0.5] * 10), rule, max_steps=500).startswith("plateau: the last 20% of steps added +0.0")


def test_continuation_settings_are_the_warm_starts_tail_rate_held_constant() -> None:
    s = continuation_settings(seed=5, eval_every=300)
    assert s.learning_rate == pytest.approx(SFTSettings().learning_rate * 0.1)
    assert (s.warmup_steps, s.seed, s.eval_every, s.time_budget_minutes) == (0, 5, 300, None)


def _resumable_run(tokenizer):  # noqa: ANN001, ANN202
    """Settings of a short run evaluated every 4 steps, a tiny model, and an untouched copy of it."""
    settings = SFTSettings(steps=12, batch_size=5, learning_rate=5e-3, warmup_steps=2, eval_every=4,
                           time_budget_minutes=None, bf16_autocast=False)
    fresh = new_tiny_qwen2(tokenizer, hidden_size=64, layers=2, heads=2, kv_heads=1, intermediate_size=128, seed=3)
    return settings, fresh, copy.deepcopy(fresh)


def _step_curve(step: int) -> dict:
    """A stand-in validation curve (the step, scaled): what the resume must replay exactly."""
    return {"execution_accuracy": step / 100}


def test_a_run_stopped_at_an_evaluation_and_resumed_matches_the_uninterrupted_run() -> None:
    tokenizer = train_tokenizer(CORPUS, 300)
    examples = _examples(tokenizer)
    settings, fresh, first = _resumable_run(tokenizer)

    whole = supervised_finetune(fresh, examples, tokenizer.pad_token_id, settings, evaluate=_step_curve)

    saved: list[bytes] = []

    def stop_at_step_8(history, state) -> bool:
        buf = io.BytesIO()
        torch.save(state(), buf)
        saved.append(buf.getvalue())
        return history.evals[-1]["step"] == 8

    part = supervised_finetune(first, examples, tokenizer.pad_token_id, settings, evaluate=_step_curve,
                               after_eval=stop_at_step_8)
    assert [s for s, _ in part.loss] == list(range(1, 9))  # stopped right after step 8's evaluation
    state = torch.load(io.BytesIO(saved[-1]), weights_only=True)
    assert state["step"] == 8
    rest = supervised_finetune(first, examples, tokenizer.pad_token_id, settings, evaluate=_step_curve, resume=state)
    assert [s for s, _ in rest.loss] == list(range(1, 13))
    torch.testing.assert_close(torch.tensor([v for _, v in rest.loss]), torch.tensor([v for _, v in whole.loss]))
    assert [e["step"] for e in rest.evals] == [e["step"] for e in whole.evals] == [4, 8, 12]
    for a, b in zip(first.parameters(), fresh.parameters(), strict=True):
        torch.testing.assert_close(a, b)


def test_each_epoch_trains_on_its_own_examples_and_a_resumed_run_rebuilds_its_epoch(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """`epoch_examples` (the build's redrawn constants: `warmstart.build.RedrawnEpochs`): epoch e
    trains on exactly epoch e's examples, and a run stopped mid-epoch and resumed rebuilds that
    epoch's examples, so its losses and weights are the uninterrupted run's."""
    from skyrl_tool_agent.warmstart import sft

    tokenizer = train_tokenizer(CORPUS, 300)
    pool = _examples(tokenizer)

    def variant(epoch: int) -> list[tuple[list[int], list[int]]]:  # 15 examples, other ones each epoch
        return [pool[(10 * epoch + i) % len(pool)] for i in range(15)]

    built: list[int] = []

    def epoch_examples(epoch: int) -> list[tuple[list[int], list[int]]]:
        built.append(epoch)
        return variant(epoch)

    trained: list[set[tuple[int, ...]]] = []
    real_loss = sft.token_loss

    def spy(model, batch, *, bf16):
        rows = batch["input_ids"].tolist()
        trained.append({tuple(r[:n]) for r, n in zip(rows, batch["attention_mask"].sum(1).tolist())})
        return real_loss(model, batch, bf16=bf16)

    monkeypatch.setattr(sft, "token_loss", spy)
    settings, fresh, first = _resumable_run(tokenizer)

    whole = supervised_finetune(fresh, variant(0), tokenizer.pad_token_id, settings, evaluate=_step_curve,
                                epoch_examples=epoch_examples)
    assert built == [1, 2, 3]  # 15 examples in batches of 5: a new epoch every 3 steps
    for epoch in range(4):
        seen = set().union(*trained[3 * epoch: 3 * epoch + 3])
        assert seen == {tuple(ids) for ids, _ in variant(epoch)}, f"epoch {epoch} trained on other examples"

    saved: list[bytes] = []

    def stop_at_step_8(history, state) -> bool:
        buf = io.BytesIO()
        torch.save(state(), buf)
        saved.append(buf.getvalue())
        return history.evals[-1]["step"] == 8

    supervised_finetune(first, variant(0), tokenizer.pad_token_id, settings, evaluate=_step_curve,
                        after_eval=stop_at_step_8, epoch_examples=epoch_examples)
    state = torch.load(io.BytesIO(saved[-1]), weights_only=True)
    assert (state["step"], state["epochs"]) == (8, 3)  # stopped in the third epoch (steps 7-9)
    built.clear()
    rest = supervised_finetune(first, variant(0), tokenizer.pad_token_id, settings, evaluate=_step_curve, resume=state,
                               epoch_examples=epoch_examples)
    assert built == [2, 3]  # the epoch it stopped in, rebuilt, then the next
    torch.testing.assert_close(torch.tensor([v for _, v in rest.loss]), torch.tensor([v for _, v in whole.loss]))
    for a, b in zip(first.parameters(), fresh.parameters(), strict=True):
        torch.testing.assert_close(a, b)
