"""QwenPolicy + embedded-style tiny model + TrajectoryCollector: real generation, real MCP server."""

from __future__ import annotations

import asyncio

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from skyrl_tool_agent.config import EnvConfig
from skyrl_tool_agent.env.chat_format import render_conversation, render_observation
from skyrl_tool_agent.env.pools import EnvRuntime
from skyrl_tool_agent.grpo.batch import collate
from skyrl_tool_agent.policy.sampling_params import SamplingParams
from skyrl_tool_agent.rollout.agents import PolicyAgent
from skyrl_tool_agent.rollout.collector import CollectorSettings, TrajectoryCollector
from tests.fixtures.tiny_db import SHOP_TASKS, make_shop_db
from tests.fixtures.tiny_policy import build_tiny_model_dir, tiny_policy


@pytest.fixture(scope="module")
def runtime(tmp_path_factory):
    root = tmp_path_factory.mktemp("dbs")
    make_shop_db(root)
    rt = EnvRuntime(EnvConfig(), root)
    yield rt
    rt.close()


@pytest.fixture(scope="module")
def model_dir(runtime, tmp_path_factory):
    return build_tiny_model_dir(runtime, SHOP_TASKS * 4, tmp_path_factory.mktemp("tiny"))


def test_the_tokenizers_markers_are_the_prompts():
    """The embedded tokenizer's special and tool tokens (policy layer, below the env) are the
    markers `env.chat_format` writes into the prompt and parses: spelled twice, kept equal here."""
    from skyrl_tool_agent.env import chat_format as cf
    from skyrl_tool_agent.policy.embedded import SPECIAL_TOKENS, TOOL_TOKENS

    assert SPECIAL_TOKENS == [cf.ENDOFTEXT, cf.IM_START, cf.IM_END]
    assert TOOL_TOKENS == [cf.TOOL_CALL_OPEN, cf.TOOL_CALL_CLOSE, cf.TOOL_RESPONSE_OPEN, cf.TOOL_RESPONSE_CLOSE,
                           cf.ANSWER_OPEN, cf.ANSWER_CLOSE]


def test_reload_through_auto_classes_gives_identical_ids_and_logits(model_dir):
    from tokenizers import Tokenizer

    raw = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    tok = AutoTokenizer.from_pretrained(model_dir)
    text = render_conversation([{"role": "system", "content": "S"}, {"role": "user", "content": "Database: shop\nQuestion: Héllo  Paris?"}])
    text += '<tool_call>\n{"name": "list_tables", "arguments": {"db_id": "shop"}}\n</tool_call><|im_end|>'
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert ids == raw.encode(text, add_special_tokens=False).ids
    assert tok.decode(ids) == text
    assert tok.convert_tokens_to_ids("<tool_call>") in ids  # one id for the tool tag
    messages = [{"role": "system", "content": "sys"}, {"role": "user", "content": "q"}]
    assert tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) == render_conversation(messages)
    m1 = AutoModelForCausalLM.from_pretrained(model_dir)
    m2 = AutoModelForCausalLM.from_pretrained(model_dir)
    x = torch.tensor([ids])
    assert m1.config.model_type == "qwen2"
    assert torch.equal(m1(x).logits, m2(x).logits)


def test_collector_group_trajectories_masks_and_logprobs(runtime, model_dir):
    policy = tiny_policy(model_dir, mode="lora")
    settings = CollectorSettings(max_turns=4, max_new_tokens_per_turn=48, max_total_tokens=1500, concurrency=8)
    agent = PolicyAgent(policy, SamplingParams())
    collector = TrajectoryCollector(runtime, agent, tokenizer=policy.tokenizer, settings=settings)
    torch.manual_seed(0)
    trajectories = asyncio.run(collector.collect(SHOP_TASKS[:2], group_size=4))
    assert [(t.task_id, t.group_index) for t in trajectories] == [(task.task_id, g) for task in SHOP_TASKS[:2] for g in range(4)]
    assert collector.last_stats["mean_generation_batch"] > 1.0  # generation was batched across episodes
    tok = policy.tokenizer
    for t in trajectories:
        n = len(t.token_ids)
        assert n == len(t.loss_mask) == len(t.sampling_logprobs) <= 1500
        assert t.loss_mask[: t.prompt_length] == [0] * t.prompt_length
        assert tok.decode(t.token_ids[: t.prompt_length]) == render_conversation(t.messages[:2])
        # masked-in runs are exactly the assistant turns the env saw; masked-out runs are observations
        runs, start = [], 0
        for i in range(1, n + 1):
            if i == n or t.loss_mask[i] != t.loss_mask[start]:
                runs.append((t.loss_mask[start], t.token_ids[start:i]))
                start = i
        policy_runs = [ids for m, ids in runs if m == 1]
        assistant = [m["content"] for m in t.messages if m["role"] == "assistant"]
        assert [tok.decode(ids, skip_special_tokens=True) for ids in policy_runs] == assistant
        obs_runs = [ids for m, ids in runs if m == 0][1:]
        user_obs = [m for m in t.messages[2:] if m["role"] == "user"]
        for ids, msg in zip(obs_runs, user_obs):
            assert tok.decode(ids) == render_observation([msg])
        assert t.result.turns == len(assistant) >= 1
    # sampling log-probs == log-probs the trainer recomputes on the same ids (multi-turn sequences)
    batch = collate(trajectories, [1.0] * len(trajectories), tok.pad_token_id)
    with torch.no_grad():
        logp, _ = policy.token_logprobs(batch.input_ids, batch.attention_mask, temperature=1.0)
    diff = (logp - batch.old_logp).abs()[batch.loss_mask]
    assert batch.loss_mask.sum() > 20
    assert float(diff.max()) < 2e-3, float(diff.max())


def test_a_continuous_agents_short_turn_is_not_held_for_a_long_one():
    """With an agent that batches on its own (the rollout engine), each turn goes back to its
    episode when it is done: two turns submitted together, 0.01 s and 1 s long, resolve at their
    own times (the short one was held until the long one was done when the pending requests were
    handed over as one batch)."""
    from skyrl_tool_agent.data.tasks import Task
    from skyrl_tool_agent.rollout.collector import _GenerationBatcher
    from skyrl_tool_agent.rollout.turns import Agent, AgentTurn, TurnRequest

    class TurnByTurn(Agent):
        continuous = True

        async def act(self, requests):
            await asyncio.sleep(max(r.max_new_tokens for r in requests) / 100)
            return [AgentTurn(text=str(r.seq)) for r in requests]

    task = Task(task_id="t", db_id="shop", question="q", gold_sql="select 1", difficulty="easy")

    async def run() -> dict[int, float]:
        batcher = _GenerationBatcher(TurnByTurn(), max_batch=8, wait_s=0.002)
        runner = asyncio.create_task(batcher.run())
        batcher.active_episodes = 2
        start, done = asyncio.get_running_loop().time(), {}

        async def turn(seq: int, tokens: int) -> None:
            await batcher.submit(TurnRequest(task, 0, [], None, tokens, 0, seq))
            done[seq] = asyncio.get_running_loop().time() - start

        await asyncio.gather(turn(0, 1), turn(1, 100))
        runner.cancel()
        await asyncio.gather(runner, return_exceptions=True)
        return done

    done = asyncio.run(run())
    assert done[0] < 0.5 <= done[1]


def test_an_object_with_act_that_is_not_an_agent_is_one_clear_error():
    """The collector calls every `Agent` hook; an object that writes only `act` without deriving
    from `Agent` (whose hooks have defaults) is refused up front, naming the fix."""
    from skyrl_tool_agent.rollout.agents import make_agent
    from skyrl_tool_agent.rollout.collector import TrajectoryCollector
    from skyrl_tool_agent.rollout.turns import Agent

    class ActOnly:
        async def act(self, requests):
            return []

    class Derived(Agent):
        async def act(self, requests):
            return []

    for build in (make_agent, lambda agent: TrajectoryCollector(None, agent)):
        with pytest.raises(TypeError, match="ActOnly is not an Agent: derive it from skyrl_tool_agent.rollout.turns.Agent"):
            build(ActOnly())
    agent = make_agent(Derived())
    assert isinstance(agent, Derived) and agent.continuous is False and agent.tokenizer is None
    agent.start_collection(concurrency=2, max_total_tokens=10)  # the defaults: nothing to do
    agent.end_episode(0)
    agent.finish_collection()


def test_a_lockstep_collection_draws_the_same_bits_however_the_engines_thread_is_scheduled(runtime, model_dir,
                                                                                            monkeypatch):
    """A lockstep collection hands the engine each batch of turns whole (one submission): were the
    turns queued one by one, the engine's thread could wake between two of them (a loaded machine)
    and start some a decode step before the others, prefilled apart from their group, and the
    floats, then the tokens, of a run and of its resume would part (CI saw a full-mode resume end
    with another loss). Here every message to the engine is followed by a pause that lets its
    thread run: the trajectories are the unpaused collection's, bit for bit."""
    import queue
    import time
    import types

    from skyrl_tool_agent.policy import engine as engine_module

    policy = tiny_policy(model_dir, mode="lora")
    settings = CollectorSettings(max_turns=3, max_new_tokens_per_turn=24, max_total_tokens=1500, concurrency=8,
                                 deterministic=True)

    def collect() -> list:
        collector = TrajectoryCollector(runtime, PolicyAgent(policy, SamplingParams()), tokenizer=policy.tokenizer,
                                        settings=settings)
        torch.manual_seed(0)
        return [(t.token_ids, t.sampling_logprobs) for t in asyncio.run(collector.collect(SHOP_TASKS[:2], group_size=3))]

    policy.release_rollout_engine()
    alone = collect()

    class PausingQueue(queue.Queue):
        def put(self, item, block=True, timeout=None):
            super().put(item, block, timeout)
            time.sleep(0.02)  # the engine's thread takes what is queued so far

    policy.release_rollout_engine()  # the next engine is built with the pausing inbox
    monkeypatch.setattr(engine_module, "queue", types.SimpleNamespace(Queue=PausingQueue, Empty=queue.Empty))
    paused = collect()
    assert paused == alone
