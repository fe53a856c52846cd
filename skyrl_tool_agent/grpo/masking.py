"""Masked reductions over token tensors.

A mask marks the positions that count (policy-generated tokens); it may be bool or
float 0/1 and must broadcast against the values. Empty masks reduce to 0 rather than NaN, because
a micro-batch with no policy tokens (e.g. every sample truncated) must not poison a whole step.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["masked_max", "masked_mean", "masked_sum"]


def _as_weights(mask: Tensor, like: Tensor) -> Tensor:
    """The mask as 0/1 weights in `like`'s floating dtype (bool masks cannot multiply gradients)."""
    dtype = like.dtype if like.is_floating_point() else torch.float32
    return mask.to(dtype)


def masked_sum(x: Tensor, mask: Tensor) -> Tensor:
    """Sum of `x` over the positions where `mask` is set."""
    return (x * _as_weights(mask, x)).sum()


def masked_mean(x: Tensor, mask: Tensor) -> Tensor:
    """Mean of `x` over the masked positions; 0 when nothing is masked in."""
    weights = _as_weights(mask, x).expand_as(x)
    return masked_sum(x, weights) / weights.sum().clamp(min=1.0)


def masked_max(x: Tensor, mask: Tensor) -> Tensor:
    """Largest masked value of `x` (scalar); 0 when nothing is masked in."""
    bool_mask = mask.bool().expand_as(x)
    if not bool(bool_mask.any()):
        return torch.zeros((), dtype=x.dtype, device=x.device)
    return x[bool_mask].max()
