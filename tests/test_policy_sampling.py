"""What samples for a `QwenPolicy`: the rollout engine, in every mode the engine can run, and
`model.generate` only where it cannot (and the log says why).

- a policy's episodes through the real env and the collector: the engine keeps each episode's slot
  between its turns, releases it when the episode ends, and stays built for the next collection;
- greedy episodes of the shipped model (adapters perturbed) equal `model.generate`'s, token for
  token, multi-turn included;
- two sampled evaluations at different concurrency share their draws (common random numbers);
- a model the engine cannot run (not qwen2, DoRA) samples through `model.generate`, with its reason.
"""

from __future__ import annotations

import asyncio
import json
import logging

import pytest
import torch
from peft import LoraConfig, get_peft_model
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2ForCausalLM

from skyrl_tool_agent.config import SHIPPED_EMBEDDED_DIR, EnvConfig, ModelConfig
from skyrl_tool_agent.data.tasks import Task
from skyrl_tool_agent.env.pools import EnvRuntime
from skyrl_tool_agent.eval.greedy import greedy_evaluation
from skyrl_tool_agent.policy.manifest import MANIFEST_FILE
from skyrl_tool_agent.policy.qwen import QwenPolicy
from skyrl_tool_agent.policy.sampling_params import SamplingParams
from skyrl_tool_agent.policy.weights import unsupported_reason
from skyrl_tool_agent.rollout.agents import make_agent
from skyrl_tool_agent.rollout.collector import CollectorSettings, TrajectoryCollector
from tests.fixtures.config_files import REPO
from tests.fixtures.samplers import TARGETS, lora_qwen, shipped_greedy_check


def _check_tasks(n: int) -> list[Task]:
    check = json.loads((SHIPPED_EMBEDDED_DIR / MANIFEST_FILE).read_text())["greedy_check"]
    return [Task(**t) for t in check["tasks"]][:n]


def test_an_episode_holds_its_slot_until_it_ends_and_the_engine_stays_for_the_next_collection():
    """Memory follows the episodes in flight: an episode's slot is kept between its turns and
    released when it ends; the engine (cache, graphs) is built once and reused."""
    tasks = _check_tasks(4)
    policy = QwenPolicy.from_config(ModelConfig(), mode="lora")
    agent = make_agent(policy, SamplingParams())
    runtime = EnvRuntime(EnvConfig(), REPO / "data" / "processed" / "databases")
    held_while_running: list[int] = []
    try:
        collector = TrajectoryCollector(runtime, agent, tokenizer=policy.tokenizer,
                                        settings=CollectorSettings(max_turns=3, concurrency=4))
        torch.manual_seed(0)
        trajectories = asyncio.run(collector.collect(
            tasks, group_size=3, on_episode_done=lambda _: held_while_running.append(len(policy._engine._by_key))))
        engine = policy._engine
        assert engine is not None and engine.slots == 4
        assert asyncio.run(collector.collect(tasks[:1], group_size=2)) and policy._engine is engine  # built once
    finally:
        runtime.close()
    assert len(trajectories) == 12 and max(t.result.turns for t in trajectories) >= 2  # slots kept across turns
    assert max(held_while_running) <= 4  # never more than the episodes in flight
    assert engine.stats["prefill_tokens"] < sum(len(t.token_ids) for t in trajectories)  # kept slots and the root


@pytest.mark.slow
def test_greedy_episodes_on_builtin_tasks_equal_model_generate():
    """The shipped model (LoRA adapters perturbed so the fold matters), the tasks of its recorded
    greedy check through the real env: the engine's ids equal `model.generate`'s in every turn."""
    tasks, settings, policy = shipped_greedy_check(8)
    runtime = EnvRuntime(EnvConfig(), REPO / "data" / "processed" / "databases")
    try:
        engine = greedy_evaluation(policy, runtime, tasks, settings).trajectories
        assert policy.sampler() == "engine" and policy._engine is not None
        policy.engine_blocker = "the reference"  # what the policy does for a model the engine cannot run
        reference = greedy_evaluation(policy, runtime, tasks, settings).trajectories
    finally:
        runtime.close()
    assert max(t.result.turns for t in engine) >= 2
    assert [t.token_ids for t in engine] == [t.token_ids for t in reference]
    for a, b in zip(engine, reference):
        assert torch.allclose(torch.tensor(a.sampling_logprobs), torch.tensor(b.sampling_logprobs), atol=1e-4)


def test_two_sampled_evaluations_share_their_draws_whatever_the_batching():
    """avg@k before and after training uses common random numbers: the same policy evaluated twice
    with one seed, at different concurrency (so different decode batches), samples the same
    episodes token for token through the real env; a change of avg@k then measures the policy."""
    from skyrl_tool_agent.eval.greedy import sampled_evaluation
    from skyrl_tool_agent.rollout.collector import collect_episodes

    tasks = _check_tasks(5)
    policy = QwenPolicy.from_config(ModelConfig(), mode="lora")
    params = SamplingParams(temperature=1.0, top_p=1.0)
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


def test_a_model_the_engine_cannot_run_samples_through_generate_and_says_why(caplog):
    model = lora_qwen()
    dora = get_peft_model(Qwen2ForCausalLM(model.get_base_model().config),
                          LoraConfig(r=4, target_modules=TARGETS, use_dora=True))
    assert "DoRA" in unsupported_reason(dora)
    torch.manual_seed(0)
    llama = LlamaForCausalLM(LlamaConfig(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2)).eval()
    tokenizer = QwenPolicy.from_config(ModelConfig(), mode="lora").tokenizer
    with caplog.at_level(logging.WARNING, logger="skyrl_tool_agent.policy.qwen"):
        policy = QwenPolicy(llama, tokenizer, mode="full")
    assert policy.sampler() == "model.generate (model_type 'llama' is not qwen2)"
    assert "cannot run this model" in caplog.text and "model.generate" in caplog.text
    assert policy.rollout_engine(slots=2, capacity=64) is None
    prompt = [5, 6, 7, 8, 9]
    out = policy.generate([prompt], SamplingParams(temperature=0.0), max_new_tokens=6)[0]
    ref = llama.generate(torch.tensor([prompt]), max_new_tokens=6, do_sample=False, pad_token_id=0,
                         eos_token_id=policy.stop_token_ids)[0, len(prompt):].tolist()
    assert out.token_ids == ref[:len(out.token_ids)] and len(out.logprobs) == len(out.token_ids)
