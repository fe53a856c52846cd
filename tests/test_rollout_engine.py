"""`RolloutEngine` samples what the model says, whatever it is batched with.

- greedy tokens are the HF forward's argmax chain (prefix sharing, two turns through kept slots);
- sampled tokens' log-probs equal the model's teacher-forced log-probs (fp32, 1e-5), top-p too;
- continuous batching: an episode gets the same tokens alone, beside others that arrive while it
  decodes, and with another stop-check interval (counter-based per-episode draws);
- the draws are unbiased (frequencies match the distribution) and top-p keeps only the nucleus;
- a weight update reaches the engine in place (the tensors a CUDA graph holds stay the same);
- sampled through the model's own modules (no folded copy), a LoRA model draws what the folded
  snapshot draws, before and after an optimizer step;
- the Triton decode attention (run by Triton's CPU interpreter) equals the torch reference, alone
  and inside the engine;
- a retried episode (same key, a prompt that does not continue its slot) starts afresh;
- rows moved between slots (packed, so the CPU attention reads them in place) keep their tokens;
- threads that wait for the engine free their OpenMP threads (two pools slow every CPU op).
(Through the env and the collector: tests/test_policy_sampling.py.)
The CUDA-graph path and the speed are measured on a GPU by benchmarks/bench_rollout.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
import torch

from skyrl_tool_agent.kernels.cpu_threads import release_thread_pool
from skyrl_tool_agent.config import ModelConfig
from skyrl_tool_agent.policy.engine import IDLE_RELEASE_S, EpisodeTurn, RolloutEngine
from skyrl_tool_agent.policy.qwen import QwenPolicy
from skyrl_tool_agent.policy.sampling_params import SamplingParams
from skyrl_tool_agent.policy.token_sampling import counter_uniform, sample_tokens
from skyrl_tool_agent.policy.weights import SamplingWeights
from tests.fixtures.config_files import REPO
from tests.fixtures.samplers import STOP, lora_qwen, teacher_forced

def _prompts(n_tasks: int = 3, per_task: int = 3, seed: int = 1) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    system = torch.randint(3, 97, (40,), generator=g).tolist()
    tasks = [system + torch.randint(3, 97, (int(n),), generator=g).tolist()
             for n in torch.randint(1, 15, (n_tasks,), generator=g)]
    return [t for t in tasks for _ in range(per_task)]


def _argmax_chain(model: torch.nn.Module, prompt: list[int], steps: int) -> list[int]:
    seq, out = list(prompt), []
    with torch.no_grad():
        for _ in range(steps):
            token = int(model(input_ids=torch.tensor([seq])).logits[0, -1].argmax())
            out.append(token)
            seq.append(token)
            if token == STOP:
                break
    return out


def _turns(engine: RolloutEngine, prompts: list[list[int]], keys: list[int], seeds: list[int], *, max_new_tokens: int,
           temperature: float, top_p: float) -> list:
    params = SamplingParams(temperature=temperature, top_p=top_p)
    futures = [engine.submit_all([EpisodeTurn(p, max_new_tokens, k, s)], params)[0]
               for p, k, s in zip(prompts, keys, seeds)]
    return [f.result(timeout=120) for f in futures]


def test_greedy_tokens_are_the_hf_argmax_chain_over_two_turns():
    model = lora_qwen()
    engine = RolloutEngine(model, slots=16, capacity=160, stop_ids=[STOP], pad_id=0)
    for cache in (*engine.step.keys, *engine.step.values):  # the cache is allocated uninitialised:
        cache.fill_(float("nan"))  # whatever it holds where no row wrote must not reach a token
    try:
        prompts = _prompts()
        keys = list(range(len(prompts)))
        first = _turns(engine, prompts, keys, keys, max_new_tokens=12, temperature=0.0, top_p=1.0)
        for prompt, (ids, _, stopped) in zip(prompts, first):
            assert ids == _argmax_chain(model, prompt, 12)
            assert stopped == (ids[-1] == STOP)
        g = torch.Generator().manual_seed(5)
        second = [p + ids + torch.randint(3, 97, (3 + i % 5,), generator=g).tolist()
                  for i, (p, (ids, _, _)) in enumerate(zip(prompts, first))]
        prefilled = engine.stats["prefill_tokens"]
        again = _turns(engine, second, keys, keys, max_new_tokens=10, temperature=0.0, top_p=1.0)
        for prompt, (ids, _, _) in zip(second, again):
            assert ids == _argmax_chain(model, prompt, 10)
        # The second turn ran only what each episode appended (its slot held the rest).
        appended = sum(len(s) - len(p) - len(ids) + 1 for s, p, (ids, _, _) in zip(second, prompts, first))
        assert engine.stats["prefill_tokens"] - prefilled == appended
    finally:
        engine.close()


@pytest.mark.parametrize("top_p", [1.0, 0.9])
def test_sampled_logprobs_equal_the_training_forward(top_p: float):
    model = lora_qwen()
    engine = RolloutEngine(model, slots=16, capacity=160, stop_ids=[STOP], pad_id=0)
    try:
        prompts = _prompts()
        keys = list(range(len(prompts)))
        seeds = [11 * k + 3 for k in keys]
        out = _turns(engine, prompts, keys, seeds, max_new_tokens=16, temperature=0.8, top_p=top_p)
        for prompt, (ids, logps, _) in zip(prompts, out):
            assert len(ids) == len(logps) >= 1
            assert torch.allclose(torch.tensor(logps), teacher_forced(model, prompt, ids, 0.8), atol=1e-5)
        assert len({tuple(ids) for ids, _, _ in out}) > len(prompts) // 2  # a group's samples differ
    finally:
        engine.close()


def test_an_episode_samples_the_same_tokens_alone_and_continuously_batched():
    model = lora_qwen()
    prompts = _prompts(n_tasks=4, per_task=3, seed=7)
    seeds = [1000 + i for i in range(len(prompts))]
    params = dict(max_new_tokens=24, temperature=1.0, top_p=1.0)
    alone = []
    solo = RolloutEngine(model, slots=1, capacity=160, stop_ids=[STOP], pad_id=0)
    try:
        for i, p in enumerate(prompts):
            alone.append(_turns(solo, [p], [i], [seeds[i]], **params)[0])
            solo.release(i)
    finally:
        solo.close()
    # All at once on another stop-check interval, the second half arriving while the first decodes.
    engine = RolloutEngine(model, slots=16, capacity=160, stop_ids=[STOP], pad_id=0, stop_check_interval=3)
    try:
        half = len(prompts) // 2
        futures = [engine.submit_all([EpisodeTurn(p, 24, i, seeds[i])], SamplingParams())[0]
                   for i, p in enumerate(prompts[:half])]
        time.sleep(0.05)
        futures += [engine.submit_all([EpisodeTurn(p, 24, half + i, seeds[half + i])], SamplingParams())[0]
                    for i, p in enumerate(prompts[half:])]
        together = [f.result(timeout=120) for f in futures]
        # Rows that ended early left holes the others were moved into (packed for the CPU attention).
        assert engine.stats["chunks"] > 1 and engine.stats["slot_moves"] > 0
    finally:
        engine.close()
    for (a_ids, a_lp, a_stop), (b_ids, b_lp, b_stop) in zip(alone, together):
        assert a_ids == b_ids and a_stop == b_stop
        assert torch.allclose(torch.tensor(a_lp), torch.tensor(b_lp), atol=1e-5)
    assert len({tuple(ids) for ids, _, _ in alone}) > len(prompts) // 2


def test_more_episodes_than_slots_wait_for_a_released_slot():
    model = lora_qwen()
    engine = RolloutEngine(model, slots=2, capacity=120, stop_ids=[STOP], pad_id=0)
    try:
        prompts = _prompts(n_tasks=2, per_task=2)
        futures = [engine.submit_all([EpisodeTurn(p, 6, i, i)], SamplingParams())[0]
                   for i, p in enumerate(prompts)]
        done = [f.result(timeout=60) for f in futures[:2]]
        assert not futures[2].done() and not futures[3].done()  # no slot yet
        engine.release(0)
        engine.release(1)
        assert all(len(f.result(timeout=60)[0]) >= 1 for f in futures[2:]) and len(done) == 2
        (too_long,) = engine.submit_all([EpisodeTurn([5] * 100, 50, 9, 0)], SamplingParams())
        with pytest.raises(ValueError, match="capacity"):
            too_long.result(timeout=5)
    finally:
        engine.close()


def test_draws_follow_the_distribution_and_top_p_keeps_the_nucleus():
    logits = torch.log(torch.tensor([0.5, 0.25, 0.15, 0.07, 0.03])).repeat(20000, 1)
    uniform = counter_uniform(torch.full((20000,), 12345), torch.arange(20000))
    ones = torch.ones(20000)
    token, logp = sample_tokens(logits, ones, ones, uniform, nucleus=False)
    freq = torch.bincount(token, minlength=5).float() / 20000
    assert torch.allclose(freq, torch.tensor([0.5, 0.25, 0.15, 0.07, 0.03]), atol=0.012)
    assert torch.allclose(logp, logits[0][token], atol=1e-6)
    token, _ = sample_tokens(logits, ones, torch.full((20000,), 0.7), uniform, nucleus=True)
    freq = torch.bincount(token, minlength=5).float() / 20000
    assert freq[2:].sum() == 0  # the 0.7 nucleus: tokens whose mass before them is < 0.7
    assert torch.allclose(freq[:2], torch.tensor([0.5, 0.25]) / 0.75, atol=0.012)
    greedy, _ = sample_tokens(logits[:3], torch.zeros(3), torch.ones(3), uniform[:3], nucleus=False)
    assert greedy.tolist() == [0, 0, 0]


def test_a_weight_update_reaches_the_engine_in_place():
    """The engine lives for the run: after an optimizer step its snapshot is refreshed in place (the
    tensors a CUDA graph holds stay the same) and nothing computed with the old weights is read again,
    the shared root included."""
    model = lora_qwen()
    engine = RolloutEngine(model, slots=4, capacity=120, stop_ids=[STOP], pad_id=0)
    try:
        prompts = _prompts(2, 1)  # two tasks sharing a system prefix: the root holds it
        pointers = [t.data_ptr() for t in engine.weights.tensors.values()]
        _turns(engine, prompts, [0, 1], [0, 1], max_new_tokens=8, temperature=0.0, top_p=1.0)
        assert engine.root_tokens
        engine.release(0)
        engine.release(1)
        with torch.no_grad():  # an optimizer step writes the adapters in place
            for name, p in model.named_parameters():
                if "lora_B" in name:
                    p.add_(0.3 * torch.randn_like(p))
        again = _turns(engine, prompts, [2, 3], [0, 1], max_new_tokens=8, temperature=0.0, top_p=1.0)
        assert [ids for ids, _, _ in again] == [_argmax_chain(model, p, 8) for p in prompts]
        assert [t.data_ptr() for t in engine.weights.tensors.values()] == pointers
        assert engine.weights.refreshes == 1
    finally:
        engine.close()


def _optimizer_step(model: torch.nn.Module, prompt: list[int]) -> None:
    """One Adam step on the adapters (a loss that moves them: the prompt's own log-likelihood)."""
    adapters = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.Adam(adapters, lr=0.05)
    logits = model(input_ids=torch.tensor([prompt])).logits[0, :-1]
    torch.nn.functional.cross_entropy(logits, torch.tensor(prompt[1:])).backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def test_sampling_through_the_modules_equals_the_folded_snapshot_and_copies_no_projection():
    """A LoRA model sampled through its own modules (the adapters applied beside the base weights,
    no folded copy) draws the folded snapshot's tokens with its log-probs (1e-5), which are the
    model's own, before and after an optimizer step on the adapters (the step reaches the engine:
    the root's keys, computed with the old adapters, are recomputed); and it holds no copy of the
    projections (a float32 model: nothing at all) where the folded snapshot holds all of them."""
    model = lora_qwen()
    folded = RolloutEngine(SamplingWeights(model), slots=8, capacity=120, stop_ids=[STOP], pad_id=0)
    through = RolloutEngine(SamplingWeights(model, through_modules=True), slots=8, capacity=120, stop_ids=[STOP],
                            pad_id=0)
    projections = sum(t.numel() * t.element_size() for name, t in folded.weights.tensors.items()
                      if name.rsplit(".", 1)[-1] in ("qkv_w", "o_w", "gate_up_w", "down_w"))
    assert folded.weights.nbytes() >= projections > 0
    assert through.weights.nbytes() == 0
    try:
        prompts = _prompts(n_tasks=2, per_task=2)  # a shared system prefix: the root holds it
        keys, seeds = list(range(len(prompts))), [7 * k + 1 for k in range(len(prompts))]
        for step in range(2):
            params = dict(max_new_tokens=10, temperature=0.9, top_p=1.0)
            expected = _turns(folded, prompts, keys, seeds, **params)
            got = _turns(through, prompts, keys, seeds, **params)
            assert through.root_tokens
            for prompt, (ids, logps, stopped), (want_ids, want_logps, want_stopped) in zip(prompts, got, expected):
                assert ids == want_ids and stopped == want_stopped
                assert torch.allclose(torch.tensor(logps), torch.tensor(want_logps), atol=1e-5)
                assert torch.allclose(torch.tensor(logps), teacher_forced(model, prompt, ids, 0.9), atol=1e-5)
            for engine in (folded, through):
                for key in keys:
                    engine.release(key)
            assert through.weights.refreshes == step  # refreshed once, after the step
            if step == 0:
                _optimizer_step(model, prompts[0])
                assert not through.weights.is_current()
        assert through.weights.nbytes() == 0
    finally:
        folded.close()
        through.close()


def test_the_policy_samples_through_the_modules_when_its_plan_says_so():
    """`QwenPolicy.sample_through_modules` (set by the memory plan) decides how the engine reads a
    LoRA model; unset, LoRA folds its adapters into a copy."""
    loaded = QwenPolicy.from_config(ModelConfig(), mode="lora")
    assert loaded.sample_through_modules is None and not loaded.sampling_weights().through_modules
    for through in (True, False):
        policy = QwenPolicy(loaded.model, loaded.tokenizer)
        policy.sample_through_modules = through
        assert policy.sampling_weights().through_modules is through
        assert (policy.sampling_weights().nbytes() == 0) is through


_TRITON_CHECK = r"""
import torch
from skyrl_tool_agent.kernels.decode_attention import decode_attention, reference_decode_attention
from skyrl_tool_agent.kernels.cpu_threads import release_thread_pool
from skyrl_tool_agent.policy.engine import IDLE_RELEASE_S, RolloutEngine
from tests.fixtures.samplers import lora_qwen
from tests.test_rollout_engine import _argmax_chain, _prompts, _turns
torch.manual_seed(0)
worst = 0.0
for heads, kv_heads, dim in [(4, 2, 8), (12, 2, 128)]:  # the test model's heads; Qwen2.5-1.5B's
    keys, values = torch.randn(6, kv_heads, 130, dim), torch.randn(6, kv_heads, 130, dim)
    q = torch.randn(6, heads, dim)
    # Slot 5 is the root: rows read 0 or 40 of its positions, then their own from there.
    slots, lengths = torch.tensor([3, 0, 4, 4, 1, 2]), torch.tensor([1, 130, 64, 65, 41, 100])
    root_lens, root = torch.tensor([0, 40, 0, 40, 40, 70]), torch.tensor([5])
    ref = reference_decode_attention(q, keys, values, slots, lengths, root_lens, root, dim ** -0.5)
    out = decode_attention(q, keys, values, slots, lengths, root_lens, root, dim ** -0.5)
    worst = max(worst, float((out - ref).abs().max()))
assert worst < 1e-5, worst
model = lora_qwen()
engine = RolloutEngine(model, slots=4, capacity=80, stop_ids=[2], pad_id=0, attention="triton")
prompts = _prompts(2, 2)
out = _turns(engine, prompts, [0, 1, 2, 3], [0, 1, 2, 3], max_new_tokens=4, temperature=0.0, top_p=1.0)
assert [ids for ids, _, _ in out] == [_argmax_chain(model, p, 4) for p in prompts]
engine.close()
print("ok", worst)
"""


def test_triton_decode_attention_equals_the_reference():
    pytest.importorskip("triton")
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(REPO)}
    run = subprocess.run([sys.executable, "-c", _TRITON_CHECK], env=env, cwd=REPO, capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0 and run.stdout.startswith("ok"), run.stderr[-3000:]


def test_a_retried_episode_that_does_not_continue_its_slot_starts_afresh():
    """Same key, a prompt that is not its slot's tokens plus more (a retried episode): its slot is
    dropped and the prompt runs from the start (the slot's old keys would be the wrong context)."""
    model = lora_qwen()
    engine = RolloutEngine(model, slots=4, capacity=160, stop_ids=[STOP], pad_id=0)
    try:
        first, other = _prompts(2, 1, seed=7)
        _turns(engine, [first], [0], [0], max_new_tokens=6, temperature=0.0, top_p=1.0)
        again = _turns(engine, [other], [0], [0], max_new_tokens=8, temperature=0.0, top_p=1.0)[0][0]
        assert again == _argmax_chain(model, other, 8)
    finally:
        engine.close()


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="counts the process's threads in /proc (Linux)")
def test_threads_that_wait_for_the_engine_free_their_openmp_threads():
    """With two OpenMP pools on a 2-core machine GNU OpenMP wakes its workers through the kernel at
    every parallel op (the engine's decode ran ~1.5x slower, kernels/cpu_threads.py): the thread
    that submits a turn frees its pool, and so does the engine's thread once idle."""
    if not release_thread_pool():
        pytest.skip("torch's OpenMP runtime cannot free a thread's pool")
    threads = lambda: len(os.listdir("/proc/self/task"))  # noqa: E731
    torch_threads = torch.get_num_threads()
    torch.set_num_threads(2)  # before the engine's thread starts: it takes the count then
    engine = RolloutEngine(lora_qwen(), slots=2, capacity=512, stop_ids=[STOP], pad_id=0)
    try:
        release_thread_pool()
        alone = threads()  # no engine thread yet (it starts with the first turn), no pool
        torch.randn(1 << 20).exp()  # a parallel op: this thread's pool
        assert threads() == alone + 1
        g = torch.Generator().manual_seed(0)
        long = [torch.randint(3, 97, (400,), generator=g).tolist() for _ in range(2)]  # a prefill of parallel ops
        engine.generate(long, SamplingParams(), max_new_tokens=4, seeds=[1, 2])
        deadline = time.monotonic() + 10
        while threads() != alone + 1 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert threads() == alone + 1  # the engine's thread, without workers; this thread's freed
    finally:
        torch.set_num_threads(torch_threads)
        engine.close()
