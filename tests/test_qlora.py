"""QLoRA (bitsandbytes NF4 base + LoRA adapters) on CPU: loading, sampling, then training.

bitsandbytes repacks 4-bit weights for its AVX512-BF16 CPU inference kernel the first time a
layer runs in eval mode without gradients (the reference and old log-prob passes), and that layout has
no backward. The loader
switches the repacking off (`pin_4bit_training_layout`); the policy refuses to train through a
packed layer with a message naming the cause (`check_4bit_training_layout`). Both are tested.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

bnb = pytest.importorskip("bitsandbytes")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    from skyrl_tool_agent.env.chat_format import format_answer, format_tool_call, render_conversation
    from skyrl_tool_agent.policy.embedded import new_tiny_qwen2, train_tokenizer
    from tests.fixtures.tiny_db import SHOP_TASKS

    corpus = [render_conversation([{"role": "user", "content": t.question},
                                   {"role": "assistant", "content": format_tool_call("list_tables", {"db_id": t.db_id})},
                                   {"role": "assistant", "content": format_answer(t.gold_sql)}]) for t in SHOP_TASKS]
    tokenizer = train_tokenizer(corpus * 10, 400)
    model = new_tiny_qwen2(tokenizer, hidden_size=64, layers=2, heads=2, kv_heads=1, intermediate_size=128)
    out = tmp_path_factory.mktemp("qlora") / "model"
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def _config(model_dir: Path):
    from skyrl_tool_agent.config import Config

    return Config.model_validate({
        "model": {"name_or_path": str(model_dir), "device": "cpu", "lora": {"r": 4, "alpha": 8, "dropout": 0.0},
                  "quantization": {"load_in_4bit": True, "quant_type": "nf4", "compute_dtype": "bfloat16"}},
        "training": {"mode": "lora", "micro_batch_size": 2, "learning_rate": 1e-2, "wandb": {"mode": "disabled"}},
        "grpo": {"kl_coef": 0.05},
    })


def _policy(model_dir: Path):
    from skyrl_tool_agent.policy.qwen import QwenPolicy

    return QwenPolicy.from_config(_config(model_dir).model, mode="lora")


def _four_bit_layers(policy) -> list:
    return [m for m in policy.model.modules() if isinstance(m, bnb.nn.Linear4bit)]


def _batch(policy):
    from skyrl_tool_agent.grpo.batch import TrainBatch

    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(5, policy.model.config.vocab_size, (3, 24), generator=gen)
    attention = torch.ones_like(ids)
    attention[2, 18:] = 0
    loss_mask = torch.zeros((3, 23), dtype=torch.bool)
    loss_mask[:, 10:17] = True
    with torch.no_grad():
        old, _ = policy.token_logprobs(ids, attention)
    adv = torch.tensor([1.0, -1.0, 0.5]).unsqueeze(1) * loss_mask
    return TrainBatch(ids, attention, loss_mask, old * loss_mask, adv)


def _sample(policy) -> None:
    """The rollout engine: prompts sharing a prefix (its root) and not."""
    from skyrl_tool_agent.policy.sampling_params import SamplingParams

    prefix = list(range(5, 25))
    out = policy.generate([prefix + [30, 31], prefix + [40]], SamplingParams(), max_new_tokens=6)
    out += policy.generate([[7, 8, 9], [10, 11]], SamplingParams(), max_new_tokens=6)
    assert len(out) == 4 and all(g.token_ids for g in out)


def _lora_grads(policy, batch) -> dict[str, torch.Tensor]:
    policy.model.zero_grad(set_to_none=True)
    logp, _ = policy.token_logprobs(batch.input_ids, batch.attention_mask)
    (logp * batch.loss_mask).sum().backward()
    return {n: p.grad.clone() for n, p in policy.model.named_parameters() if p.requires_grad}


def test_qlora_loads_4bit_base_with_trainable_adapters(model_dir):
    policy = _policy(model_dir)
    layers = _four_bit_layers(policy)
    assert len(layers) == 2 * 7  # q k v o gate up down per layer
    assert all(not layer.support_avx512bf16_for_cpu for layer in layers)  # repacking switched off
    trainable = [n for n, p in policy.model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    assert policy.is_4bit


@pytest.mark.parametrize(("dtype", "rest"), [("bfloat16", torch.bfloat16), ("float16", torch.float32)])
def test_qlora_keeps_a_bf16_models_other_parameters_bf16(model_dir, dtype, rest):
    """peft's k-bit preparation upcasts what is not 4-bit to float32; a bf16 model's embedding, norms
    and head are put back to bf16 (half the bytes, and a bf16 residual stream: what the memory plan
    counts), an fp16 model keeps the upcast (fp16 needs its range). Adapters stay float32."""
    from skyrl_tool_agent.config import ModelConfig
    from skyrl_tool_agent.policy.qwen import QwenPolicy

    settings = _config(model_dir).model.model_dump()
    policy = QwenPolicy.from_config(ModelConfig(**{**settings, "dtype": dtype}), mode="lora")
    params = dict(policy.model.named_parameters())
    others = {n: p.dtype for n, p in params.items() if not p.requires_grad and type(p).__name__ != "Params4bit"}
    assert any("embed_tokens" in n for n in others) and any("norm" in n for n in others), sorted(others)
    assert set(others.values()) == {rest}, others
    assert {p.dtype for p in params.values() if p.requires_grad} == {torch.float32}
    seen: list[torch.dtype] = []
    layer = next(m for n, m in policy.model.named_modules() if n.endswith("layers.1"))
    handle = layer.register_forward_pre_hook(lambda _m, args: seen.append(args[0].dtype))
    try:
        batch = _batch(policy)
        _lora_grads(policy, batch)
    finally:
        handle.remove()
    assert seen and set(seen) == {rest}  # the residual stream the update keeps, one per layer


def test_qlora_trains_after_sampling_with_the_same_gradients_as_before(model_dir):
    """Gradients through the 4-bit base are identical before and after sampling (no repacking),
    and a GRPO update (with the adapter-disabled reference for KL) moves only the adapters."""
    from skyrl_tool_agent.grpo.trainer import GRPOTrainer

    policy = _policy(model_dir)
    batch = _batch(policy)
    before = _lora_grads(policy, batch)
    _sample(policy)
    assert not any(getattr(layer.weight.quant_state, "packing_format_for_cpu", False) for layer in _four_bit_layers(policy))
    after = _lora_grads(policy, batch)
    assert before.keys() == after.keys()
    for name in before:
        torch.testing.assert_close(after[name], before[name], rtol=0, atol=0, msg=name)
    # gradient reaches the adapters of the first layer, i.e. flows back through every 4-bit matmul
    first_b = [g for n, g in after.items() if "layers.0." in n and "lora_B" in n]
    assert first_b and all(float(g.abs().sum()) > 0 for g in first_b)

    base = {n: p.detach().clone() for n, p in policy.model.named_parameters() if not p.requires_grad}
    adapters = {n: p.detach().clone() for n, p in policy.model.named_parameters() if p.requires_grad}
    config = _config(model_dir)
    trainer = GRPOTrainer(config, policy, None, None, [], output_dir=model_dir.parent / "run")
    stats = trainer._update(batch)
    assert stats["grad_norm"] > 0 and "kl" in stats
    for n, p in policy.model.named_parameters():
        if p.requires_grad:
            assert "lora_B" not in n or not torch.equal(p, adapters[n]), n
        else:
            assert torch.equal(p, base[n]), n
    _sample(policy)  # and sampling still works after the update


def _cpu_repacks() -> bool:
    has = getattr(bnb.functional, "has_avx512bf16", None)
    return bool(has and has())


@pytest.mark.skipif(not _cpu_repacks(), reason="bitsandbytes repacks only on CPUs with AVX512-BF16")
def test_repacked_4bit_layout_fails_training_with_a_clear_message(model_dir):
    """If bitsandbytes repacks anyway (e.g. a version ignoring the switch), training refuses
    with a message naming the cause instead of failing in a kernel or dropping gradients."""
    policy = _policy(model_dir)
    for layer in _four_bit_layers(policy):
        layer.support_avx512bf16_for_cpu = True  # what bitsandbytes does without the loader's switch
    ids = torch.randint(5, policy.model.config.vocab_size, (2, 12))
    with torch.no_grad():  # a forward without gradients (the reference's, the old log-probs') repacks
        policy.token_logprobs(ids, torch.ones_like(ids))
    assert any(getattr(layer.weight.quant_state, "packing_format_for_cpu", False) for layer in _four_bit_layers(policy))
    with pytest.raises(RuntimeError, match="repacked by bitsandbytes for CPU inference"):
        policy.token_logprobs(ids, torch.ones_like(ids))
    with torch.no_grad():  # inference through the packed layout is still fine
        logp, _ = policy.token_logprobs(ids, torch.ones_like(ids))
    assert torch.isfinite(logp).all()


@pytest.mark.parametrize("through_modules", [False, True])
def test_qlora_samples_through_the_engine_what_the_4bit_model_says(model_dir, through_modules, caplog):
    """The rollout engine samples a QLoRA policy from its 4-bit weights dequantized once with the
    adapters folded in, or (where that copy does not fit) through bitsandbytes' 4-bit matmul and
    the adapters (compute in float32 here): greedy tokens are the 4-bit model's own argmax chain
    and sampled log-probs its teacher-forced ones, and an update of the adapters reaches the engine
    in place. (An engine that leaves the adapters out fails both.)"""
    import logging

    from skyrl_tool_agent.config import Config
    from skyrl_tool_agent.policy.qwen import QwenPolicy
    from skyrl_tool_agent.policy.sampling_params import SamplingParams

    raw = _config(model_dir).model_dump()
    raw["model"]["quantization"]["compute_dtype"] = "float32"
    policy = QwenPolicy.from_config(Config.model_validate(raw).model, mode="lora")
    assert policy.is_4bit and policy.sampler() == "engine"
    policy.sample_through_modules = through_modules  # as the memory plan sets it (a copy where it costs no episode)
    with caplog.at_level(logging.INFO, logger="skyrl_tool_agent.policy.qwen"):
        assert policy.sampling_weights().through_modules is through_modules
    assert ("through the model's modules" if through_modules else "adapters folded in") in caplog.text

    def perturb() -> None:
        with torch.no_grad():
            for name, p in policy.model.named_parameters():
                if "lora_B" in name:
                    p.add_(0.3 * torch.randn_like(p))

    torch.manual_seed(0)
    perturb()
    prefix = list(range(5, 25))
    prompts = [prefix + [30, 31], prefix + [40], prefix + [30, 31], [7, 8, 9]]
    for round_ in range(2):
        greedy = policy.generate(prompts, SamplingParams(temperature=0.0), max_new_tokens=8)
        sampled = policy.generate(prompts, SamplingParams(), max_new_tokens=8, seeds=[1, 2, 3, 4])
        for prompt, gen, draw in zip(prompts, greedy, sampled):
            for ids, logprobs, is_greedy in ((gen.token_ids, gen.logprobs, True), (draw.token_ids, draw.logprobs, False)):
                full = torch.tensor([prompt + ids])
                with torch.no_grad():
                    logits = policy.model(input_ids=full).logits[0, len(prompt) - 1:-1].float()
                expect = torch.log_softmax(logits, -1)
                chosen = expect.gather(-1, torch.tensor(ids).unsqueeze(-1)).squeeze(-1)
                # bitsandbytes' own 4-bit matmul rounds differently from a dequantized float32 one (~3e-3),
                # and with other shapes (one token vs a sequence): a near-tie may go either way
                assert torch.allclose(torch.tensor(logprobs), chosen, atol=2e-2), round_
                if is_greedy:  # each greedy token is the model's argmax (up to that rounding)
                    assert bool((chosen >= expect.max(-1).values - 2e-2).all()), round_
        perturb()  # as an optimizer step would: in place
    assert policy._weights.refreshes == 2  # the adapters changed after the snapshot, then again after round 0
