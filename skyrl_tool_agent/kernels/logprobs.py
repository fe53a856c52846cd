"""Per-token log-probabilities and entropies from LM logits, without a `[B, L, V]` float32 copy.

`logits.float().log_softmax(-1).gather(...)` keeps two float32 full-vocabulary tensors for the
backward (~1.2 GB per 1k tokens at a 150k vocabulary). Here the forward walks `chunk_size`
positions at a time in float32 and keeps only the `[B, L]` logsumexp; the backward recomputes each
chunk's softmax. Peak extra memory: one float32 chunk.

Alignment is the caller's: `logits[:, t]` is the distribution that produced `labels[:, t]`, i.e.
pass `logits[:, :-1]` and `input_ids[:, 1:]` for a causal LM. Both functions compute and return
float32 (float64 for float64 logits, which the gradient checks use).
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

__all__ = ["entropy_from_logits", "head_token_stats", "token_logprobs"]

DEFAULT_CHUNK = 512


def _compute_dtype(logits: Tensor) -> torch.dtype:
    """float32 for half/bfloat16/float32 logits, float64 for float64."""
    return torch.promote_types(logits.dtype, torch.float32)


def _chunks(logits: Tensor, chunk_size: int) -> Iterator[tuple[int, slice]]:
    """(row b, positions) pairs covering `[B, L, V]` logits; rows are sliced separately so that a
    non-contiguous view such as `logits[:, :-1]` is never copied as a whole."""
    if chunk_size < 1:
        raise ValueError("chunk_size must be >= 1")
    batch, length = logits.shape[0], logits.shape[1]
    for b in range(batch):
        for start in range(0, length, chunk_size):
            yield b, slice(start, min(start + chunk_size, length))


class _SelectedLogProb(torch.autograd.Function):
    """log softmax(logits / T)[label], with a chunked, recomputing backward (see module docstring)."""

    @staticmethod
    def forward(ctx, logits: Tensor, labels: Tensor, temperature: float, chunk_size: int) -> Tensor:  # type: ignore[override]
        dt = _compute_dtype(logits)
        valid = labels >= 0
        safe_labels = labels.clamp(min=0).long()
        lse = torch.empty(labels.shape, dtype=dt, device=logits.device)
        for b, pos in _chunks(logits, chunk_size):
            lse[b, pos] = torch.logsumexp(logits[b, pos].to(dt) / temperature, dim=-1)
        picked = logits.gather(-1, safe_labels.unsqueeze(-1)).squeeze(-1).to(dt) / temperature
        ctx.save_for_backward(logits, safe_labels, valid, lse)
        ctx.temperature, ctx.chunk_size = temperature, chunk_size
        return torch.where(valid, picked - lse, torch.zeros_like(lse))

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out: Tensor) -> tuple[Tensor | None, None, None, None]:  # type: ignore[override]
        if not ctx.needs_input_grad[0]:
            return None, None, None, None
        logits, labels, valid, lse = ctx.saved_tensors
        dt = lse.dtype
        temperature = ctx.temperature
        # d logp / d logits = (onehot(label) - softmax) / T; ignored labels pass no gradient.
        scale = grad_out.to(dt) * valid.to(dt) / temperature
        grad = torch.empty_like(logits)
        for b, pos in _chunks(logits, ctx.chunk_size):
            probs = torch.exp(logits[b, pos].to(dt) / temperature - lse[b, pos].unsqueeze(-1))
            g = probs.mul_(-scale[b, pos].unsqueeze(-1))
            g.scatter_add_(-1, labels[b, pos].unsqueeze(-1), scale[b, pos].unsqueeze(-1))
            grad[b, pos] = g.to(logits.dtype)
        return grad, None, None, None


class _Entropy(torch.autograd.Function):
    """Entropy of softmax(logits / T) per position, with a chunked, recomputing backward."""

    @staticmethod
    def forward(ctx, logits: Tensor, temperature: float, chunk_size: int) -> Tensor:  # type: ignore[override]
        dt = _compute_dtype(logits)
        shape = logits.shape[:-1]
        lse = torch.empty(shape, dtype=dt, device=logits.device)
        entropy = torch.empty(shape, dtype=dt, device=logits.device)
        for b, pos in _chunks(logits, chunk_size):
            z = logits[b, pos].to(dt) / temperature
            chunk_lse = torch.logsumexp(z, dim=-1)
            # H = lse - sum_i p_i z_i
            entropy[b, pos] = chunk_lse - (torch.softmax(z, dim=-1) * z).sum(-1)
            lse[b, pos] = chunk_lse
        ctx.save_for_backward(logits, lse, entropy)
        ctx.temperature, ctx.chunk_size = temperature, chunk_size
        return entropy

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out: Tensor) -> tuple[Tensor | None, None, None]:  # type: ignore[override]
        if not ctx.needs_input_grad[0]:
            return None, None, None
        logits, lse, entropy = ctx.saved_tensors
        dt = lse.dtype
        temperature = ctx.temperature
        grad = torch.empty_like(logits)
        for b, pos in _chunks(logits, ctx.chunk_size):
            log_p = logits[b, pos].to(dt) / temperature - lse[b, pos].unsqueeze(-1)
            # dH/dz_i = -p_i (log p_i + H); the 1/T comes from z = logits / T.
            g = -torch.exp(log_p) * (log_p + entropy[b, pos].unsqueeze(-1))
            grad[b, pos] = (g * (grad_out[b, pos].to(dt) / temperature).unsqueeze(-1)).to(logits.dtype)
        return grad, None, None


def _check_logits(logits: Tensor, temperature: float) -> None:
    if logits.dim() != 3:
        raise ValueError(f"logits must be [B, L, V], got shape {tuple(logits.shape)}")
    if temperature <= 0:
        raise ValueError("temperature must be > 0")


def token_logprobs(logits: Tensor, labels: Tensor, temperature: float = 1.0, chunk_size: int = DEFAULT_CHUNK) -> Tensor:
    """`[B, L]` float32: log p(labels[b, l]) under softmax(logits[b, l] / temperature).

    Use the sampling temperature so that the log-probs match those of the rollout engine.
    Labels < 0 (e.g. -100 padding) give 0.0 and pass no gradient. Differentiable w.r.t. `logits`.
    """
    _check_logits(logits, temperature)
    if labels.shape != logits.shape[:-1]:
        raise ValueError(f"labels {tuple(labels.shape)} do not match logits {tuple(logits.shape)}")
    return _SelectedLogProb.apply(logits, labels, temperature, chunk_size)


def entropy_from_logits(logits: Tensor, temperature: float = 1.0, chunk_size: int = DEFAULT_CHUNK) -> Tensor:
    """`[B, L]` float32: entropy (nats) of softmax(logits / temperature) at each position.

    Differentiable w.r.t. `logits` (for an entropy bonus); call under `torch.no_grad()` when it is
    only logged.
    """
    _check_logits(logits, temperature)
    return _Entropy.apply(logits, temperature, chunk_size)


# ------------------------------------------------------------------ fused with the output projection
#: Bytes of float32 logits one chunk of the fused projection may hold (~440 tokens of a 152k
#: vocabulary still fill a GPU; the backward holds ~2.5x this).
FUSED_CHUNK_BYTES = 1 << 28


def fused_chunk_tokens(vocab: int, chunk_bytes: int = FUSED_CHUNK_BYTES) -> int:
    """Tokens per chunk of `head_token_stats` for a vocabulary of `vocab`: one float32 chunk of logits
    within `chunk_bytes`, at least 16."""
    return max(16, chunk_bytes // (4 * vocab))


def _scaled_logits(hidden: Tensor, weight: Tensor, dt: torch.dtype, temperature: float) -> Tensor:
    """`(hidden @ weight.T) / temperature` in `dt`: one matmul (the weights' dtype, as `lm_head`
    computes it), the division done in place (none at temperature 1)."""
    z = (hidden @ weight.T).to(dt)
    return z if temperature == 1.0 else z.div_(temperature)


class _HeadTokenStats(torch.autograd.Function):
    """log softmax(hidden @ weight.T / T)[label] and, if asked, the entropy, for `[N, H]` hidden states,
    `chunk` tokens at a time in both directions, so the `[N, V]` logits never exist (Liger's fused
    linear log-prob, in torch)."""

    @staticmethod
    def forward(ctx, hidden: Tensor, weight: Tensor, labels: Tensor, temperature: float, chunk: int,  # type: ignore[override]
                with_entropy: bool) -> tuple[Tensor, Tensor]:
        dt = _compute_dtype(hidden)
        n = hidden.shape[0]
        valid = labels >= 0
        safe = labels.clamp(min=0).long()
        logp = torch.zeros(n, dtype=dt, device=hidden.device)
        lse = torch.empty(n, dtype=dt, device=hidden.device)
        entropy = torch.zeros(n if with_entropy else 0, dtype=dt, device=hidden.device)
        for start in range(0, n, chunk):
            rows = slice(start, min(start + chunk, n))
            z = _scaled_logits(hidden[rows], weight, dt, temperature)
            lse[rows] = z_lse = torch.logsumexp(z, dim=-1)
            logp[rows] = z.gather(-1, safe[rows].unsqueeze(-1)).squeeze(-1) - z_lse
            if with_entropy:  # H = lse - sum_i p_i z_i
                p = torch.sub(z, z_lse.unsqueeze(-1)).exp_()
                entropy[rows] = z_lse - torch.linalg.vecdot(p, z)
        logp = torch.where(valid, logp, torch.zeros_like(logp))
        ctx.save_for_backward(hidden, weight, safe, valid, lse, entropy)
        ctx.temperature, ctx.chunk = temperature, chunk
        # An output the loss does not use (the entropy, when only logged) comes back as None, not as
        # zeros: its gradient terms are then skipped instead of computed as zeros over [chunk, V].
        ctx.set_materialize_grads(False)
        ctx.mark_non_differentiable(*(() if with_entropy else (entropy,)))
        return logp, entropy

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_logp: Tensor | None, grad_entropy: Tensor | None  # type: ignore[override]
                 ) -> tuple[Tensor | None, Tensor | None, None, None, None, None]:
        hidden, weight, labels, valid, lse, entropy = ctx.saved_tensors
        need_hidden, need_weight = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        dt, t, n = lse.dtype, ctx.temperature, hidden.shape[0]
        with_entropy = entropy.numel() > 0 and grad_entropy is not None
        grad_hidden = torch.empty_like(hidden) if need_hidden else None
        grad_weight = torch.zeros(weight.shape, dtype=dt, device=weight.device) if need_weight else None
        scale = None if grad_logp is None else grad_logp.to(dt) * valid.to(dt) / t
        for start in range(0, n, ctx.chunk):
            rows = slice(start, min(start + ctx.chunk, n))
            h = hidden[rows]
            log_p = _scaled_logits(h, weight, dt, t).sub_(lse[rows].unsqueeze(-1))
            p = torch.exp(log_p)
            # d logp / dz = onehot(label) - p;  dH / dz = -p (log p + H);  z = logits / T. In place,
            # one pass each: g = p * (-scale - (log p + H) * dH/T), then the one-hot part.
            if with_entropy:
                coef = log_p.add_(entropy[rows].unsqueeze(-1)).mul_(-(grad_entropy[rows].to(dt) / t).unsqueeze(-1))
                if scale is not None:
                    coef.sub_(scale[rows].unsqueeze(-1))
                g = coef.mul_(p)
            elif scale is not None:
                g = p.mul_(-scale[rows].unsqueeze(-1))
            else:
                g = p.zero_()
            if scale is not None:
                g.scatter_add_(-1, labels[rows].unsqueeze(-1), scale[rows].unsqueeze(-1))
            g = g.to(hidden.dtype)
            if grad_hidden is not None:
                grad_hidden[rows] = g @ weight
            if grad_weight is not None:
                grad_weight.add_(g.T.to(dt) @ h.to(dt))
        return (grad_hidden, None if grad_weight is None else grad_weight.to(weight.dtype), None, None, None, None)


def head_token_stats(hidden: Tensor, weight: Tensor, labels: Tensor, temperature: float = 1.0, *,
                     with_entropy: bool = False, chunk_tokens: int | None = None) -> tuple[Tensor, Tensor | None]:
    """`[N]` float32 log p(labels[i]) under softmax(hidden[i] @ weight.T / temperature), and the
    entropy there when `with_entropy`, without the `[N, V]` logits (see `_HeadTokenStats`).

    `hidden` `[N, H]` (the final norm's output), `weight` `[V, H]` (the output projection, no bias).
    Labels < 0 give 0.0 and pass no gradient. Differentiable w.r.t. `hidden` and `weight`."""
    if hidden.dim() != 2 or weight.dim() != 2 or hidden.shape[1] != weight.shape[1]:
        raise ValueError(f"hidden {tuple(hidden.shape)} and weight {tuple(weight.shape)} must be [N, H] and [V, H]")
    if labels.shape != hidden.shape[:1]:
        raise ValueError(f"labels {tuple(labels.shape)} do not match hidden {tuple(hidden.shape)}")
    if temperature <= 0:
        raise ValueError("temperature must be > 0")
    chunk = chunk_tokens or fused_chunk_tokens(weight.shape[0])
    logp, entropy = _HeadTokenStats.apply(hidden, weight, labels, temperature, chunk, with_entropy)
    return logp, (entropy if with_entropy else None)
