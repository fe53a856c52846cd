"""`GRPOTrainer._update` (the real optimizer step: micro-batches, one normaliser for the whole batch)
under each `grpo.loss_aggregation`, on a tiny Qwen2 built in the test.

The batch is on-policy (old log-probs = the policy's own), so every ratio is 1 and each policy
token's loss is exactly -A of its sequence: the expected loss of each mode is then a hand sum.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from skyrl_tool_agent.config import Config
from skyrl_tool_agent.grpo.batch import TrainBatch
from skyrl_tool_agent.grpo.trainer import GRPOTrainer
from skyrl_tool_agent.policy.qwen import QwenPolicy
from tests.fixtures.tiny_policy import sql_token_model_dir, tiny_policy

ADVANTAGES = [1.0, -0.5, 2.0]
# policy tokens per row: unequal, so the three modes give three different numbers
SPANS = [(3, 5), (4, 14), (8, 11)]
WIDTH = 16


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return sql_token_model_dir(tmp_path_factory.mktemp("update") / "model")


def _config(model_dir: Path, **grpo: Any) -> Config:
    return Config.model_validate({
        "model": {"name_or_path": str(model_dir), "device": "cpu"},
        # micro-batches of 2 over 3 rows: the shared normaliser must make them add up
        "training": {"mode": "full", "micro_batch_size": 2, "learning_rate": 1e-2, "wandb": {"mode": "disabled"}},
        "grpo": {"kl_coef": 0.0, "entropy_coef": 0.0, **grpo},
    })


def _on_policy_batch(policy: QwenPolicy) -> TrainBatch:
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(5, policy.model.config.vocab_size, (len(SPANS), WIDTH), generator=gen)
    attention = torch.ones_like(ids)
    attention[0, 12:] = 0  # one right-padded row
    loss_mask = torch.zeros((len(SPANS), WIDTH - 1), dtype=torch.bool)
    for row, (start, end) in enumerate(SPANS):
        loss_mask[row, start:end] = True
    with torch.no_grad():
        old, _ = policy.token_logprobs(ids, attention)
    adv = torch.tensor(ADVANTAGES).unsqueeze(1) * loss_mask
    return TrainBatch(ids, attention, loss_mask, old * loss_mask, adv)


def _expected_loss(mode: str, fixed_length: int) -> float:
    counts = [end - start for start, end in SPANS]
    token_sum = sum(-a * n for a, n in zip(ADVANTAGES, counts, strict=True))
    if mode == "token_mean":
        return token_sum / sum(counts)
    if mode == "sequence_mean":
        return sum(-a for a in ADVANTAGES) / len(ADVANTAGES)
    return token_sum / (len(ADVANTAGES) * fixed_length)


@pytest.mark.parametrize(
    ("grpo", "fixed_length"),
    [
        ({"loss_aggregation": "token_mean"}, None),
        ({"loss_aggregation": "sequence_mean"}, None),
        # the documented default: null = max_total_tokens (this crashed the first update)
        ({"loss_aggregation": "fixed_length", "fixed_length_normalizer": None, "max_total_tokens": 600}, 600),
        ({"loss_aggregation": "fixed_length", "fixed_length_normalizer": 40}, 40),
    ],
    ids=["token_mean", "sequence_mean", "fixed_length_null", "fixed_length_40"],
)
def test_update_under_each_loss_aggregation(model_dir: Path, tmp_path: Path, grpo: dict[str, Any],
                                            fixed_length: int | None) -> None:
    config = _config(model_dir, **grpo)
    policy = tiny_policy(model_dir, mode="full")
    batch = _on_policy_batch(policy)
    before = [p.detach().clone() for p in policy.trainable_parameters()]
    trainer = GRPOTrainer(config, policy, None, None, [], output_dir=tmp_path)  # type: ignore[arg-type]

    stats = trainer._update(batch)

    expected = _expected_loss(grpo["loss_aggregation"], fixed_length or 0)
    assert stats["loss"] == pytest.approx(expected, rel=1e-4)
    # KL and entropy off: the policy term is the whole loss, over 2 micro-batches as over one
    assert stats["pg_loss"] == pytest.approx(stats["loss"], rel=1e-5)
    assert stats["ratio_mean"] == pytest.approx(1.0, abs=1e-5)
    assert stats["grad_norm"] > 0
    assert any(not torch.equal(p, b) for p, b in zip(policy.trainable_parameters(), before, strict=True))


def _token_mean_loss(rows: list[int]) -> float:
    counts = [SPANS[r][1] - SPANS[r][0] for r in rows]
    return sum(-ADVANTAGES[r] * n for r, n in zip(rows, counts, strict=True)) / sum(counts)


@pytest.mark.parametrize(("accumulation", "minibatches"), [(None, [[0, 1, 2]]), (1, [[0], [1], [2]]), (2, [[0, 1], [2]])])
def test_gradient_accumulation_steps_every_n_micro_batches(model_dir: Path, tmp_path: Path, accumulation: int | None,
                                                           minibatches: list[list[int]]) -> None:
    """training.gradient_accumulation = N: an optimizer step every N micro-batches, each minibatch's
    loss normalised over its own tokens; the logged loss is the mean over the steps."""
    config = _config(model_dir, loss_aggregation="token_mean")
    config.training.micro_batch_size = 1
    config.training.gradient_accumulation = accumulation
    config.training.learning_rate = 1e-9  # every minibatch's ratio stays 1: the losses are hand sums
    policy = tiny_policy(model_dir, mode="full")
    trainer = GRPOTrainer(config, policy, None, None, [], output_dir=tmp_path)  # type: ignore[arg-type]

    stats = trainer._update(_on_policy_batch(policy))

    steps = {int(state["step"]) for state in trainer.optimizer.state.values()}
    assert steps == {len(minibatches)}  # the optimizer really stepped that often
    assert stats["optimizer_steps"] == len(minibatches)
    expected = sum(_token_mean_loss(rows) for rows in minibatches) / len(minibatches)
    assert stats["loss"] == pytest.approx(expected, rel=1e-4)
    assert stats["pg_loss"] == pytest.approx(expected, rel=1e-4)
