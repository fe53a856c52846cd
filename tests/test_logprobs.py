"""Chunked token log-probs and entropies, checked against the naive full-vocabulary computation."""

from __future__ import annotations

import math

import pytest
import torch

from skyrl_tool_agent.kernels.logprobs import entropy_from_logits, token_logprobs


def _reference_logprobs(logits: torch.Tensor, labels: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    logp = torch.log_softmax(logits.double() / temperature, dim=-1)
    picked = logp.gather(-1, labels.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    return torch.where(labels >= 0, picked, torch.zeros_like(picked))


def _reference_entropy(logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    logp = torch.log_softmax(logits.double() / temperature, dim=-1)
    return -(logp.exp() * logp).sum(-1)


@pytest.mark.parametrize("chunk_size", [1, 3, 512])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_token_logprobs_values_and_gradient(chunk_size: int, temperature: float) -> None:
    gen = torch.Generator().manual_seed(0)
    full = (torch.randn(3, 8, 11, generator=gen, dtype=torch.float64) * 3).requires_grad_(True)
    logits = full[:, :-1]  # a non-contiguous view, as with logits[:, :-1] from a causal LM
    labels = torch.randint(0, 11, (3, 7), generator=gen)
    labels[1, 2:] = -100  # padding
    weights = torch.randn(3, 7, generator=gen, dtype=torch.float64)

    out = token_logprobs(logits, labels, temperature=temperature, chunk_size=chunk_size)
    ref = _reference_logprobs(logits, labels, temperature)
    assert out.dtype == torch.float64 and out.shape == (3, 7)  # float64 in, float64 out
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)
    assert out[1, 2:].eq(0).all()

    (grad,) = torch.autograd.grad((out * weights).sum(), full)
    (ref_grad,) = torch.autograd.grad((ref * weights).sum(), full)
    torch.testing.assert_close(grad, ref_grad, rtol=1e-10, atol=1e-12)
    assert grad[1, 2:7].eq(0).all()  # ignored labels pass no gradient
    assert grad[:, 7].eq(0).all()  # the dropped last position


def test_token_logprobs_bf16_is_upcast() -> None:
    gen = torch.Generator().manual_seed(1)
    logits = (torch.randn(2, 5, 1000, generator=gen) * 4).bfloat16().requires_grad_(True)
    labels = torch.randint(0, 1000, (2, 5), generator=gen)
    out = token_logprobs(logits, labels)
    ref = _reference_logprobs(logits, labels)  # same (rounded) logits, float64 math
    assert out.dtype == torch.float32
    # bf16 log_softmax would be off by ~1e-2 here; the float32 upcast keeps it at float32 precision.
    torch.testing.assert_close(out.double(), ref, rtol=0, atol=1e-5)
    (grad,) = torch.autograd.grad(out.sum(), logits)
    (ref_grad,) = torch.autograd.grad(ref.sum(), logits)
    assert grad.dtype == torch.bfloat16
    torch.testing.assert_close(grad.float(), ref_grad.float(), rtol=1e-2, atol=1e-3)


def test_token_logprobs_gradcheck() -> None:
    gen = torch.Generator().manual_seed(2)
    logits = torch.randn(2, 3, 5, generator=gen, dtype=torch.float64, requires_grad=True)
    labels = torch.tensor([[0, 4, -100], [2, 2, 1]])
    assert torch.autograd.gradcheck(lambda x: token_logprobs(x, labels, 0.9, 2), (logits,))


def test_entropy_of_uniform_logits_is_log_vocab() -> None:
    for vocab in (2, 7, 50):
        ent = entropy_from_logits(torch.full((2, 3, vocab), 1.234))
        torch.testing.assert_close(ent, torch.full((2, 3), math.log(vocab)))


@pytest.mark.parametrize("chunk_size", [2, 512])
def test_entropy_values_and_gradient(chunk_size: int) -> None:
    gen = torch.Generator().manual_seed(3)
    logits = (torch.randn(2, 5, 9, generator=gen, dtype=torch.float64) * 2).requires_grad_(True)
    weights = torch.randn(2, 5, generator=gen, dtype=torch.float64)
    ent = entropy_from_logits(logits, temperature=1.3, chunk_size=chunk_size)
    ref = _reference_entropy(logits, 1.3)
    torch.testing.assert_close(ent, ref, rtol=1e-12, atol=1e-12)
    assert (ent >= 0).all() and (ent <= math.log(9) + 1e-6).all()
    (grad,) = torch.autograd.grad((ent * weights).sum(), logits)
    (ref_grad,) = torch.autograd.grad((ref * weights).sum(), logits)
    torch.testing.assert_close(grad, ref_grad, rtol=1e-10, atol=1e-12)


def test_entropy_gradcheck_and_no_grad() -> None:
    logits = torch.randn(1, 3, 4, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x: entropy_from_logits(x, 1.0, 2), (logits,))
    with torch.no_grad():
        assert not entropy_from_logits(logits).requires_grad


def test_shape_validation() -> None:
    with pytest.raises(ValueError):
        token_logprobs(torch.zeros(2, 3, 4), torch.zeros(2, 4, dtype=torch.long))
    with pytest.raises(ValueError):
        entropy_from_logits(torch.zeros(3, 4))
    with pytest.raises(ValueError):
        token_logprobs(torch.zeros(1, 1, 4), torch.zeros(1, 1, dtype=torch.long), temperature=0.0)
