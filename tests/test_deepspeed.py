"""Full mode with DeepSpeed ZeRO-3, without a launch: the DeepSpeed config's `auto` values filled
from the training config, the update's shards over ranks, the inert micro-batch of a rank with no
rows. The update over 2 launched ranks (equal to one process's) is tests/test_update_over_ranks.py's;
launched training, checkpoints, exports and exact resume are tests/test_multinode.py's.
"""

from __future__ import annotations

import json

import pytest
import torch

from tests.fixtures.distributed import REPO, synthetic_batch


# ------------------------------------------------------------------ no launch
def test_deepspeed_config_autos_are_filled_from_the_training_config():
    from skyrl_tool_agent.config import UserInputError, load_config
    from skyrl_tool_agent.distributed.zero3 import model_dtype, resolve_deepspeed_config

    config = load_config(REPO / "configs", ["training.mode=full", "training.micro_batch_size=3",
                                            "training.tasks_per_step=4", "grpo.group_size=4", "training.max_grad_norm=0.5"])
    ds = resolve_deepspeed_config(config.load_deepspeed(), config, hidden_size=64, world_size=2)
    assert ds["train_micro_batch_size_per_gpu"] == 3
    assert ds["gradient_accumulation_steps"] == config.nominal_gradient_accumulation() == 6  # ceil(16 / 3)
    assert ds["train_batch_size"] == 3 * 6 * 2
    assert ds["gradient_clipping"] == 0.5
    zero = ds["zero_optimization"]
    assert zero["stage"] == 3 and zero["reduce_bucket_size"] == 64 * 64
    assert zero["stage3_prefetch_bucket_size"] == int(0.9 * 64 * 64) and zero["stage3_param_persistence_threshold"] == 640
    assert zero["stage3_gather_16bit_weights_on_model_save"] is True
    assert zero["stage3_max_live_parameters"] == 1_000_000_000  # keys the schema does not type pass through
    assert model_dtype(ds) == torch.bfloat16
    assert "auto" not in json.dumps(ds)
    with pytest.raises(UserInputError, match=r"zero_optimization\.sub_group_size"):
        resolve_deepspeed_config({"zero_optimization": {"stage": 3, "sub_group_size": "auto"}}, config,
                                 hidden_size=64, world_size=2)


def test_update_shards_cover_every_row_once_and_balance_tokens():
    from skyrl_tool_agent.distributed.data_parallel import balanced_shards

    lengths = [41, 35, 30, 22, 17, 90, 5, 5]
    for parts in (1, 2, 3, 8, 10):
        shards = balanced_shards(lengths, parts)
        assert sorted(r for s in shards for r in s) == list(range(len(lengths)))
        loads = [sum(lengths[r] for r in s) for s in shards]
        assert max(loads) - min(loads) <= max(lengths)  # greedy LPT bound
    assert balanced_shards(lengths, 2) == balanced_shards(list(lengths), 2)  # deterministic


def test_inert_micro_batch_adds_no_loss_tokens(tiny_run):
    from skyrl_tool_agent.distributed.data_parallel import inert_micro_batch
    from tests.fixtures.tiny_policy import tiny_policy

    batch = synthetic_batch(tiny_policy(tiny_run / "model", "full"))
    inert = inert_micro_batch(batch)
    assert len(inert) == 1 and inert.input_ids.shape[1] == 17  # the shortest row, trimmed
    assert not inert.loss_mask.any() and not inert.advantages.any()
    assert batch.loss_mask.any()  # the source batch is untouched
