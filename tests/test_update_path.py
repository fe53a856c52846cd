"""The update's forward at the hardware's pace, checked against the plain full-logits computation:
log-probs and entropies taken from hidden states in chunks (`head_token_stats`: no `[B, L, V]`
logits), micro-batches sized by a token budget, the reference scored once per step, and the LoRA
matmuls of a bf16 model kept in bf16 (`QwenPolicy.training_precision`). Everything in fp32 must
equal the plain path within 1e-5: loss, KL, entropy and every gradient."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from skyrl_tool_agent.config import Config
from skyrl_tool_agent.grpo.batch import TrainBatch, plan_micro_batches
from skyrl_tool_agent.grpo.losses import grpo_loss, loss_normalizer
from skyrl_tool_agent.grpo.trainer import GRPOTrainer
from skyrl_tool_agent.policy.checkpointing import recompute_activations
from skyrl_tool_agent.kernels.fused_lora import LoraLinearFunction, fused_lora
from skyrl_tool_agent.kernels.logprobs import entropy_from_logits, head_token_stats, token_logprobs
from skyrl_tool_agent.policy.prefix import batch_logprobs
from skyrl_tool_agent.policy.qwen import QwenPolicy
from tests.fixtures.tiny_policy import sql_token_model_dir


# ------------------------------------------------------------------ head_token_stats
@pytest.mark.parametrize("chunk", [1, 4, 7, 37, 64])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_head_token_stats_equal_the_logits_path_with_gradients(chunk: int, dtype: torch.dtype) -> None:
    """Chunk sizes that do and do not divide the 37 tokens: an off-by-one at a chunk boundary
    changes some token's value or gradient."""
    g = torch.Generator().manual_seed(0)
    # logits of a trained LM's size (a few units): float32 rounding then stays far below 1e-5
    hidden = (0.5 * torch.randn(37, 16, generator=g, dtype=dtype)).requires_grad_()
    weight = (0.5 * torch.randn(50, 16, generator=g, dtype=dtype)).requires_grad_()
    labels = torch.randint(0, 50, (37,), generator=g)
    labels[[3, 20]] = -100  # ignored: 0.0, no gradient
    a, b = torch.randn(37, generator=g, dtype=dtype), torch.randn(37, generator=g, dtype=dtype)

    logits = (hidden @ weight.T).unsqueeze(0)
    want_lp = token_logprobs(logits, labels.unsqueeze(0), 0.7)[0]
    want_h = entropy_from_logits(logits, 0.7)[0]
    want_grads = torch.autograd.grad((a * want_lp + b * want_h).sum(), (hidden, weight))

    logp, entropy = head_token_stats(hidden, weight, labels, 0.7, with_entropy=True, chunk_tokens=chunk)
    grads = torch.autograd.grad((a * logp + b * entropy).sum(), (hidden, weight))
    tol = 1e-10 if dtype == torch.float64 else 1e-5
    assert torch.allclose(logp, want_lp, atol=tol) and float(logp[3].detach()) == 0.0
    assert torch.allclose(entropy, want_h, atol=tol)
    for got, want in zip(grads, want_grads, strict=True):
        assert torch.allclose(got, want, atol=tol * 10)


def test_head_token_stats_without_entropy_gradient() -> None:
    """The log-prob's gradient alone (the entropy only logged) equals the logits path's."""
    g = torch.Generator().manual_seed(1)
    hidden = torch.randn(9, 8, generator=g, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(20, 8, generator=g, dtype=torch.float64)
    labels = torch.randint(0, 20, (9,), generator=g)
    logp, entropy = head_token_stats(hidden, weight, labels, with_entropy=True, chunk_tokens=2)
    (grad,) = torch.autograd.grad(logp.sum() + 0 * entropy.detach().sum(), (hidden,))
    want = token_logprobs((hidden @ weight.T).unsqueeze(0), labels.unsqueeze(0))[0]
    (want_grad,) = torch.autograd.grad(want.sum(), (hidden,))
    assert torch.allclose(grad, want_grad, atol=1e-10)


# ------------------------------------------------------------------ the model's forward
@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.manual_seed(0)
    return sql_token_model_dir(tmp_path_factory.mktemp("update_path") / "model", layers=2)


def _config(model_dir: Path, **training: Any) -> Config:
    return Config.model_validate({
        "model": {"name_or_path": str(model_dir), "device": "cpu", "gradient_checkpointing": True,
                  "lora": {"r": 4, "alpha": 8.0, "dropout": 0.0}},
        "training": {"mode": "lora", "micro_batch_size": 3, "learning_rate": 1e-2, "wandb": {"mode": "disabled"},
                     **training},
        "grpo": {"kl_coef": 0.05, "entropy_coef": 0.01},
    })


def _lora_policy(model_dir: Path) -> QwenPolicy:
    torch.manual_seed(0)  # the same adapters (peft draws lora_A) whichever tests ran before
    policy = QwenPolicy.from_config(_config(model_dir).model, mode="lora")
    with torch.no_grad():  # adapters away from zero, so the policy differs from the reference
        for name, p in policy.model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn_like(p) * 0.3)
    return policy


LENGTHS = [40, 23, 31, 12, 40, 18, 27]
PREFIX = 10


def _batch(policy: QwenPolicy, shared_prefix: bool = True) -> TrainBatch:
    """Rows of unequal lengths (right-padded), sharing a 10-id prefix, with sampled-token masks and
    old log-probs a little off the policy (ratios != 1)."""
    g = torch.Generator().manual_seed(2)
    width = max(LENGTHS)
    ids = torch.randint(5, policy.model.config.vocab_size, (len(LENGTHS), width), generator=g)
    if shared_prefix:
        ids[:, :PREFIX] = ids[0, :PREFIX]
    attention = torch.zeros_like(ids)
    loss_mask = torch.zeros((len(LENGTHS), width - 1), dtype=torch.bool)
    for row, n in enumerate(LENGTHS):
        attention[row, :n] = 1
        loss_mask[row, PREFIX: n - 1] = True
    with torch.no_grad():
        old, _ = batch_logprobs(policy.model, ids, attention)
    old = (old + 0.05 * torch.randn(old.shape, generator=g)) * loss_mask
    adv = torch.randn(len(LENGTHS), 1, generator=g) * loss_mask
    return TrainBatch(ids, attention, loss_mask, old, adv)


def _plain_logits_stats(model: torch.nn.Module, batch: TrainBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """Today's path before this change: the whole `[B, L, V]` logits, then log-probs and entropy."""
    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, use_cache=False).logits[:, :-1]
    return token_logprobs(logits, batch.input_ids[:, 1:]), entropy_from_logits(logits)


@pytest.mark.parametrize("recompute", [False, True], ids=["shared_prefix", "checkpointed"])
def test_batch_logprobs_never_build_the_logits_and_equal_them(model_dir: Path, recompute: bool) -> None:
    policy = _lora_policy(model_dir)
    batch = _batch(policy)
    mask = batch.attention_mask[:, 1:].bool()
    weights = [torch.randn(batch.loss_mask.shape, generator=torch.Generator().manual_seed(s)) for s in (3, 4)]
    params = policy.trainable_parameters()
    with recompute_activations(policy.model, recompute):
        want_lp, want_h = _plain_logits_stats(policy.model, batch)
        want = torch.autograd.grad(((weights[0] * want_lp + weights[1] * want_h) * mask).sum(), params)
        head_widths = []  # lm_head's module may run (full mode's ZeRO-3 gathers need it), but chunked
        hook = policy.model.get_base_model().lm_head.register_forward_hook(
            lambda module, args, out: head_widths.append(out.shape[-1]))
        logp, entropy = policy.token_logprobs(batch.input_ids, batch.attention_mask, with_entropy=True)
        got = torch.autograd.grad(((weights[0] * logp + weights[1] * entropy) * mask).sum(), params)
        hook.remove()
    assert all(width <= 2 for width in head_widths), "the output projection built the full logits"
    assert torch.allclose(logp[mask], want_lp[mask], atol=1e-5)
    assert torch.allclose(entropy[mask], want_h[mask], atol=1e-5)
    for a, b in zip(got, want, strict=True):
        assert torch.allclose(a, b, atol=1e-5, rtol=1e-4)


# ------------------------------------------------------------------ micro-batches by tokens
def test_plan_micro_batches_fills_a_token_budget_with_similar_lengths() -> None:
    lengths = [40, 23, 31, 12, 40, 18, 27, 5]
    plan = plan_micro_batches(lengths, max_rows=3, max_tokens=80)
    assert sorted(r for mb in plan for r in mb) == list(range(len(lengths)))
    for mb in plan:
        assert len(mb) <= 3 and (len(mb) == 1 or len(mb) * max(lengths[r] for r in mb) <= 80)
    assert plan == [[0, 4], [2, 6], [1, 5, 3], [7]]
    assert plan_micro_batches(lengths, max_rows=3) == [[0, 1, 2], [3, 4, 5], [6, 7]]
    assert plan_micro_batches([50, 10], max_rows=4, max_tokens=20) == [[0], [1]]  # too long: alone


class _GradientsKept(GRPOTrainer):
    """The real trainer; the gradient of each optimizer step is copied before the step consumes it."""

    def _optimizer_step(self) -> float | None:
        self.grads = [p.grad.detach().clone() for p in self.policy.trainable_parameters()]
        return super()._optimizer_step()


@pytest.mark.parametrize("entropy_coef", [0.01, 0.0], ids=["entropy_bonus", "entropy_logged"])
@pytest.mark.parametrize("budget", [None, 70], ids=["rows", "token_budget"])
def test_update_equals_the_plain_full_batch_objective(model_dir: Path, tmp_path: Path, budget: int | None,
                                                      entropy_coef: float) -> None:
    """One optimizer step over micro-batches (in rollout order, or grouped by a token budget) with
    the reference scored once beforehand: its loss, KL, entropy and gradient equal the plain
    objective over the whole batch at once, from the full logits (today's path). With the entropy
    only logged (the CPU default) its gradient terms are skipped, not computed."""
    config = _config(model_dir, micro_batch_tokens=budget)
    config.grpo.entropy_coef = entropy_coef
    policy = _lora_policy(model_dir)
    batch = _batch(policy)
    want, want_grads = _plain_objective(policy, batch, config, recompute=True)
    trainer = _GradientsKept(config, policy, None, None, [], output_dir=tmp_path)  # type: ignore[arg-type]
    stats = trainer._update(batch)
    for key in ("loss", "kl", "entropy", "clip_frac", "ratio_mean"):
        assert stats[key] == pytest.approx(want[key], abs=1e-5), key
    for got, exp in zip(trainer.grads, want_grads, strict=True):
        assert torch.allclose(got, exp, atol=1e-5, rtol=1e-4)


def _plain_objective(policy: QwenPolicy, batch: TrainBatch, config, *, recompute: bool) -> tuple[dict, tuple]:
    """The GRPO loss's statistics and gradients over the whole batch at once, from the full logits
    (the reference scored with the adapters off): what every update path must equal."""
    g, model = config.grpo, policy.model
    with recompute_activations(model, recompute):
        with torch.no_grad(), model.disable_adapter():
            ref, _ = _plain_logits_stats(model, batch)
        logp, entropy = _plain_logits_stats(model, batch)
        norm = loss_normalizer(batch.loss_mask, g.loss_aggregation)
        want_loss, want = grpo_loss(logp, batch.old_logp, batch.advantages, batch.loss_mask, ref_logp=ref,
                                    kl_coef=g.kl_coef, entropy=entropy, entropy_coef=g.entropy_coef,
                                    eps_low=g.clip_eps_low, eps_high=g.clip_eps_high, normalizer=norm)
        return want, torch.autograd.grad(want_loss, policy.trainable_parameters())


def _batch_with_copies(policy: QwenPolicy) -> TrainBatch:
    """`_batch` whose rows 4 and 6 are episodes sampled twice (rows 0 and 2 again, as a confident
    policy's group does), each copy with its own old log-probs and advantage; row 5 the first
    tokens of row 1 (a prefix of another row, not a copy)."""
    batch = _batch(policy)
    for copy, row in ((4, 0), (6, 2)):
        for field in (batch.input_ids, batch.attention_mask, batch.loss_mask):
            field[copy] = field[row]
    batch.input_ids[5, :LENGTHS[5]] = batch.input_ids[1, :LENGTHS[5]]
    return batch


@pytest.mark.parametrize("recompute", [False, True], ids=["shared_prefix", "checkpointed"])
def test_identical_episodes_are_scored_once_and_the_update_is_unchanged(model_dir: Path, tmp_path: Path,
                                                                         recompute: bool) -> None:
    """Rows that are the same episode run through the model once (the forwards see fewer rows),
    and the step's loss, KL, entropy and gradient still equal the plain objective over every row
    from the full logits, within 1e-5 in fp32."""
    config = _config(model_dir, micro_batch_size=len(LENGTHS))
    config.model.gradient_checkpointing = recompute
    policy = _lora_policy(model_dir)
    batch = _batch_with_copies(policy)
    want, want_grads = _plain_objective(policy, batch, config, recompute=recompute)
    rows_seen: list[int] = []
    hook = policy.model.get_base_model().model.register_forward_pre_hook(
        lambda _m, _a, kwargs: rows_seen.append(kwargs["input_ids"].shape[0]), with_kwargs=True)
    trainer = _GradientsKept(config, policy, None, None, [], output_dir=tmp_path)  # type: ignore[arg-type]
    stats = trainer._update(batch)
    hook.remove()
    assert rows_seen and max(rows_seen) == len(LENGTHS) - 2  # rows 4 and 6 never ran
    for key in ("loss", "kl", "entropy", "clip_frac", "ratio_mean"):
        assert stats[key] == pytest.approx(want[key], abs=1e-5), key
    for got, exp in zip(trainer.grads, want_grads, strict=True):
        assert torch.allclose(got, exp, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("recompute", [False, True], ids=["shared_prefix", "checkpointed"])
def test_a_score_mask_scores_its_positions_only(model_dir: Path, recompute: bool) -> None:
    """With `score_mask` (the update passes its loss mask) the scored positions equal the full
    logits' log-probs and entropies, with gradients, and every other position is 0: the prompt's positions, the
    copies' (a copy scored where it alone needs it) and those past each row's end."""
    policy = _lora_policy(model_dir)
    batch = _batch_with_copies(policy).slice([0, 1, 2, 4, 5, 6])  # rows 3 and 5 copy rows 0 and 2
    batch.input_ids[:, :17] = batch.input_ids[0, :17]  # 17 shared ids: the shared-prefix path
    score = batch.loss_mask.clone()
    score[3] = False  # row 3, a copy of row 0: nothing wanted of it
    score[0, :PREFIX + 3] = False
    score[3, PREFIX + 1] = True  # ... but one prefix position row 0 does not want
    score[2, 20] = False  # a hole
    weights = torch.randn(score.shape, generator=torch.Generator().manual_seed(6))
    params = policy.trainable_parameters()
    passes: list[int] = []
    hook = policy.model.get_base_model().model.register_forward_pre_hook(lambda *a: passes.append(1))
    with recompute_activations(policy.model, recompute):
        want_lp, want_h = _plain_logits_stats(policy.model, batch)
        want = torch.autograd.grad(((weights * want_lp + want_h) * score).sum(), params)
        passes.clear()
        logp, entropy = policy.token_logprobs(batch.input_ids, batch.attention_mask, with_entropy=True,
                                              score_mask=score)
        got = torch.autograd.grad(((weights * logp + entropy) * score).sum(), params)
    hook.remove()
    assert (len(passes) > 1) == (not recompute)  # the shared prefix's path (prefix, then suffix passes)
    assert torch.allclose(logp[score], want_lp[score], atol=1e-5)
    assert torch.allclose(entropy[score], want_h[score], atol=1e-5)
    assert not logp.detach()[~score].any() and not entropy.detach()[~score].any()
    for a, b in zip(got, want, strict=True):
        assert torch.allclose(a, b, atol=1e-5, rtol=1e-4)
    distinct = [0, 1, 2, 4]  # no copies: row 0's unwanted prefix positions still 0
    logp, _ = policy.token_logprobs(batch.input_ids[distinct], batch.attention_mask[distinct],
                                    score_mask=score[distinct])
    assert torch.allclose(logp[score[distinct]], want_lp[distinct][score[distinct]], atol=1e-5)
    assert not logp.detach()[~score[distinct]].any()


# ------------------------------------------------------------------ bf16 adapters
def test_a_bf16_models_adapters_multiply_in_bf16_and_keep_fp32_gradients(model_dir: Path) -> None:
    """peft keeps the adapters in float32 and casts every activation to float32 around them; under
    `training_precision` the adapter matmuls take the bf16 activations as they are, and the float32
    adapters still get float32 gradients close to the cast path's."""
    config = _config(model_dir).model.model_copy(update={"dtype": "bfloat16"})
    policy = QwenPolicy.from_config(config, mode="lora")
    batch = _batch(policy, shared_prefix=False)
    params = policy.trainable_parameters()
    assert {p.dtype for p in params} == {torch.float32}
    seen: list[torch.dtype] = []
    hooks = [m.register_forward_pre_hook(lambda _m, args: seen.append(args[0].dtype))
             for n, m in policy.model.named_modules() if n.endswith("lora_A.default")]

    def grads() -> list[torch.Tensor]:
        logp, _ = policy.token_logprobs(batch.input_ids, batch.attention_mask)
        return list(torch.autograd.grad((logp * batch.loss_mask).sum(), params, allow_unused=True))

    cast_path = grads()
    assert set(seen) == {torch.float32}  # peft's cast: what the update did before
    seen.clear()
    with policy.training_precision():
        fast = grads()
    for h in hooks:
        h.remove()
    assert seen and set(seen) == {torch.bfloat16}
    for a, b in zip(fast, cast_path, strict=True):
        if b is not None:
            assert a.dtype == torch.float32
            assert torch.allclose(a, b, atol=5e-2 * float(b.abs().max()) + 1e-6)


# ------------------------------------------------------------------ fused LoRA projections
def test_lora_linear_function_gradients_are_exact() -> None:
    """`x @ (W + s B A)^T + b` against autograd's numerical gradient, in float64: x, A and B get
    theirs, the frozen base weight none."""
    g = torch.Generator().manual_seed(5)
    x = torch.randn(2, 3, 6, generator=g, dtype=torch.float64, requires_grad=True)
    weight, bias = torch.randn(5, 6, generator=g, dtype=torch.float64), torch.randn(5, generator=g, dtype=torch.float64)
    lora_a = torch.randn(2, 6, generator=g, dtype=torch.float64, requires_grad=True)
    lora_b = torch.randn(5, 2, generator=g, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x, a, b: LoraLinearFunction.apply(x, weight, bias, a, b, 1.7),
                                    (x, lora_a, lora_b))
    want = x @ weight.T + bias + 1.7 * (x @ lora_a.T) @ lora_b.T
    assert torch.allclose(LoraLinearFunction.apply(x, weight, bias, lora_a, lora_b, 1.7), want, atol=1e-12)


def test_fused_lora_equals_pefts_projections_with_gradients(model_dir: Path) -> None:
    """The update's forward and backward with every adapted projection as one matmul: log-probs,
    entropies and every adapter gradient equal peft's five-op path within 1e-5 in float32, and
    peft's skinny adapter matmuls never run (the fused path really was taken)."""
    policy = _lora_policy(model_dir)
    batch = _batch(policy)
    mask = batch.attention_mask[:, 1:].bool()
    weights = [torch.randn(batch.loss_mask.shape, generator=torch.Generator().manual_seed(s)) for s in (3, 4)]
    params = policy.trainable_parameters()
    adapted = [m for m in policy.model.modules() if hasattr(m, "lora_A") and hasattr(m, "base_layer")]

    def stats() -> tuple[torch.Tensor, torch.Tensor, tuple[torch.Tensor, ...]]:
        logp, entropy = policy.token_logprobs(batch.input_ids, batch.attention_mask, with_entropy=True)
        return logp, entropy, torch.autograd.grad(((weights[0] * logp + weights[1] * entropy) * mask).sum(), params)

    want_lp, want_h, want = stats()
    calls: list[int] = []
    hooks = [m.lora_A["default"].register_forward_hook(lambda *a: calls.append(1)) for m in adapted]
    with fused_lora(policy.model) as switched:
        logp, entropy, got = stats()
    for h in hooks:
        h.remove()
    assert switched == len(adapted) > 0 and not calls
    assert all("forward" not in vars(m) for m in adapted)  # peft's forward back on exit
    assert torch.allclose(logp[mask], want_lp[mask], atol=1e-5)
    assert torch.allclose(entropy[mask], want_h[mask], atol=1e-5)
    for a, b in zip(got, want, strict=True):
        assert torch.allclose(a, b, atol=1e-5, rtol=1e-4)


def test_fused_lora_keeps_pefts_forward_where_merging_would_change_it(model_dir: Path) -> None:
    """Dropout on, the adapters disabled (the reference) or a bf16 base: nothing is switched or the
    switched forward hands back to peft's, and the outputs are peft's exactly."""
    policy = _lora_policy(model_dir)
    batch = _batch(policy)
    model = policy.model
    with torch.no_grad(), model.disable_adapter():
        want, _ = batch_logprobs(model, batch.input_ids, batch.attention_mask)
        with fused_lora(model):
            got, _ = batch_logprobs(model, batch.input_ids, batch.attention_mask)
    assert torch.equal(got, want)
    adapted = [m for m in model.modules() if hasattr(m, "lora_A") and hasattr(m, "base_layer")]
    adapted[0].lora_dropout["default"] = torch.nn.Dropout(0.5)  # a live dropout: merging would drop it
    model.train()
    with fused_lora(model) as switched:
        assert switched == len(adapted) - 1
    model.eval()
    with fused_lora(model) as switched:  # dropout in eval mode is the identity: merged
        assert switched == len(adapted)
    bf16 = QwenPolicy.from_config(_config(model_dir).model.model_copy(update={"dtype": "bfloat16"}), mode="lora")
    with fused_lora(bf16.model) as switched:
        assert switched == 0
