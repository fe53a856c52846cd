"""GRPO loss math: KL estimators, clipped surrogate, aggregation modes, gradient accumulation.

Expected values are computed independently (plain python loops / `statistics` / `math`), never by
calling the function under test.
"""

from __future__ import annotations

import math
import statistics

import pytest
import torch

from skyrl_tool_agent.grpo.losses import (
    aggregate,
    clipped_policy_loss,
    grpo_loss,
    kl_estimate,
    loss_normalizer,
)


# ---------------------------------------------------------------- KL estimators


def test_kl_estimators_values() -> None:
    logp = torch.tensor([-1.0, -2.0, -0.5], dtype=torch.float64)
    ref = torch.tensor([-1.5, -1.0, -0.5], dtype=torch.float64)
    for est, fn in {
        "k1": lambda p, q: p - q,
        "k2": lambda p, q: 0.5 * (q - p) ** 2,
        "k3": lambda p, q: math.exp(q - p) - (q - p) - 1,
    }.items():
        expected = [fn(p, q) for p, q in zip(logp.tolist(), ref.tolist(), strict=True)]
        assert kl_estimate(logp, ref, est).tolist() == pytest.approx(expected)  # type: ignore[arg-type]
    assert kl_estimate(logp, logp, "k1").eq(0).all() and kl_estimate(logp, logp, "k3").eq(0).all()


def test_k3_nonnegative_and_clamped() -> None:
    gen = torch.Generator().manual_seed(1)
    logp, ref = torch.randn(1000, generator=gen) * 3, torch.randn(1000, generator=gen) * 3
    k3 = kl_estimate(logp, ref, "k3")
    assert (k3 >= 0).all() and (k3 <= 10.0).all()
    # k1 is unbiased but can go negative
    assert (kl_estimate(logp, ref, "k1") < 0).any()
    extreme = kl_estimate(torch.tensor([-200.0]), torch.tensor([0.0]), "k3")
    assert torch.isfinite(extreme).all()


# ---------------------------------------------------------------- clipped surrogate


def _clip_case():
    ratios = [0.5, 0.79, 0.81, 0.95, 1.0, 1.1, 1.25, 1.27, 1.29, 2.0]
    logp_vals = [math.log(r) for r in ratios] * 2
    adv_vals = [1.0] * len(ratios) + [-1.5] * len(ratios)
    logp = torch.tensor([logp_vals], dtype=torch.float64, requires_grad=True)
    old = torch.zeros_like(logp)
    adv = torch.tensor([adv_vals], dtype=torch.float64)
    return ratios * 2, logp, old, adv


def test_gradient_is_zero_exactly_where_clip_is_active() -> None:
    ratios, logp, old, adv = _clip_case()
    eps_low, eps_high = 0.2, 0.28
    mask = torch.ones_like(logp, dtype=torch.bool)
    per_token, stats = clipped_policy_loss(logp, old, adv, mask, eps_low=eps_low, eps_high=eps_high)
    per_token.sum().backward()
    grad = logp.grad[0].tolist()
    n_low = n_high = 0
    for r, a, g in zip(ratios, adv[0].tolist(), grad, strict=True):
        clipped_high = a > 0 and r > 1 + eps_high
        clipped_low = a < 0 and r < 1 - eps_low
        n_low += clipped_low
        n_high += clipped_high
        if clipped_high or clipped_low:
            assert g == 0.0, (r, a)
        else:  # d(-A * r)/d logp = -A * r
            assert g == pytest.approx(-a * r), (r, a)
    # asymmetric bounds: 1.27 < 1 + eps_high is not clipped for A > 0, 0.79 < 1 - eps_low is clipped for A < 0
    assert n_high == 2 and n_low == 2
    assert stats["clip_frac_high"] == pytest.approx(n_high / len(ratios))
    assert stats["clip_frac_low"] == pytest.approx(n_low / len(ratios))
    assert stats["clip_frac"] == pytest.approx((n_low + n_high) / len(ratios))
    assert stats["ratio_max"] == pytest.approx(2.0)
    assert stats["ratio_mean"] == pytest.approx(statistics.fmean(ratios))


def test_on_policy_loss_is_minus_mean_advantage() -> None:
    gen = torch.Generator().manual_seed(2)
    logp = -torch.rand(3, 6, generator=gen, dtype=torch.float64)
    adv = torch.randn(3, 6, generator=gen, dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 0, 0, 0], [0, 1, 1, 1, 1, 1], [1, 0, 0, 0, 0, 0]], dtype=torch.bool)
    loss, stats = grpo_loss(logp, logp.clone(), adv, mask, aggregation="token_mean")
    kept = [a for a, m in zip(adv.flatten().tolist(), mask.flatten().tolist(), strict=True) if m]
    assert loss.item() == pytest.approx(-statistics.fmean(kept))
    assert stats["ratio_mean"] == 1.0 and stats["clip_frac"] == 0.0 and stats["approx_kl"] == 0.0
    assert stats["num_tokens"] == len(kept)


def test_sequence_level_advantages_broadcast() -> None:
    logp = torch.full((2, 3), -1.0)
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    seq_loss, _ = grpo_loss(logp, logp, torch.tensor([1.0, -2.0]), mask)
    tok_loss, _ = grpo_loss(logp, logp, torch.tensor([[1.0] * 3, [-2.0] * 3]), mask)
    assert seq_loss.item() == pytest.approx(tok_loss.item()) == pytest.approx(-(2 * 1.0 - 3 * 2.0) / 5)


# ---------------------------------------------------------------- aggregation


def test_aggregation_modes_on_ragged_mask() -> None:
    x = torch.tensor([[1.0, 2.0, 3.0, 4.0], [10.0, 99.0, 99.0, 99.0], [7.0, 7.0, 7.0, 7.0]])
    mask = torch.tensor([[1, 1, 1, 1], [1, 0, 0, 0], [0, 0, 0, 0]])
    # token mean: (1+2+3+4+10) / 5 tokens
    assert aggregate(x, mask, "token_mean").item() == pytest.approx(4.0)
    # sequence mean: mean(2.5, 10) over the two sequences that have tokens (the empty row is not a sequence)
    assert aggregate(x, mask, "sequence_mean").item() == pytest.approx(6.25)
    # fixed length: 20 / (3 rows * 8)
    assert aggregate(x, mask, "fixed_length", fixed_length=8).item() == pytest.approx(20 / 24)
    assert loss_normalizer(mask, "token_mean") == 5
    assert loss_normalizer(mask, "sequence_mean") == 2
    assert loss_normalizer(mask, "fixed_length", 8) == 24
    with pytest.raises(ValueError):
        aggregate(x, mask, "fixed_length")
    with pytest.raises(ValueError):
        aggregate(x, mask, "sum")  # type: ignore[arg-type]


def _batch(seed: int, batch: int = 6, length: int = 9):
    gen = torch.Generator().manual_seed(seed)
    lengths = [9, 2, 5, 1, 7, 3][:batch]
    mask = torch.tensor([[int(t < n) for t in range(length)] for n in lengths], dtype=torch.bool)
    old = -torch.rand(batch, length, generator=gen, dtype=torch.float64) * 2
    logp = (old + 0.3 * torch.randn(batch, length, generator=gen, dtype=torch.float64)).requires_grad_(True)
    ref = old + 0.1 * torch.randn(batch, length, generator=gen, dtype=torch.float64)
    ent = torch.rand(batch, length, generator=gen, dtype=torch.float64).requires_grad_(True)
    adv = torch.randn(batch, generator=gen, dtype=torch.float64)
    return logp, old, ref, ent, adv, mask


@pytest.mark.parametrize("aggregation", ["token_mean", "sequence_mean", "fixed_length"])
def test_micro_batch_accumulation_equals_full_batch(aggregation: str) -> None:
    logp, old, ref, ent, adv, mask = _batch(3)
    kwargs = dict(ref_logp=ref, kl_coef=0.05, entropy_coef=0.01, aggregation=aggregation, fixed_length=12)
    full, _ = grpo_loss(logp, old, adv, mask, entropy=ent, **kwargs)
    g_full, ge_full = torch.autograd.grad(full, [logp, ent])

    norm = loss_normalizer(mask, aggregation, 12)  # type: ignore[arg-type]
    parts, naive_parts = [], []
    for sl in (slice(0, 2), slice(2, 5), slice(5, 6)):
        sub = dict(kwargs, ref_logp=ref[sl])
        part, _ = grpo_loss(logp[sl], old[sl], adv[sl], mask[sl], entropy=ent[sl], normalizer=norm, **sub)
        naive, _ = grpo_loss(logp[sl], old[sl], adv[sl], mask[sl], entropy=ent[sl], **sub)
        parts.append(part)
        naive_parts.append(naive / 3)  # what "average the micro-batch losses" would do
    accumulated = torch.stack(parts).sum()
    g_acc, ge_acc = torch.autograd.grad(accumulated, [logp, ent])
    assert accumulated.item() == pytest.approx(full.item(), rel=1e-12)
    torch.testing.assert_close(g_acc, g_full)
    torch.testing.assert_close(ge_acc, ge_full)
    if aggregation != "fixed_length":  # with ragged micro-batches, naive averaging is wrong
        assert torch.stack(naive_parts).sum().item() != pytest.approx(full.item(), rel=1e-6)


def test_masked_tokens_get_no_gradient_even_if_non_finite() -> None:
    logp, old, ref, ent, adv, mask = _batch(4)
    with torch.no_grad():
        old[~mask] = -math.inf
        ref[~mask] = math.nan
    for aggregation in ("token_mean", "sequence_mean", "fixed_length"):
        loss, stats = grpo_loss(
            logp,
            old,
            adv,
            mask,
            ref_logp=ref,
            kl_coef=0.1,
            entropy=ent,
            entropy_coef=0.01,
            aggregation=aggregation,
            fixed_length=9,
        )
        g_logp, g_ent = torch.autograd.grad(loss, [logp, ent])
        assert torch.isfinite(loss) and all(math.isfinite(v) for v in stats.values())
        assert g_logp[~mask].eq(0).all() and g_ent[~mask].eq(0).all()
        assert g_logp[mask].ne(0).all()


def test_grpo_loss_composition_and_stats() -> None:
    logp, old, ref, ent, adv, mask = _batch(5)
    base, stats = grpo_loss(logp, old, adv, mask)
    assert "kl" not in stats and "entropy" not in stats
    with_ref, stats_ref = grpo_loss(logp, old, adv, mask, ref_logp=ref)  # kl_coef 0: reported, not added
    assert with_ref.item() == pytest.approx(base.item())
    assert stats_ref["kl"] > 0
    # on-policy (ratio 1), token_mean: loss = -mean(A) + c_kl * mean(k3) - c_ent * mean(H), written out
    lp, rf, en = logp.detach(), ref, ent.detach()
    tok = [(b, t) for b in range(mask.shape[0]) for t in range(mask.shape[1]) if mask[b, t]]
    mean_a = statistics.fmean(adv[b].item() for b, _ in tok)
    mean_k3 = statistics.fmean(
        math.exp(rf[b, t].item() - lp[b, t].item()) - (rf[b, t].item() - lp[b, t].item()) - 1 for b, t in tok
    )
    mean_h = statistics.fmean(en[b, t].item() for b, t in tok)
    loss, stats = grpo_loss(lp, lp, adv, mask, ref_logp=rf, kl_coef=0.2, entropy=en, entropy_coef=0.03)
    assert loss.item() == pytest.approx(-mean_a + 0.2 * mean_k3 - 0.03 * mean_h)
    assert stats["loss"] == pytest.approx(loss.item())
    assert stats["pg_loss"] == pytest.approx(-mean_a)
    assert stats["kl"] == pytest.approx(mean_k3) and stats["entropy"] == pytest.approx(mean_h)
    with pytest.raises(ValueError):
        grpo_loss(logp, old, adv, mask, kl_coef=0.1)
    with pytest.raises(ValueError):
        grpo_loss(logp, old, adv, mask, entropy_coef=0.1)
