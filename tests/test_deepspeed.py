"""Full mode with DeepSpeed ZeRO-3 on 2 CPU processes (DS_ACCELERATOR=cpu, gloo): the update equals
a single-process update on the same batch, and each rank's rollout engine samples from a gathered
snapshot exactly what one process samples before and after that update. Full mode's launched
training, checkpoints, exports and exact resume are checked on two "nodes" by the DeepSpeed
launcher (tests/test_multinode.py's uninterrupted launch, and the same run stopped twice and resumed):
they were a one-node launch pair here, the same run's checks twice.

The launched test takes ~20 s on 2 busy cores (the launch imports torch, transformers and
DeepSpeed in two processes); it is the only way here to exercise ZeRO-3's collectives, so it is
marked slow rather than mocked. Nothing is compiled: the ranks leave out DeepSpeed's CPU
shared-memory op, which training never uses (`distributed.comm.skip_cpu_shared_memory_op`).

This file is also the worker the update test launches (`__main__` at the bottom).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.fixtures.distributed import (
    REPO,
    free_port,
    launch,
    synthetic_batch,
    update_config,
)


def _deepspeed(script: Path, *args: str, timeout: int = 280, extensions_dir: Path | None = None,
               ) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "deepspeed.launcher.runner", "--num_gpus", "2", "--master_port", str(free_port()),
           str(script), *args]
    return launch(cmd, timeout=timeout, extensions_dir=extensions_dir)


def _update_config(model_dir: Path):
    return update_config(model_dir, "full")


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


# ------------------------------------------------------------------ launched
def _sampling_prompts(tokenizer) -> list[list[int]]:
    """Two tasks of two episodes sharing a system prefix (the engine's root and sibling paths)."""
    system = tokenizer("<|im_start|>system\nYou answer questions about the shop database.<|im_end|>\n")["input_ids"]
    asks = [tokenizer(f"<|im_start|>user\n{q}<|im_end|>\n<|im_start|>assistant\n")["input_ids"]
            for q in ("How many orders?", "List every product name.")]
    return [list(system) + list(a) for a in asks for _ in range(2)]


def _sample(policy) -> dict:
    """The policy's engine: 4 episodes of 12 tokens at temperature 1, seeded 11..14."""
    from skyrl_tool_agent.policy.sampling_params import SamplingParams

    gens = policy.generate(_sampling_prompts(policy.tokenizer), SamplingParams(), max_new_tokens=12,
                           seeds=[11, 12, 13, 14])
    return {"ids": [g.token_ids for g in gens], "logprobs": [g.logprobs for g in gens]}


def _assert_same_samples(got: dict, expected: dict) -> None:
    assert got["ids"] == expected["ids"]
    for a, b in zip(got["logprobs"], expected["logprobs"]):
        assert a == pytest.approx(b, abs=1e-5)


@pytest.mark.slow
@pytest.mark.timeout(600)  # launches of 2 ranks, each bounded by its own timeout
def test_two_rank_zero3_update_equals_single_process_update(tiny_run, tmp_path):
    """Same batch, fp32: ZeRO-3 over 2 ranks (uneven shards, an inert micro-batch, KL reference
    engine, grad clipping, 2 epochs) gives the single-process GRPOTrainer's weights and stats; and
    each rank's rollout engine, fed a snapshot gathered from the shards before and after that
    update, samples the single process's episodes token for token.

    The ranks start beside a stale build lock of DeepSpeed's shared-memory op, as a start killed
    while building it leaves one: torch's extension loader waits for such a lock forever, so the
    ranks must not build the op (`distributed.comm.skip_cpu_shared_memory_op`)."""
    from transformers import AutoModelForCausalLM

    from skyrl_tool_agent.grpo.trainer import GRPOTrainer
    from skyrl_tool_agent.policy.qwen import QwenPolicy

    config = _update_config(tiny_run / "model")
    policy = QwenPolicy.from_config(config.model, mode="full")
    batch = synthetic_batch(policy)
    torch.save(batch, tmp_path / "batch.pt")
    extensions = tmp_path / "torch_extensions"
    (extensions / "deepspeed_shm_comm").mkdir(parents=True)
    (extensions / "deepspeed_shm_comm" / "lock").touch()
    res = _deepspeed(Path(__file__), "update-worker", str(tiny_run / "model"), str(tmp_path), extensions_dir=extensions)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]

    trainer = GRPOTrainer(config, policy, None, None, [], output_dir=tmp_path / "single")
    before = _sample(policy)
    expected = trainer._update(batch)
    after = _sample(policy)
    assert after["logprobs"] != before["logprobs"]  # the update moved what is sampled
    for rank in (0, 1):
        samples = json.loads((tmp_path / f"samples-rank{rank}.json").read_text())
        _assert_same_samples(samples["before"], before)
        _assert_same_samples(samples["after"], after)  # a snapshot one step stale fails here
    got = json.loads((tmp_path / "stats.json").read_text())
    # 2 epochs x 2 micro-batches (3 rows at micro-batch 2), each forward recomputed in backward
    assert got.pop("layer0_calls") == 2 * 2 * 2
    assert set(got) == set(expected)
    for key, value in expected.items():
        # Token means and the loss shares (loss, pg_loss) add up over any split of the rows;
        # ratio_max (token-weighted maxima) depends on how rows are split.
        if key == "ratio_max":
            continue
        assert got[key] == pytest.approx(value, rel=1e-4, abs=1e-6), key
    assert expected["grad_norm"] > 0.01 and expected["kl"] > 0

    from safetensors.torch import load_file

    weights = load_file(str(tmp_path / "weights" / "model.safetensors"))
    state = policy.model.state_dict()
    for name, value in weights.items():
        assert value.dtype == torch.float32
        torch.testing.assert_close(value, state[name], rtol=0, atol=2e-5, msg=name)
    initial = load_file(str(tiny_run / "model" / "model.safetensors"))
    assert max(float((weights[k] - initial[k]).abs().max()) for k in weights) > 1e-4  # the update did something

    # The checkpoint saved after the update, exported on request from its shards (in process):
    # the gathered weights exactly, so the single-process update's too.
    from skyrl_tool_agent.commands.main import main

    checkpoint = tmp_path / "dist" / "checkpoints" / "step-000000"
    assert not (checkpoint / "weights").exists()
    assert main(["export", str(checkpoint), "--output-dir", str(tmp_path / "export"), "--dtype", "float32"]) == 0
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "export").state_dict()
    assert exported.keys() == state.keys()
    for name, value in weights.items():
        assert torch.equal(exported[name], value), name


# ------------------------------------------------------------------ worker
def _update_worker(model_dir: str, out: str) -> None:
    """One `_update` on the saved batch with ZeRO-3 over the launched ranks, fp32 (bf16 off)."""
    from skyrl_tool_agent.distributed.comm import DistContext
    from skyrl_tool_agent.distributed.zero3 import build_deepspeed_policy, resolve_deepspeed_config
    from skyrl_tool_agent.distributed.trainer import DistributedGRPOTrainer

    config = _update_config(Path(model_dir))
    ctx = DistContext.init_deepspeed()
    raw = config.load_deepspeed().model_dump(mode="json", exclude_none=True)
    raw["bf16"] = {"enabled": False}
    ds = resolve_deepspeed_config(raw, config, hidden_size=64, world_size=ctx.world_size)
    policy = build_deepspeed_policy(config, ctx, ds)
    from skyrl_tool_agent.data.loader import build_loader
    from tests.fixtures.tiny_db import SHOP_TASKS

    trainer = DistributedGRPOTrainer(config, policy, None, build_loader(config, SHOP_TASKS), [],
                                     output_dir=Path(out) / "dist", ds_config=ds)
    calls = []
    # a submodule: transformers checkpoints the layer's forward, so hooks on the layer itself run once
    trainer.engine.module.model.layers[0].self_attn.register_forward_pre_hook(lambda *_: calls.append(1))
    policy.prepare_sampling()  # what DataParallelTrainer.collect does on every rank before a collection
    before = _sample(policy)
    stats = trainer._update(torch.load(Path(out) / "batch.pt", weights_only=False))
    policy.prepare_sampling()
    after = _sample(policy)
    (Path(out) / f"samples-rank{ctx.rank}.json").write_text(json.dumps({"before": before, "after": after}))
    policy.save(Path(out) / "weights")
    trainer.save()  # the sharded checkpoint the test exports
    if ctx.is_main:
        (Path(out) / "stats.json").write_text(json.dumps({**stats, "layer0_calls": len(calls)}))
    policy.release_rollout_engine()  # as a run ends (`jobs.run.open_run`): the sampler thread joined first
    ctx.close()


if __name__ == "__main__":
    argv = [a for a in sys.argv[1:] if not a.startswith("--local_rank")]
    if argv[:1] == ["update-worker"]:
        _update_worker(*argv[1:3])
