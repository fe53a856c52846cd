"""GRPO advantage estimators (group, batch scaling) and masked reductions.

Expected values are computed independently (plain python loops / `statistics` / `math`), never by
calling the function under test.
"""

from __future__ import annotations

import math
import random
import statistics

import pytest
import torch

from skyrl_tool_agent.grpo.advantages import batch_scaled_advantages, group_advantages, informative_group_mask
from skyrl_tool_agent.grpo.masking import masked_max, masked_mean, masked_sum

REWARDS = [[1.0, 0.0, 0.0, 1.0], [0.5, 0.2, 0.9, 0.1], [0.3, 0.3, 0.3, 0.3]]


def _t(rows: list[list[float]]) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float64)


# ---------------------------------------------------------------- group advantages


def test_grpo_advantages_match_hand_computed() -> None:
    eps = 1e-6
    adv = group_advantages(_t(REWARDS), "grpo", eps=eps)
    for i, row in enumerate(REWARDS[:2]):
        mean, std = statistics.fmean(row), statistics.stdev(row)
        for j, r in enumerate(row):
            assert adv[i, j].item() == pytest.approx((r - mean) / (std + eps), rel=1e-9)
    # [1, 0, 0, 1]: unbiased std = sqrt(1/3), so the advantages are +-0.5 * sqrt(3) (eps aside).
    assert adv[0, 0].item() == pytest.approx(0.5 * math.sqrt(3), rel=1e-5)


def test_dr_grpo_is_centred_reward() -> None:
    adv = group_advantages(_t(REWARDS), "dr_grpo")
    for i, row in enumerate(REWARDS):
        mean = sum(row) / len(row)
        assert adv[i].tolist() == pytest.approx([r - mean for r in row], abs=1e-12)


def test_rloo_is_leave_one_out() -> None:
    rng = random.Random(0)
    rows = [[rng.random() for _ in range(5)] for _ in range(3)]
    adv = group_advantages(_t(rows), "rloo")
    for i, row in enumerate(rows):
        for j, r in enumerate(row):
            others = [x for k, x in enumerate(row) if k != j]
            assert adv[i, j].item() == pytest.approx(r - sum(others) / len(others), abs=1e-12)


@pytest.mark.parametrize("estimator", ["grpo", "dr_grpo", "rloo"])
def test_uniform_groups_get_exact_zero(estimator: str) -> None:
    # In float32 the mean of seven 0.3s is not exactly 0.3: r - mean ~ 3e-8 and std ~ 3e-8, so without the
    # explicit guard GRPO would hand this no-signal group advantages of ~0.03.
    rewards = torch.tensor([[0.3] * 7, [1.0] * 7, [0.0, 1.0, 0.5, 0.5, 0.5, 0.5, 0.5]], dtype=torch.float32)
    adv = group_advantages(rewards, estimator)
    assert torch.isfinite(adv).all()
    assert adv[:2].eq(0).all()
    assert adv[2].abs().sum() > 0


def test_group_size_one() -> None:
    rewards = torch.tensor([[0.7], [0.2]])
    assert group_advantages(rewards, "grpo").eq(0).all()
    with pytest.raises(ValueError):
        group_advantages(rewards, "rloo")


def test_bad_rewards_rejected() -> None:
    with pytest.raises(ValueError):
        group_advantages(torch.tensor([[1.0, float("nan")]]), "grpo")
    with pytest.raises(ValueError):
        group_advantages(torch.tensor([1.0, 0.0]), "grpo")
    with pytest.raises(ValueError):
        group_advantages(torch.tensor([[1.0, 0.0]]), "ppo")  # type: ignore[arg-type]


def test_informative_group_mask() -> None:
    mask = informative_group_mask(_t(REWARDS))
    assert mask.dtype == torch.bool
    assert mask.tolist() == [True, True, False]
    near = torch.tensor([[0.5, 0.5 + 1e-9], [0.0, 1.0]], dtype=torch.float64)
    assert informative_group_mask(near).tolist() == [True, True]
    assert informative_group_mask(near, atol=1e-6).tolist() == [False, True]


def test_batch_scaled_advantages() -> None:
    rewards = _t([[1.0, 0.0, 0.0, 1.0], [1.0, 1.0, 1.0, 1.0]])
    flat = [x for row in rewards.tolist() for x in row]
    scaled = batch_scaled_advantages(rewards, "grpo", eps=0.0)  # group-centred, over the batch's std
    assert scaled[0].tolist() == pytest.approx([x / statistics.stdev(flat) for x in (0.5, -0.5, -0.5, 0.5)])
    assert scaled[1].eq(0).all()  # a uniform group stays exactly 0
    assert torch.equal(scaled, batch_scaled_advantages(rewards, "dr_grpo", eps=0.0))
    # zero spread: returned unchanged, not divided by eps
    assert batch_scaled_advantages(torch.full((2, 3), 0.5)).eq(0).all()


# ---------------------------------------------------------------- masking helpers


def test_masked_reductions() -> None:
    x = _t([[1.0, 2.0, 100.0], [4.0, 100.0, 100.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    assert masked_sum(x, mask).item() == 7.0
    assert masked_mean(x, mask).item() == pytest.approx(7 / 3)
    assert masked_max(x, mask).item() == 4.0
    assert masked_max(x, torch.zeros_like(mask)).item() == 0.0
    assert masked_mean(x, torch.zeros_like(mask)).item() == 0.0  # empty mask: 0, not NaN
