"""The `Qwen2Kernel` sampler samples what the model says: its per-token sampling log-probs equal the
model's own teacher-forced log-probs of the sampled ids (LoRA folded in, a prefix tree over groups,
a second turn continuing each episode's kept cache), and greedy episodes on built-in tasks with the
shipped model are token for token those of the HF-model sampler."""

from __future__ import annotations

import asyncio
import json

import pytest
import torch
from peft import LoraConfig, get_peft_model
from transformers import Qwen2ForCausalLM

from skyrl_tool_agent.config import SHIPPED_EMBEDDED_DIR, EnvConfig, ModelConfig
from skyrl_tool_agent.data.tasks import Task
from skyrl_tool_agent.env.pools import EnvRuntime
from skyrl_tool_agent.policy.episode_sampler import EpisodeKV, sample_episodes
from skyrl_tool_agent.policy.manifest import MANIFEST_FILE
from skyrl_tool_agent.policy.qwen import QwenPolicy
from skyrl_tool_agent.policy.qwen2_kernel import Qwen2Kernel, unsupported_reason
from skyrl_tool_agent.rollout.agents import make_agent
from skyrl_tool_agent.rollout.collector import CollectorSettings, TrajectoryCollector
from skyrl_tool_agent.eval.greedy import greedy_evaluation
from tests.fixtures.config_files import REPO
from tests.fixtures.samplers import STOP, TARGETS, lora_qwen, shipped_greedy_check, teacher_forced

def test_sampled_logprobs_match_the_models_forward_over_two_turns():
    model = lora_qwen()
    kernel = Qwen2Kernel(model)
    g = torch.Generator().manual_seed(1)
    system = torch.randint(3, 97, (40,), generator=g).tolist()
    groups = [system + torch.randint(3, 97, (n,), generator=g).tolist() for n in (9, 14, 4)]
    prompts = [p for p in groups for _ in range(3)]  # 3 tasks x 3 samples: the prefix tree's case
    keys = list(range(len(prompts)))
    store = EpisodeKV()
    torch.manual_seed(2)
    ids, logps, _ = sample_episodes(kernel, prompts, max_new_tokens=12, temperature=0.8, top_p=1.0, stop_ids=[STOP],
                                    pad_id=0, episode_keys=keys, episode_kv=store)
    assert len(store) == len(prompts)
    for prompt, out, lp in zip(prompts, ids, logps):
        assert len(out) == len(lp) >= 1
        assert torch.allclose(torch.tensor(lp), teacher_forced(model, prompt, out, 0.8), atol=1e-4)
    # Turn 2: each episode appends an observation; its kept cache must stand for everything before.
    second = [p + out + torch.randint(3, 97, (5 + i % 4,), generator=g).tolist() for i, (p, out) in enumerate(zip(prompts, ids))]
    torch.manual_seed(3)
    ids2, logps2, _ = sample_episodes(kernel, second, max_new_tokens=10, temperature=1.0, top_p=1.0, stop_ids=[STOP],
                                      pad_id=0, episode_keys=keys, episode_kv=store)
    for prompt, out, lp in zip(second, ids2, logps2):
        assert torch.allclose(torch.tensor(lp), teacher_forced(model, prompt, out, 1.0), atol=1e-4)


def test_a_kept_cache_is_used_only_for_its_own_continuation():
    store = EpisodeKV()
    store.keep("e", cache=None, row=0, ids=[1, 2, 3])  # type: ignore[arg-type]
    assert store.take("e", [1, 2, 9, 4]) is None  # not a continuation: starts afresh (and is consumed)
    store.keep("e", cache=None, row=0, ids=[1, 2, 3])  # type: ignore[arg-type]
    assert store.take("e", [1, 2, 3]) is None  # nothing new to run
    store.keep("e", cache=None, row=0, ids=[1, 2, 3])  # type: ignore[arg-type]
    assert store.take("e", [1, 2, 3, 4]).ids == [1, 2, 3]


def test_policy_rebuilds_the_kernel_after_a_weight_update_and_falls_back_when_unsupported():
    model = lora_qwen()
    kernel = Qwen2Kernel(model)
    x = torch.tensor([[5, 6, 7, 8]])
    before = kernel.forward(kernel.new_cache(1, 8), x, torch.zeros(1, dtype=torch.long))
    assert torch.allclose(before, model(input_ids=x).logits[0, -1].detach(), atol=1e-5)
    with torch.no_grad():  # an optimizer step writes the adapters in place
        next(p for n, p in model.named_parameters() if "lora_A" in n).add_(0.5)
    policy = QwenPolicy.__new__(QwenPolicy)
    policy.model, policy._kernel = model, kernel
    rebuilt = policy._sampling_kernel()
    after = rebuilt.forward(rebuilt.new_cache(1, 8), x, torch.zeros(1, dtype=torch.long))
    assert torch.allclose(after, model(input_ids=x).logits[0, -1].detach(), atol=1e-5)
    assert not torch.allclose(after, before, atol=1e-3)
    dora = get_peft_model(Qwen2ForCausalLM(model.get_base_model().config),
                          LoraConfig(r=4, target_modules=TARGETS, use_dora=True))
    assert "DoRA" in unsupported_reason(dora)


def test_an_ended_episode_releases_its_kept_cache():
    """Memory follows the episodes in flight: once an episode ends, the cache kept for its next
    turn is released (before, every ended episode's cache -- and with it its whole generation
    batch's KV -- stayed until the collection ended: bench_headroom's 2,560 dev episodes at 128 in
    flight grew past 16 GB and were killed)."""
    check = json.loads((SHIPPED_EMBEDDED_DIR / MANIFEST_FILE).read_text())["greedy_check"]
    tasks = [Task(**t) for t in check["tasks"]][:4]
    policy = QwenPolicy.from_config(ModelConfig(), mode="lora")
    agent = make_agent(policy, temperature=1.0, max_new_tokens=64)
    assert agent.episode_kv is not None
    runtime = EnvRuntime(EnvConfig(), REPO / "data" / "processed" / "databases")
    kept_while_running: list[int] = []
    try:
        collector = TrajectoryCollector(runtime, agent, tokenizer=policy.tokenizer,
                                        settings=CollectorSettings(max_turns=3, concurrency=4))
        torch.manual_seed(0)
        trajectories = asyncio.run(collector.collect(
            tasks, group_size=3, on_episode_done=lambda _: kept_while_running.append(len(agent.episode_kv))))
    finally:
        runtime.close()
    assert len(trajectories) == 12 and max(t.result.turns for t in trajectories) >= 2  # caches were kept and used
    assert len(agent.episode_kv) == 0
    assert max(kept_while_running) <= 4  # never more than the episodes in flight


@pytest.mark.slow
def test_greedy_episodes_on_builtin_tasks_equal_the_hf_sampler():
    """The shipped model (LoRA adapters perturbed so the merge matters), the tasks of its recorded
    greedy check through the real env: same ids in every turn, multi-turn episodes included."""
    tasks, settings, policy = shipped_greedy_check(8)
    assert policy.fast_sampling_unsupported() is None
    runtime = EnvRuntime(EnvConfig(), REPO / "data" / "processed" / "databases")
    try:
        policy.sampler = "hf"
        old = greedy_evaluation(policy, runtime, tasks, settings).trajectories
        policy.sampler = "kernel"
        new = greedy_evaluation(policy, runtime, tasks, settings).trajectories
    finally:
        runtime.close()
    assert max(t.result.turns for t in new) >= 2  # the kept caches were used
    assert [t.token_ids for t in new] == [t.token_ids for t in old]
    for a, b in zip(new, old):
        assert torch.allclose(torch.tensor(a.sampling_logprobs), torch.tensor(b.sampling_logprobs), atol=1e-4)


def test_seeded_draws_depend_on_the_seed_and_position_only():
    """With per-episode seeds each token comes from (seed, position): an episode samples the same
    tokens alone, in a batch, and as a kept-cache second turn, and its log-probs stay the model's;
    another seed draws otherwise (the mutation "draw from the batch row" fails the first check)."""
    model = lora_qwen()
    kernel = Qwen2Kernel(model)
    g = torch.Generator().manual_seed(4)
    system = torch.randint(3, 97, (30,), generator=g).tolist()
    prompts = [system + torch.randint(3, 97, (n,), generator=g).tolist() for n in (7, 12, 3, 9)]
    seeds = [101, 202, 303, 404]

    def sample(rows, seed_list, **kw):
        return sample_episodes(kernel, rows, max_new_tokens=14, temperature=1.0, top_p=kw.get("top_p", 1.0),
                               stop_ids=[STOP], pad_id=0, seeds=seed_list)

    together, logps, _ = sample(prompts, seeds)
    alone = [sample([p], [s])[0][0] for p, s in zip(prompts, seeds)]
    assert together == alone
    reversed_batch = sample(prompts[::-1], seeds[::-1])[0][::-1]
    assert together == reversed_batch
    for prompt, out, lp in zip(prompts, together, logps):
        assert torch.allclose(torch.tensor(lp), teacher_forced(model, prompt, out, 1.0), atol=1e-4)
    assert sample(prompts, [s + 1 for s in seeds])[0] != together
    nucleus = sample(prompts, seeds, top_p=0.5)[0]
    assert nucleus == [sample([p], [s], top_p=0.5)[0][0] for p, s in zip(prompts, seeds)]
    # the HF model's shared-prefix sampler draws the same tokens from the same seeds
    from skyrl_tool_agent.policy.prefix import sample_with_shared_prefix

    hf, _, _ = sample_with_shared_prefix(model, prompts, 30, max_new_tokens=14, temperature=1.0, top_p=1.0,
                                         stop_ids=[STOP], pad_id=0, device=torch.device("cpu"), seeds=seeds)
    assert hf == together


def test_two_sampled_evaluations_share_their_draws_whatever_the_batching():
    """avg@k before and after training uses common random numbers: the same policy evaluated twice
    with one seed, at different concurrency (so different generation batches), samples the same
    episodes token for token through the real env; a change of avg@k then measures the policy."""
    from skyrl_tool_agent.eval.greedy import sampled_evaluation
    from skyrl_tool_agent.rollout.collector import collect_episodes
    from skyrl_tool_agent.policy.qwen import SamplingParams

    check = json.loads((SHIPPED_EMBEDDED_DIR / MANIFEST_FILE).read_text())["greedy_check"]
    tasks = [Task(**t) for t in check["tasks"]][:5]
    policy = QwenPolicy.from_config(ModelConfig(), mode="lora")
    params = SamplingParams(temperature=1.0, top_p=1.0, max_new_tokens=64)
    runtime = EnvRuntime(EnvConfig(), REPO / "data" / "processed" / "databases")
    runs = []
    try:
        for width in (3, 10):
            episodes: list = []

            def collect(tasks_, k, params_, settings_, done, episodes=episodes):
                episodes.extend(collect_episodes(policy, runtime, tasks_, k, params_, settings_, done))
                return episodes

            settings = CollectorSettings(max_turns=3, concurrency=width, max_batch=width)
            record = sampled_evaluation(policy, runtime, tasks, 2, params, settings, seed=5, collect=collect)
            runs.append((record, [t.token_ids for t in episodes]))
    finally:
        runtime.close()
    (first, ids_a), (second, ids_b) = runs
    assert ids_a == ids_b and first["per_task"] == second["per_task"]
    assert len(set(map(tuple, ids_a))) > len(tasks)  # the two samples of a task differ (sampled, not greedy)
