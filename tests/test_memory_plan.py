"""The rollout engine's slots come from a memory budget (`policy.memory_plan`), and episodes beyond
them wait for a slot instead of failing.

- `plan_slots` (pure): all wanted when they fit; at the gpu profile's 256 x 6,144 tokens of a
  7B shape on an 80 GB GPU, the most that fit; one clear error when not even one fits;
- the real engine on CPU with a budget for 2 slots and 8 two-turn episodes: the episodes wait,
  complete, and sample the tokens they sample with a slot each (so do 8 one-turn `generate`
  prompts); the log says how many slots and why.
"""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from skyrl_tool_agent.config import UserInputError
from skyrl_tool_agent.policy import memory_plan
from skyrl_tool_agent.policy.engine import RolloutEngine
from skyrl_tool_agent.policy.memory_plan import GIB, DeviceMemory, plan_slots
from skyrl_tool_agent.policy.slot_model import default_prefill_tokens
from tests.fixtures.samplers import STOP, lora_qwen
from tests.test_rollout_engine import _prompts

#: Qwen2.5-7B: 28 layers x 4 kv heads x 128, bf16 keys and values, plus the history's id and log-prob.
QWEN7B_BYTES_PER_TOKEN = 2 * 28 * 4 * 128 * 2 + 8 + 4


def test_all_wanted_slots_when_they_fit():
    plan = plan_slots(demand=64, capacity=1000, bytes_per_token=1000, memory_bytes=10**9, fraction=0.5,
                      reserved_bytes=10**8)
    assert (plan.slots, plan.bytes_per_slot, plan.budget_bytes) == (64, 10**6, 4 * 10**8)
    assert "64 of 64 slots" in plan.describe()


def test_the_gpu_profile_on_an_80gb_gpu_gets_the_slots_that_fit():
    # 256 episodes x 6,154 positions of a 7B shape want ~84 GiB: more than the whole GPU.
    capacity = 6144 + 8 + 2
    assert 256 * capacity * QWEN7B_BYTES_PER_TOKEN > 84 * GIB
    total, in_use, working = 80 * GIB, 31 * GIB, 7 * GIB  # weights + fused copy + optimizer state
    plan = plan_slots(demand=256, capacity=capacity, bytes_per_token=QWEN7B_BYTES_PER_TOKEN, memory_bytes=total,
                      fraction=0.9, reserved_bytes=in_use + working)
    assert plan.budget_bytes == int(0.9 * total) - in_use - working
    # The most that fit beside the scratch and root slots, and no more.
    assert (plan.slots + 2) * plan.bytes_per_slot <= plan.budget_bytes < (plan.slots + 3) * plan.bytes_per_slot
    assert 50 < plan.slots < 256
    line = plan.describe()
    assert f"{plan.slots} of 256 slots" in line and "wait" in line and "per slot" in line
    more = plan_slots(demand=256, capacity=capacity, bytes_per_token=QWEN7B_BYTES_PER_TOKEN, memory_bytes=total,
                      fraction=0.95, reserved_bytes=in_use + working)
    assert more.slots > plan.slots  # the fraction is the knob


def test_a_budget_without_room_for_one_episode_is_one_clear_error():
    with pytest.raises(UserInputError, match=r"cannot hold one episode.*model\.engine_memory_fraction"):
        plan_slots(demand=8, capacity=6154, bytes_per_token=QWEN7B_BYTES_PER_TOKEN, memory_bytes=80 * GIB,
                   fraction=0.5, reserved_bytes=40 * GIB)
    with pytest.raises(ValueError, match="fraction"):
        plan_slots(demand=8, capacity=10, bytes_per_token=10, memory_bytes=GIB, fraction=1.5, reserved_bytes=0)


def _two_turn_episodes(engine: RolloutEngine, prompts: list[list[int]]) -> list:
    """Each prompt an episode of two sampled turns (the second continues the first with an
    observation), driven from its own thread as the collector drives them; released at its end."""

    def episode(key: int) -> tuple:
        params = dict(temperature=1.0, top_p=1.0, key=key, seed=500 + key)
        first = engine.submit(prompts[key], max_new_tokens=10, **params).result(timeout=30)
        observation = [3 + (key * 7 + i) % 90 for i in range(4 + key % 3)]
        second = engine.submit(prompts[key] + first[0] + observation, max_new_tokens=8, **params).result(timeout=30)
        engine.release(key)
        return first, second

    with ThreadPoolExecutor(len(prompts)) as pool:
        return list(pool.map(episode, range(len(prompts))))


def test_a_budget_below_the_demand_makes_episodes_wait_with_the_same_tokens(monkeypatch, caplog):
    model = lora_qwen()
    prompts = _prompts(n_tasks=4, per_task=2, seed=3)
    ample = RolloutEngine(model, slots=len(prompts), capacity=120, stop_ids=[STOP], pad_id=0)
    try:
        assert ample.slots == len(prompts)
        alone = _two_turn_episodes(ample, prompts)
        one_turn = ample.generate(prompts, max_new_tokens=6, temperature=1.0, top_p=1.0, seeds=range(len(prompts)))
        assert ample.stats["waited"] == 0
        working = ample.weights.dims.working_set_bytes(rows=len(prompts), capacity=ample.capacity,
                                                       prefill_tokens=default_prefill_tokens(ample.weights.device),
                                                       dtype_bytes=ample.weights.dtype.itemsize)
        per_slot = ample.plan.bytes_per_slot
    finally:
        ample.close()
    # Memory for 4.5 slots beyond the working set: 2 slots, the scratch one and the root.
    monkeypatch.setattr(memory_plan, "device_memory",
                        lambda device: DeviceMemory(int((working + 4.5 * per_slot) / 0.5), 0, "of a test budget"))
    with caplog.at_level(logging.INFO, logger="skyrl_tool_agent.policy.engine"):
        tight = RolloutEngine(model, slots=len(prompts), capacity=120, stop_ids=[STOP], pad_id=0, memory_fraction=0.5)
    try:
        assert (tight.slots, tight.demand) == (2, len(prompts))
        assert "2 of 8 slots" in caplog.text and "per slot" in caplog.text and "of a test budget" in caplog.text
        waited = _two_turn_episodes(tight, prompts)
        assert tight.stats["waited"] >= len(prompts) - 2
        # `generate` (one turn per prompt, blocking) frees each slot as its turn ends, so the rest get one.
        assert [ids for ids, _, _ in tight.generate(prompts, max_new_tokens=6, temperature=1.0, top_p=1.0,
                                                    seeds=range(len(prompts)))] == [ids for ids, _, _ in one_turn]
    finally:
        tight.close()
    for (a1, a2), (b1, b2) in zip(alone, waited):
        assert a1[0] == b1[0] and a2[0] == b2[0]
        assert torch.allclose(torch.tensor(a1[1] + a2[1]), torch.tensor(b1[1] + b2[1]), atol=1e-5)
    assert len({tuple(first[0]) for first, _ in alone}) > len(prompts) // 2  # sampled, not one answer


def test_the_docs_slot_table_is_the_plan_of_every_mode():
    """docs/distributed.md's table of engine slots (1.5B and 7B shapes; LoRA, QLoRA, full mode; 24,
    80 and 8 x 80 GB) is what the planning functions compute today, and it says what a reader needs:
    the 7B QLoRA on one 80 GB GPU samples through the 4-bit matmul, full mode fits 8 x 80 GB."""
    from skyrl_tool_agent.distributed.memory import slot_table_markdown
    from tests.fixtures.config_files import REPO

    table = slot_table_markdown()
    doc = (REPO / "docs" / "distributed.md").read_text()
    assert f"<!-- slot-table -->\n{table}\n<!-- /slot-table -->" in doc
    rows = {tuple(cell.strip() for cell in line.split("|")[1:3]): line for line in table.splitlines()[2:]}
    assert len(rows) == 6 and "256 of 256" in rows[("Qwen2.5-1.5B", "LoRA")]
    assert "(4-bit matmul)" in rows[("Qwen2.5-7B", "QLoRA")] and "of 32" in rows[("Qwen2.5-7B", "full ZeRO-3")]


def test_model_dims_count_the_parameters_of_real_models():
    """`ModelDims.from_config` (what the engine and the trainer plan with) counts a model's parameters
    and its LoRA adapters exactly (the tiny test model: untied head, adapters of rank 4 everywhere;
    the embedded model: tied head). Qwen2.5-7B's count is checked in tests/test_deepspeed.py."""
    from skyrl_tool_agent.config import ModelConfig
    from skyrl_tool_agent.policy.memory_plan import ModelDims
    from skyrl_tool_agent.policy.qwen import QwenPolicy

    for model, r in ((lora_qwen(), 4), (QwenPolicy.from_config(ModelConfig(), mode="lora").model, 16)):
        dims = ModelDims.from_config(model.get_base_model().config, lora_r=r)
        named = dict(model.named_parameters())
        assert dims.params == sum(p.numel() for n, p in named.items() if "lora_" not in n)
        assert dims.lora_params == sum(p.numel() for n, p in named.items() if "lora_" in n)
