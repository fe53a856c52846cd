"""Advantage estimators for GRPO-style training, as pure tensor functions.

Sequence level (one scalar reward per sampled completion), rewards laid out as `[N, G]`: N prompts,
G completions sampled for each (a "group").

- ``grpo``    (Shao et al., DeepSeekMath): ``(r - mean_g) / (std_g + eps)``.
- ``dr_grpo`` (Liu et al., "Understanding R1-Zero-Like Training"): ``r - mean_g``. Dropping the
  std removes the question-difficulty bias (groups with tiny spread get huge advantages).
- ``rloo``    (Ahmadian et al.): ``r_i - mean_{j != i} r_j`` = ``G / (G - 1) * (r_i - mean_g)``,
  an unbiased leave-one-out baseline.

Every policy token of an episode gets its episode's advantage (`grpo.batch.collate`), unless
per-turn credit is on (`grpo.turn_credit_discount`): then the tokens of turn k also get the
discounted return of the environment's per-turn shaping rewards from turn k on
(`turn_token_advantages`).
"""

from __future__ import annotations

import torch
from torch import Tensor

from skyrl_tool_agent.config.grpo import AdvantageEstimator

__all__ = [
    "AdvantageEstimator",
    "batch_scaled_advantages",
    "discounted_returns",
    "group_advantages",
    "informative_group_mask",
    "turn_of_token",
    "turn_token_advantages",
]


def _check_rewards(rewards: Tensor) -> None:
    if rewards.dim() != 2:
        raise ValueError(f"rewards must be [N, G] (prompts x group size), got shape {tuple(rewards.shape)}")
    if not bool(torch.isfinite(rewards).all()):
        raise ValueError("rewards contain NaN or inf")


def informative_group_mask(rewards: Tensor, atol: float = 0.0) -> Tensor:
    """Bool `[N]`: True for groups whose rewards are not all equal (within `atol`); an equal group's
    advantages are all 0, so it only dilutes the batch (DAPO's dynamic sampling drops them)."""
    _check_rewards(rewards)
    spread = rewards.max(dim=1).values - rewards.min(dim=1).values
    return spread > atol


def group_advantages(rewards: Tensor, estimator: AdvantageEstimator = "grpo", eps: float = 1e-6) -> Tensor:
    """Per-completion advantages `[N, G]` from rewards `[N, G]`, normalised within each group.

    `estimator` picks the formula (module docstring). For ``grpo`` the std is the unbiased (G - 1)
    sample std, as TRL's GRPOTrainer uses. Groups whose rewards are all equal get exactly 0 (never
    NaN, also for G = 1), since `r - mean` can be a rounding error away from 0 and dividing it by
    `eps` would blow it up. ``rloo`` needs G >= 2.
    """
    _check_rewards(rewards)
    rewards = rewards.float() if not rewards.is_floating_point() else rewards
    group_size = rewards.shape[1]
    mean = rewards.mean(dim=1, keepdim=True)
    centred = rewards - mean
    if estimator == "grpo":
        std = rewards.std(dim=1, keepdim=True) if group_size > 1 else torch.zeros_like(mean)
        adv = centred / (std + eps)
    elif estimator == "dr_grpo":
        adv = centred
    elif estimator == "rloo":
        if group_size < 2:
            raise ValueError("rloo needs at least 2 completions per group")
        # r_i - (sum - r_i) / (G - 1) == G / (G - 1) * (r_i - mean); the closed form avoids a cancellation.
        adv = centred * (group_size / (group_size - 1))
    else:
        raise ValueError(f"unknown advantage estimator {estimator!r}; expected grpo, dr_grpo or rloo")
    uniform = ~informative_group_mask(rewards)
    return adv.masked_fill(uniform.unsqueeze(1), 0.0)


def batch_scaled_advantages(rewards: Tensor, estimator: AdvantageEstimator = "grpo", eps: float = 1e-6) -> Tensor:
    """TRL's ``scale_rewards="batch"`` ("Tricks or Traps", Liu et al. 2025): rewards `[N, G]` centred
    within each group (``rloo``: times G / (G - 1)), then divided by `std + eps` of all the batch's
    rewards instead of each group's own std (so ``grpo`` and ``dr_grpo`` give the same values).
    Uniform groups stay exactly 0; a batch whose rewards have no spread is returned centred, unscaled."""
    centred = group_advantages(rewards, "rloo" if estimator == "rloo" else "dr_grpo")
    values = rewards.reshape(-1).float()
    std = values.std().to(centred.dtype) if values.numel() > 1 else torch.zeros((), dtype=centred.dtype)
    return torch.where(std > 0, centred / (std + eps), centred)


def turn_of_token(loss_mask: Tensor) -> Tensor:
    """For a 1-D 0/1 mask over an episode's ids, the index of the turn each policy id was sampled
    in (each maximal run of 1s is one turn), -1 where the mask is 0."""
    mask = loss_mask.bool()
    starts = mask & ~torch.cat([mask.new_zeros(1), mask[:-1]])
    return torch.where(mask, starts.long().cumsum(0) - 1, torch.full_like(mask, -1, dtype=torch.long))


def discounted_returns(rewards: Tensor, discount: float) -> Tensor:
    """`[T]` per-turn rewards -> `[T]` returns `R_k = sum_{j >= k} discount^(j - k) r_j`."""
    out = torch.zeros_like(rewards, dtype=torch.float32)
    running = 0.0
    for k in range(rewards.shape[0] - 1, -1, -1):
        running = float(rewards[k]) + discount * running
        out[k] = running
    return out


def turn_token_advantages(outcome: float, turn_rewards: Tensor, loss_mask: Tensor, discount: float) -> Tensor:
    """Per-id advantages `[L]` of one episode with per-turn credit.

    Every policy id of turn k gets `outcome` (its group-relative advantage) plus the discounted
    return from turn k of the shaping rewards (`turn_rewards` with the last turn's entry, which is
    the final reward already inside `outcome`, taken as 0); non-policy ids get 0. If the mask's turns
    do not match `turn_rewards` (one per turn), every policy id gets `outcome` alone."""
    turns = turn_of_token(loss_mask)
    policy = turns >= 0
    count = int(turns.max()) + 1 if bool(policy.any()) else 0
    if count != turn_rewards.shape[0]:
        return torch.where(policy, torch.tensor(float(outcome)), torch.tensor(0.0))
    shaping = turn_rewards.float().clone()
    shaping[-1] = 0.0
    per_turn = outcome + discounted_returns(shaping, discount)
    return torch.where(policy, per_turn[turns.clamp(min=0)], torch.tensor(0.0))
