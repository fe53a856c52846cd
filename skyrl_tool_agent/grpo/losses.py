"""GRPO / DAPO / Dr. GRPO policy loss as pure tensor functions.

All per-token tensors are `[B, L]` over the full (prompt + completion + tool output) sequence;
`loss_mask` selects the policy-generated tokens the loss is taken over. Per-token terms:

    pg_t  = -min(r_t * A_t, clip(r_t, 1 - eps_low, 1 + eps_high) * A_t),   r_t = pi(a_t) / pi_old(a_t)
    loss_t = pg_t + kl_coef * KL_t - entropy_coef * H_t

`eps_high > eps_low` is DAPO's clip-higher. The per-token loss is then reduced by `aggregate`:

- ``token_mean``:    sum over all policy tokens / their number (DAPO; TRL ``bnpo``/``dapo``).
- ``sequence_mean``: mean per sequence, then mean over sequences (original GRPO; TRL ``grpo``),
                     which weights short answers' tokens more.
- ``fixed_length``:  sum / (B * fixed_length) (Dr. GRPO's constant normaliser; TRL ``dr_grpo``),
                     which has no length bias at all.

Gradient accumulation: every mode is `numerator(micro-batch) / denominator` with an additive
numerator, so pass the full batch's `loss_normalizer` as `normalizer` for every micro-batch and
`backward()` each loss unscaled: the summed gradients equal the un-split batch's.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from skyrl_tool_agent.config.grpo import Aggregation, KLEstimator
from skyrl_tool_agent.grpo.masking import masked_max, masked_mean

__all__ = [
    "Aggregation",
    "KLEstimator",
    "aggregate",
    "clipped_policy_loss",
    "grpo_loss",
    "kl_estimate",
    "loss_normalizer",
]


# exp() of a log-ratio beyond +-20 overflows float16 and means the sample is useless anyway (verl does the same).
LOG_RATIO_CLAMP = 20.0
# verl clamps the k3 estimate to 10: a single runaway token must not dominate the KL penalty.
K3_MAX = 10.0


def _as_bool(mask: Tensor) -> Tensor:
    return mask if mask.dtype == torch.bool else mask != 0


def kl_estimate(logp: Tensor, ref_logp: Tensor, estimator: KLEstimator = "k3") -> Tensor:
    """Per-token estimate of KL(pi || pi_ref) from tokens sampled from pi (Schulman, "Approximating KL").

    With `x = ref_logp - logp` (log pi_ref/pi):
      k1 = -x                 unbiased, high variance, can be negative;
      k2 = x^2 / 2            biased, low variance, >= 0;
      k3 = exp(x) - x - 1     unbiased, low variance, >= 0 (GRPO's choice).
    For k3, x is clamped to +-20 and the result to <= 10, as verl does, so one token with a
    vanishing probability cannot produce inf/NaN or dominate the batch.
    """
    log_ratio = ref_logp - logp
    if estimator == "k1":
        return -log_ratio
    if estimator == "k2":
        return 0.5 * log_ratio.square()
    if estimator == "k3":
        log_ratio = log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
        return (torch.exp(log_ratio) - log_ratio - 1.0).clamp(max=K3_MAX)
    raise ValueError(f"unknown KL estimator {estimator!r}; expected k1, k2 or k3")


def _token_advantages(advantages: Tensor, like: Tensor) -> Tensor:
    """Sequence advantages `[B]` become `[B, 1]` (broadcast over tokens); `[B, L]` pass through."""
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(1)
    return advantages.to(like.dtype).expand_as(like)


def _floats(named: dict[str, Tensor]) -> dict[str, float]:
    """Detached scalars to python floats with a single device sync."""
    if not named:
        return {}
    values = torch.stack([v.detach().float().reshape(()) for v in named.values()]).tolist()
    return dict(zip(named.keys(), values, strict=True))


def clipped_policy_loss(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    loss_mask: Tensor,
    eps_low: float = 0.2,
    eps_high: float = 0.28,
) -> tuple[Tensor, dict[str, float]]:
    """PPO-clip surrogate per token, `[B, L]` (not yet masked or reduced), and diagnostics.

    `advantages` is `[B, L]` or `[B]` (one per sequence). The gradient is exactly zero where the
    clip is active: ratio > 1 + eps_high with A > 0, or ratio < 1 - eps_low with A < 0.
    Masked-out positions get loss 0 and no gradient even if inf/NaN. Stats are token means over
    the mask; ``approx_kl`` is the k3 estimate of KL(pi_old || pi).
    """
    mask = _as_bool(loss_mask)
    adv = _token_advantages(advantages, logp)
    zero = torch.zeros_like(logp)
    log_ratio = torch.where(mask, logp - old_logp, zero).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    ratio = torch.exp(log_ratio)
    unclipped = -adv * ratio
    clipped = -adv * ratio.clamp(1.0 - eps_low, 1.0 + eps_high)
    per_token = torch.maximum(unclipped, clipped)
    per_token = torch.where(mask, per_token, zero)

    with torch.no_grad():
        high = mask & (ratio > 1.0 + eps_high) & (adv > 0)
        low = mask & (ratio < 1.0 - eps_low) & (adv < 0)
        named = {
            "clip_frac_low": masked_mean(low.float(), mask),
            "clip_frac_high": masked_mean(high.float(), mask),
            "clip_frac": masked_mean((low | high).float(), mask),
            "ratio_mean": masked_mean(ratio, mask),
            "ratio_max": masked_max(ratio, mask),
            # KL(old || new) sampled from old: k3 with the roles swapped, i.e. r - 1 - log r.
            "approx_kl": masked_mean(ratio - 1.0 - log_ratio, mask),
        }
    return per_token, _floats(named)


def loss_normalizer(loss_mask: Tensor | Sequence[Tensor], aggregation: Aggregation,
                    fixed_length: int | None = None) -> float:
    """The denominator `aggregate` uses for this mask: policy-token count (``token_mean``), number
    of sequences with at least one policy token (``sequence_mean``), or B * fixed_length
    (``fixed_length``); never below 1. Compute it on the full batch for gradient accumulation; a
    sequence of masks (micro-batches of different widths) counts as their concatenation."""
    masks = [_as_bool(m) for m in ([loss_mask] if isinstance(loss_mask, Tensor) else loss_mask)]
    if aggregation == "token_mean":
        return float(max(sum(int(m.sum()) for m in masks), 1))
    if aggregation == "sequence_mean":
        return float(max(sum(int(m.any(dim=-1).sum()) for m in masks), 1))
    if aggregation == "fixed_length":
        if fixed_length is None or fixed_length < 1:
            raise ValueError("aggregation 'fixed_length' needs fixed_length >= 1 (e.g. max completion tokens)")
        return float(sum(m.shape[0] for m in masks) * fixed_length)
    raise ValueError(f"unknown aggregation {aggregation!r}; expected token_mean, sequence_mean or fixed_length")


def aggregate(
    per_token: Tensor,
    loss_mask: Tensor,
    mode: Aggregation = "token_mean",
    fixed_length: int | None = None,
    normalizer: float | None = None,
) -> Tensor:
    """Reduce a `[B, L]` per-token loss over `loss_mask` to a scalar (module docstring); `normalizer`
    overrides the denominator (default: `loss_normalizer` of this mask)."""
    mask = _as_bool(loss_mask)
    denominator = loss_normalizer(mask, mode, fixed_length) if normalizer is None else float(normalizer)
    if denominator <= 0:
        raise ValueError("normalizer must be > 0")
    masked = torch.where(mask, per_token, torch.zeros_like(per_token))
    if mode == "sequence_mean":
        counts = mask.sum(dim=-1).clamp(min=1).to(per_token.dtype)
        numerator = (masked.sum(dim=-1) / counts).sum()
    else:  # token_mean and fixed_length share the numerator; loss_normalizer validated the mode
        numerator = masked.sum()
    return numerator / denominator


def grpo_loss(
    logp: Tensor,
    old_logp: Tensor,
    advantages: Tensor,
    loss_mask: Tensor,
    *,
    ref_logp: Tensor | None = None,
    kl_coef: float = 0.0,
    kl_estimator: KLEstimator = "k3",
    entropy: Tensor | None = None,
    entropy_coef: float = 0.0,
    eps_low: float = 0.2,
    eps_high: float = 0.28,
    aggregation: Aggregation = "token_mean",
    fixed_length: int | None = None,
    normalizer: float | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """The full GRPO objective (module docstring) as a scalar loss to minimise, plus stats.

    `logp` (with grad), `old_logp` (no grad) and optional `ref_logp` (required when `kl_coef != 0`)
    are `[B, L]`; `advantages` `[B, L]` or `[B]`. The KL penalty and the entropy bonus are inside
    the aggregation, so the accumulation recipe covers them. Stats: ``loss``, ``pg_loss``, the clip
    statistics, ``kl`` / ``entropy`` (when given) and ``num_tokens``.
    """
    if kl_coef != 0.0 and ref_logp is None:
        raise ValueError("kl_coef != 0 needs ref_logp")
    if entropy_coef != 0.0 and entropy is None:
        raise ValueError("entropy_coef != 0 needs the per-token entropy")
    mask = _as_bool(loss_mask)
    per_token, stats = clipped_policy_loss(logp, old_logp, advantages, mask, eps_low, eps_high)

    def reduce(x: Tensor) -> Tensor:
        return aggregate(x, mask, aggregation, fixed_length, normalizer)

    total = per_token
    named: dict[str, Tensor] = {"pg_loss": reduce(per_token.detach()), "num_tokens": mask.sum()}
    if ref_logp is not None:
        # Masked positions are zeroed first so inf/NaN there cannot leak into the gradient.
        zero = torch.zeros_like(logp)
        kl = kl_estimate(torch.where(mask, logp, zero), torch.where(mask, ref_logp.detach(), zero), kl_estimator)
        named["kl"] = masked_mean(kl.detach(), mask)
        if kl_coef != 0.0:
            total = total + kl_coef * kl
    if entropy is not None:
        named["entropy"] = masked_mean(entropy.detach(), mask)
        if entropy_coef != 0.0:
            total = total - entropy_coef * entropy
    loss = reduce(total)
    named["loss"] = loss.detach()
    stats.update(_floats(named))
    return loss, stats
