"""Advantage estimators for GRPO-style training, as pure tensor functions.

Sequence level (one scalar reward per sampled completion), rewards laid out as `[N, G]`: N prompts,
G completions sampled for each (a "group").

- ``grpo``    (Shao et al., DeepSeekMath): ``(r - mean_g) / (std_g + eps)``.
- ``dr_grpo`` (Liu et al., "Understanding R1-Zero-Like Training"): ``r - mean_g``. Dropping the
  std removes the question-difficulty bias (groups with tiny spread get huge advantages).
- ``rloo``    (Ahmadian et al.): ``r_i - mean_{j != i} r_j`` = ``G / (G - 1) * (r_i - mean_g)``,
  an unbiased leave-one-out baseline.

Turn level (optional credit assignment for multi-turn episodes): per-turn rewards and a per-turn
value estimate, `[B, T]`, combined with GAE (Schulman et al. 2016). Finally, helpers spread the
sequence or turn advantages onto tokens `[B, L]` for the token-level loss in `losses.py`.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

__all__ = [
    "AdvantageEstimator",
    "broadcast_to_tokens",
    "discounted_returns",
    "gae_advantages",
    "group_advantages",
    "informative_group_mask",
    "scale_by_batch",
    "turn_advantages_to_tokens",
]

AdvantageEstimator = Literal["grpo", "dr_grpo", "rloo"]


def _check_rewards(rewards: Tensor) -> None:
    if rewards.dim() != 2:
        raise ValueError(f"rewards must be [N, G] (prompts x group size), got shape {tuple(rewards.shape)}")
    if not bool(torch.isfinite(rewards).all()):
        raise ValueError("rewards contain NaN or inf")


def informative_group_mask(rewards: Tensor, atol: float = 0.0) -> Tensor:
    """Bool `[N]`: True for groups whose rewards are not all equal (within `atol`).

    A group where every completion scored the same carries no relative signal: all its GRPO/RLOO/
    Dr. GRPO advantages are 0, so it only dilutes the batch. DAPO's dynamic sampling drops (and
    re-samples) such groups; the caller filters with this mask and logs how many were dropped.
    """
    _check_rewards(rewards)
    spread = rewards.max(dim=1).values - rewards.min(dim=1).values
    return spread > atol


def group_advantages(
    rewards: Tensor,
    estimator: AdvantageEstimator = "grpo",
    eps: float = 1e-6,
    unbiased_std: bool = True,
) -> Tensor:
    """Per-completion advantages `[N, G]` from rewards `[N, G]`, normalised within each group.

    `estimator` picks the formula (module docstring). For ``grpo`` the std is the unbiased (G - 1)
    sample std by default, as TRL's GRPOTrainer uses; pass `unbiased_std=False` for the population
    std. Groups whose rewards are all equal get exactly 0 (never NaN, also for G = 1), since
    `r - mean` can be a rounding error away from 0 and dividing it by `eps` would blow it up.
    ``rloo`` needs G >= 2.
    """
    _check_rewards(rewards)
    rewards = rewards.float() if not rewards.is_floating_point() else rewards
    group_size = rewards.shape[1]
    mean = rewards.mean(dim=1, keepdim=True)
    centred = rewards - mean
    if estimator == "grpo":
        std = rewards.std(dim=1, keepdim=True, unbiased=unbiased_std) if group_size > 1 else torch.zeros_like(mean)
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


def scale_by_batch(
    advantages: Tensor,
    eps: float = 1e-6,
    mask: Tensor | None = None,
    reference: Tensor | None = None,
) -> Tensor:
    """Divide advantages by one batch-wide std (`std + eps`), instead of (or after) per-group scaling.

    The std is taken over `reference` when given, else over `advantages`, restricted to `mask`
    (same shape as that source; all entries when None). Pass the raw rewards as `reference` to get
    TRL's ``scale_rewards="batch"`` (group-centred rewards over the batch std of rewards, as in
    "Tricks or Traps", Liu et al. 2025). Where the std is 0 (nothing to scale) the advantages are
    returned unchanged.
    """
    source = advantages if reference is None else reference
    values = source.reshape(-1) if mask is None else source[mask.bool().expand_as(source)]
    values = values.float()
    if values.numel() > 1:
        std = values.std().to(advantages.dtype)
    else:
        std = torch.zeros((), dtype=advantages.dtype, device=advantages.device)
    return torch.where(std > 0, advantages / (std + eps), advantages)


def discounted_returns(rewards: Tensor, gamma: float, mask: Tensor | None = None) -> Tensor:
    """Reward-to-go `G_t = r_t + gamma * G_{t+1}` along the last dimension (`[T]` or `[B, T]`).

    The step after the last valid turn contributes 0. Positions where `mask` is 0 are skipped
    (they neither receive nor pass on return, and come back as 0), so episodes with different
    numbers of turns can share a padded tensor.
    """
    valid = torch.ones_like(rewards) if mask is None else mask.to(rewards.dtype)
    returns = torch.zeros_like(rewards)
    running = torch.zeros_like(rewards[..., 0])
    for t in reversed(range(rewards.shape[-1])):
        m = valid[..., t]
        step = rewards[..., t] + gamma * running
        returns[..., t] = step * m
        running = m * step + (1.0 - m) * running
    return returns


def gae_advantages(
    turn_rewards: Tensor,
    values: Tensor,
    turn_mask: Tensor,
    gamma: float = 0.99,
    lam: float = 0.95,
) -> tuple[Tensor, Tensor]:
    """Generalised advantage estimation over turns; returns `(advantages, returns)`, both `[B, T]`.

    `turn_rewards[b, t]` is the reward observed after turn t, `values[b, t]` the critic's estimate
    at the start of turn t (treated as a constant: detach it). For each episode the valid turns are
    those where `turn_mask` is set, in order; gaps are skipped, so ragged episodes can be right-padded
    (or even have holes). The last valid turn bootstraps with 0 (the episode ended):

        delta_t = r_t + gamma * V_{t+1} - V_t,   A_t = delta_t + gamma * lam * A_{t+1},   R_t = A_t + V_t

    Invalid positions come back as 0 in both outputs.
    """
    if not (turn_rewards.shape == values.shape == turn_mask.shape) or turn_rewards.dim() != 2:
        raise ValueError("turn_rewards, values and turn_mask must all be [B, T]")
    values = values.detach().to(turn_rewards.dtype)
    valid = turn_mask.to(turn_rewards.dtype)
    advantages = torch.zeros_like(turn_rewards)
    next_value = torch.zeros_like(turn_rewards[:, 0])
    next_adv = torch.zeros_like(next_value)
    for t in reversed(range(turn_rewards.shape[1])):
        m = valid[:, t]
        delta = turn_rewards[:, t] + gamma * next_value - values[:, t]
        adv = delta + gamma * lam * next_adv
        advantages[:, t] = adv * m
        # Carry the successor's value/advantage straight through masked-out positions.
        next_value = m * values[:, t] + (1.0 - m) * next_value
        next_adv = m * adv + (1.0 - m) * next_adv
    returns = (advantages + values) * valid
    return advantages, returns


def broadcast_to_tokens(seq_advantages: Tensor, loss_mask: Tensor) -> Tensor:
    """Give every policy token of sequence b the advantage `seq_advantages[b]`; other tokens get 0."""
    if seq_advantages.dim() != 1 or loss_mask.dim() != 2 or seq_advantages.shape[0] != loss_mask.shape[0]:
        raise ValueError("expected seq_advantages [B] and loss_mask [B, L]")
    return seq_advantages.unsqueeze(1) * loss_mask.to(seq_advantages.dtype)


def turn_advantages_to_tokens(turn_advantages: Tensor, token_turn_index: Tensor) -> Tensor:
    """Token advantages `[B, L]`: token (b, l) gets `turn_advantages[b, token_turn_index[b, l]]`.

    `token_turn_index` is a LongTensor `[B, L]` holding, for each policy token, the index of the
    assistant turn it belongs to, and -1 for every other token (prompt, tool output, padding), which
    get advantage 0.
    """
    if turn_advantages.dim() != 2 or token_turn_index.dim() != 2:
        raise ValueError("expected turn_advantages [B, T] and token_turn_index [B, L]")
    if turn_advantages.shape[0] != token_turn_index.shape[0]:
        raise ValueError("turn_advantages and token_turn_index disagree on the batch size")
    if bool((token_turn_index >= turn_advantages.shape[1]).any()) or bool((token_turn_index < -1).any()):
        raise ValueError("token_turn_index must be -1 or a valid turn index")
    is_policy = token_turn_index >= 0
    gathered = torch.gather(turn_advantages, 1, token_turn_index.clamp(min=0).long())
    return gathered * is_policy.to(turn_advantages.dtype)
