"""The shared-prefix training forward equals the plain full-sequence computation."""

from __future__ import annotations

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from skyrl_tool_agent.kernels.logprobs import entropy_from_logits, token_logprobs
from skyrl_tool_agent.policy.prefix import (common_prefix_length, plain_forward_logprobs, shared_prefix_logprobs,
                                            suffix_passes)


def _model() -> Qwen2ForCausalLM:
    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=256)
    return Qwen2ForCausalLM(cfg).eval()


def _rows() -> list[list[int]]:
    g = torch.Generator().manual_seed(1)
    prefix = torch.randint(3, 97, (30,), generator=g).tolist()
    return [prefix + torch.randint(3, 97, (n,), generator=g).tolist() for n in (5, 17, 11, 1)]


def test_common_prefix_length_keeps_one_own_token():
    assert common_prefix_length([[1, 2, 3], [1, 2, 4]]) == 2
    assert common_prefix_length([[1, 2, 3], [1, 2, 3]]) == 2
    assert common_prefix_length([[5, 2], [1, 2]]) == 0


def _right_padded(rows: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded ids (pad 0) and their attention mask."""
    ids = torch.zeros((len(rows), max(map(len, rows))), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = torch.tensor(r)
        mask[i, : len(r)] = 1
    return ids, mask


def test_shared_prefix_logprobs_and_grads_equal_plain_forward():
    model = _model()
    rows = _rows()
    ids, mask = _right_padded(rows)
    plain_logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1]
    plain = token_logprobs(plain_logits, ids[:, 1:])
    plain_h = entropy_from_logits(plain_logits)
    valid = mask[:, 1:].bool()
    (plain * valid).sum().backward()
    g_plain = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    shared, shared_h = shared_prefix_logprobs(model, ids, mask, 30, with_entropy=True)
    assert torch.allclose(shared[valid], plain[valid], atol=1e-5)
    assert torch.allclose(shared_h[valid], plain_h[valid], atol=1e-5)
    (shared * valid).sum().backward()
    for a, p in zip(g_plain, model.parameters()):
        assert torch.allclose(a, p.grad, atol=1e-4, rtol=1e-3)


def test_suffix_passes_split_one_long_row_off_and_cover_every_row_once():
    assert suffix_passes([100] * 7 + [1100]) == [[7], [0, 1, 2, 3, 4, 5, 6]]
    assert suffix_passes([30, 31, 29], pass_cost=64) == [[1, 0, 2]]  # similar lengths: one pass
    assert suffix_passes([30, 31, 29], pass_cost=0) == [[1], [0], [2]]
    lengths = [7, 70, 3, 66, 12, 5, 140, 9]
    passes = suffix_passes(lengths)
    assert sorted(r for p in passes for r in p) == list(range(len(lengths)))
    cost = sum(len(p) * max(lengths[r] for r in p) + 64 for p in passes)
    assert cost <= len(lengths) * 140 + 64 and len(passes) > 1


def test_suffixes_in_passes_equal_the_plain_forward_with_gradients():
    """One row runs far past the others (its own pass) and the rows come in no length order: each
    row's log-probs, entropies and every gradient equal the plain full-sequence forward's."""
    model = _model()
    g = torch.Generator().manual_seed(3)
    prefix = torch.randint(3, 97, (20,), generator=g).tolist()
    rows = [prefix + torch.randint(3, 97, (n,), generator=g).tolist() for n in (4, 150, 2, 6, 3, 140, 5)]
    lengths = [len(r) - 20 for r in rows]
    assert suffix_passes(lengths) == [[1, 5], [3, 6, 0, 4, 2]]  # two passes, rows out of order
    ids, mask = _right_padded(rows)
    valid = mask[:, 1:].bool()
    weights = torch.randn(valid.shape, generator=g)
    logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1]
    plain, plain_h = token_logprobs(logits, ids[:, 1:]), entropy_from_logits(logits)
    want = torch.autograd.grad(((weights * plain + plain_h) * valid).sum(), list(model.parameters()))
    shared, shared_h = shared_prefix_logprobs(model, ids, mask, 20, with_entropy=True)
    got = torch.autograd.grad(((weights * shared + shared_h) * valid).sum(), list(model.parameters()))
    assert torch.allclose(shared[valid], plain[valid], atol=1e-5)
    assert torch.allclose(shared_h[valid], plain_h[valid], atol=1e-5)
    assert not shared.detach()[~valid].any()  # past each row's end: 0
    for a, b in zip(got, want, strict=True):
        assert torch.allclose(a, b, atol=1e-5, rtol=1e-4)


def test_the_plain_forward_runs_the_head_in_chunks_inside_lm_head_with_its_gradients():
    """Full mode's forward (`plain_forward_logprobs`, what `DeepSpeedPolicy` runs through its ZeRO-3
    engine): the log-probs, entropies and every gradient (lm_head's included) are the whole-logits
    computation's (fp32, 1e-6), 0 outside the score mask, and they come out of lm_head's own forward
    (where ZeRO-3's hooks gather its weight, forward and backward) as [B, L-1, 2], never logits."""
    model = _model()
    g = torch.Generator().manual_seed(4)
    rows = [torch.randint(3, 97, (n,), generator=g).tolist() for n in (9, 23, 4)]
    ids, mask = _right_padded(rows)
    score = torch.rand(ids[:, 1:].shape, generator=g) < 0.7
    scored = mask[:, 1:].bool() & score
    weights = torch.randn(scored.shape, generator=g)
    logits = model(input_ids=ids, attention_mask=mask).logits[:, :-1]
    plain, plain_h = token_logprobs(logits, ids[:, 1:], 0.7), entropy_from_logits(logits, 0.7)
    want = torch.autograd.grad(((weights * plain + plain_h) * scored).sum(), list(model.parameters()))
    outputs = []
    model.lm_head.register_forward_hook(lambda module, args, out: outputs.append(out))
    logp, entropy = plain_forward_logprobs(model, ids, mask, temperature=0.7, with_entropy=True, score_mask=score)
    got = torch.autograd.grad(((weights * logp + entropy) * scored).sum(), list(model.parameters()))
    assert [tuple(o.shape) for o in outputs] == [(3, 22, 2)] and outputs[0].grad_fn is not None
    assert "forward" not in vars(model.lm_head)  # the module is as it was
    assert torch.allclose(logp[scored], plain[scored], atol=1e-6)
    assert torch.allclose(entropy[scored], plain_h[scored], atol=1e-6)
    assert not logp.detach()[~scored].any() and not entropy.detach()[~scored].any()
    for (name, _), a, b in zip(model.named_parameters(), got, want, strict=True):
        assert torch.allclose(a, b, atol=1e-6), name
    assert want[-1].abs().max() > 1e-3  # lm_head's gradient is there to compare
