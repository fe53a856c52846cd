"""The shared-prefix training forward equals the plain full-sequence computation."""

from __future__ import annotations

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from skyrl_tool_agent.kernels.logprobs import entropy_from_logits, token_logprobs
from skyrl_tool_agent.policy.prefix import common_prefix_length, shared_prefix_logprobs


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


def test_shared_prefix_logprobs_and_grads_equal_plain_forward():
    model = _model()
    rows = _rows()
    width = max(map(len, rows))
    ids = torch.zeros((len(rows), width), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = torch.tensor(r)
        mask[i, : len(r)] = 1
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
