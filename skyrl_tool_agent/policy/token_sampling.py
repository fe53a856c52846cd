"""Choosing the next token on the device, with no host synchronisation and no global RNG state.

Each row draws its token by inverting the CDF with one uniform number that is a pure function of
the episode's seed and the token's position (`counter_uniform`, a counter-based hash), so an
episode samples the same tokens whatever shares its batch (continuous batching changes it every
few tokens). Everything is static-shape tensor ops, so it runs inside a CUDA graph.

What sampling means: temperature <= 0 is greedy (`sampling_params.is_greedy`, here per row on the
device); top-p keeps the smallest prefix of the sorted distribution whose mass before the
token is below top_p; the log-prob recorded is the token's under softmax(logits / temperature)
before truncation (what the trainer's ratio compares against), at temperature 1 for greedy rows
(`sampling_params.logprob_temperature`).
"""

from __future__ import annotations

import torch
from torch import Tensor

_MASK32 = 0xFFFFFFFF


def counter_uniform(seed: Tensor, counter: Tensor) -> Tensor:
    """A float32 uniform in (0, 1) per element, a hash of (seed, counter) (int64 tensors, seed <
    2**31, counter < 2**31). Every multiplier is below 2**31 so no int64 product overflows."""
    x = (seed * 0x9E3779B1 + counter * 0x7FEB352D + 0x165667B1) & _MASK32
    for multiplier in (0x2C1B3C6D, 0x297A2D39, 0x7FEB352D):  # xorshift-multiply rounds (lowbias32-style)
        x = x ^ (x >> 16)
        x = (x * multiplier) & _MASK32
    x = x ^ (x >> 15)
    return ((x >> 8).to(torch.float32) + 0.5) * (1.0 / (1 << 24))


def sample_tokens(logits: Tensor, temperature: Tensor, top_p: Tensor, uniform: Tensor, *,
                  nucleus: bool) -> tuple[Tensor, Tensor]:
    """(token [B], its log-prob [B]) for logits [B, V] with per-row temperature, top_p and uniform
    draw [B]. `nucleus`: apply top-p (sorts the vocabulary; rows with top_p >= 1 are unchanged by it)."""
    logits = logits.float()
    greedy = temperature <= 0  # `is_greedy`, per row on the device
    scale = torch.where(greedy, torch.ones_like(temperature), temperature).unsqueeze(-1)
    logp_all = torch.log_softmax(logits / scale, dim=-1)
    probs = logp_all.exp()
    if nucleus:
        probs, order = probs.sort(dim=-1, descending=True)
        probs = probs * ((probs.cumsum(-1) - probs) < top_p.unsqueeze(-1))  # always keeps the top token
    cdf = probs.cumsum(-1)
    target = (uniform * cdf[:, -1]).unsqueeze(-1)
    index = torch.searchsorted(cdf, target, right=True).clamp_(max=logits.shape[-1] - 1)
    drawn = (order.gather(-1, index) if nucleus else index).squeeze(-1)
    token = torch.where(greedy, logits.argmax(-1), drawn)
    return token, logp_all.gather(-1, token.unsqueeze(-1)).squeeze(-1)


def episode_seed(base: int, episode: int) -> int:
    """The seed of episode `episode` of a collection seeded `base` (below 2**31): `counter_uniform`
    of the pair, so neighbouring episodes' draws are unrelated."""
    mixed = counter_uniform(torch.tensor([base & 0x7FFFFFFF]), torch.tensor([episode & 0x7FFFFFFF]))
    return int(mixed.item() * (1 << 31)) & 0x7FFFFFFF
