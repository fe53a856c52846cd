"""The update over 2 CPU ranks (gloo) equals a single-process update on the same batches, in both
backends, and what each rank then samples is what one process samples:

- LoRA data parallel (`ReplicatedGRPOTrainer`): 5 rows, then 1 (rank 1's shard empty), then a
  checkpoint rank 0 wrote, resumed by a fresh replica on every rank, and a third batch;
- full mode with DeepSpeed ZeRO-3 (`DistributedGRPOTrainer`): one update, each rank's rollout
  engine fed a snapshot gathered from the shards before and after it, and its checkpoint exported.

One launch by DeepSpeed's launcher runs both workers in turn on the same 2 ranks: a rank's start-up
(imports of torch, transformers, peft and DeepSpeed, ~5 CPU-s) is most of a launch's cost, and two
launches paid it twice. The ranks start beside a stale build lock of DeepSpeed's shared-memory op,
as a start killed while building it leaves one: torch's extension loader waits for such a lock
forever, so the ranks must not build the op (`distributed.comm.skip_cpu_shared_memory_op`).
Launched training, checkpoints, exports and exact resume over two "nodes" (torchrun and DeepSpeed's
launcher) are tests/test_multinode.py's. The launched tests are marked slow; they are the only way
to exercise the collectives; gradient accumulation under a launcher is refused. This file is also
the worker the launch runs (`__main__` at the bottom).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.fixtures.distributed import free_port, launch, synthetic_batch, update_config


def _deepspeed(script: Path, *args: str, timeout: int = 280, extensions_dir: Path | None = None,
               ) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "deepspeed.launcher.runner", "--num_gpus", "2", "--master_port", str(free_port()),
           str(script), *args]
    return launch(cmd, timeout=timeout, extensions_dir=extensions_dir)


def lora_config(model_dir: Path):
    # max_grad_norm below the gradient's norm: clipping acts on the summed gradient
    return update_config(model_dir, "lora", max_grad_norm=0.05, lora={"r": 4, "alpha": 8, "dropout": 0.0})


def full_config(model_dir: Path):
    return update_config(model_dir, "full")


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


def test_gradient_accumulation_is_refused_under_a_launcher(tiny_run):
    from skyrl_tool_agent.config import UserInputError
    from skyrl_tool_agent.distributed.data_parallel import DataParallelTrainer

    config = lora_config(tiny_run / "model")
    config.training.gradient_accumulation = 2
    with pytest.raises(UserInputError, match=r"^training\.gradient_accumulation: .*distributed launcher"):
        DataParallelTrainer(config, None, None, None, [], output_dir=tiny_run / "unused", ctx=None)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def launched(tiny_run, tmp_path_factory):
    """The batches saved, the launch run: (its output directory, the LoRA policy and batches, the
    full-mode policy and batch), the policies as the ranks started from them."""
    from skyrl_tool_agent.grpo.checkpoint import seed_everything
    from skyrl_tool_agent.policy.qwen import QwenPolicy

    out, model = tmp_path_factory.mktemp("updates"), tiny_run / "model"
    seed_everything(1)  # rank 0's seed in the LoRA worker; rank 1 draws other adapters, replaced by rank 0's
    lora = QwenPolicy.from_config(lora_config(model).model, mode="lora")
    batches = [synthetic_batch(lora), synthetic_batch(lora, seed=1, lengths=(26,)), synthetic_batch(lora, seed=2)]
    torch.save(batches, out / "batches.pt")
    full = QwenPolicy.from_config(full_config(model).model, mode="full")
    batch = synthetic_batch(full)
    torch.save(batch, out / "batch.pt")
    extensions = out / "torch_extensions"
    (extensions / "deepspeed_shm_comm").mkdir(parents=True)
    (extensions / "deepspeed_shm_comm" / "lock").touch()
    res = _deepspeed(Path(__file__), "updates-worker", str(model), str(out), extensions_dir=extensions)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    return out, (lora, batches), (full, batch)


@pytest.mark.slow
@pytest.mark.timeout(600)  # a launch of 2 ranks, bounded by its own timeout
def test_two_rank_lora_update_equals_single_process_update(launched, tiny_run, tmp_path):
    """Same batches, fp32: 5 rows of different lengths (shards of 3 and 2 rows at micro-batch 2,
    KL against the adapter-free model, entropy bonus, clipping, 2 epochs), then 1 row (rank 1's
    shard is empty): the ranks' adapters equal each other and the single-process GRPOTrainer's.
    Then the checkpoint rank 0 saved is resumed by a fresh replica on every rank (other adapters
    drawn first) and a third batch's update equals the single process's third: adapters and
    optimizer moments restored on every rank (a rank that kept its own would leave the replicas
    apart, an optimizer not restored would change the update)."""
    from peft import get_peft_model_state_dict
    from safetensors.torch import load_file

    from skyrl_tool_agent.grpo.trainer import GRPOTrainer

    out, (policy, batches), _ = launched
    config = lora_config(tiny_run / "model")
    trainer = GRPOTrainer(config, policy, None, None, [], output_dir=tmp_path / "single")
    expected = [trainer._update(batch) for batch in batches]
    got = json.loads((out / "lora" / "stats.json").read_text())
    assert got.pop("replica_max_diff") == 0.0  # the same update on every rank
    assert got.pop("resumed_from") == "step-000000" and len(got["updates"]) == 3
    for want, have in zip(expected, got["updates"], strict=True):
        assert set(have) == set(want)
        for key, value in want.items():
            if key != "ratio_max":  # a token-weighted maximum depends on how rows are split
                assert have[key] == pytest.approx(value, rel=1e-4, abs=1e-6), key
    assert expected[0]["grad_norm"] > 2 * config.training.max_grad_norm and expected[0]["kl"] > 0

    adapters = load_file(str(out / "lora" / "weights" / "adapter_model.safetensors"))
    state = get_peft_model_state_dict(policy.model)
    assert adapters.keys() == state.keys()
    for name, value in adapters.items():  # AdamW's first steps (~lr each) magnify float noise in tiny gradients
        torch.testing.assert_close(value, state[name], rtol=0, atol=2e-5, msg=name)


@pytest.mark.slow
@pytest.mark.timeout(600)  # a launch of 2 ranks, bounded by its own timeout
def test_two_rank_zero3_update_equals_single_process_update(launched, tiny_run, tmp_path):
    """Same batch, fp32: ZeRO-3 over 2 ranks (uneven shards, an inert micro-batch, KL reference
    engine, grad clipping, 2 epochs) gives the single-process GRPOTrainer's weights and stats; and
    each rank's rollout engine, fed a snapshot gathered from the shards before and after that
    update, samples the single process's episodes token for token."""
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from skyrl_tool_agent.commands.main import main
    from skyrl_tool_agent.grpo.trainer import GRPOTrainer

    launch_out, _, (policy, batch) = launched
    out = launch_out / "zero3"
    trainer = GRPOTrainer(full_config(tiny_run / "model"), policy, None, None, [], output_dir=tmp_path / "single")
    before = _sample(policy)
    expected = trainer._update(batch)
    after = _sample(policy)
    assert after["logprobs"] != before["logprobs"]  # the update moved what is sampled
    for rank in (0, 1):
        samples = json.loads((out / f"samples-rank{rank}.json").read_text())
        _assert_same_samples(samples["before"], before)
        _assert_same_samples(samples["after"], after)  # a snapshot one step stale fails here
    got = json.loads((out / "stats.json").read_text())
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

    weights = load_file(str(out / "weights" / "model.safetensors"))
    state = policy.model.state_dict()
    for name, value in weights.items():
        assert value.dtype == torch.float32
        torch.testing.assert_close(value, state[name], rtol=0, atol=2e-5, msg=name)
    initial = load_file(str(tiny_run / "model" / "model.safetensors"))
    assert max(float((weights[k] - initial[k]).abs().max()) for k in weights) > 1e-4  # the update did something

    # The checkpoint saved after the update, exported on request from its shards (in process):
    # the gathered weights exactly, so the single-process update's too.
    checkpoint = out / "dist" / "checkpoints" / "step-000000"
    assert not (checkpoint / "weights").exists()
    assert main(["export", str(checkpoint), "--output-dir", str(tmp_path / "export"), "--dtype", "float32"]) == 0
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "export").state_dict()
    assert exported.keys() == state.keys()
    for name, value in weights.items():
        assert torch.equal(exported[name], value), name


# ------------------------------------------------------------------ worker
def _lora_updates(ctx, model_dir: Path, out: Path) -> None:
    """Two `_update`s on the saved batches over the ranks and a checkpoint; a fresh replica per rank
    resumes it and makes the third `_update`; rank 0 writes the stats."""
    from skyrl_tool_agent.data.loader import build_loader
    from skyrl_tool_agent.distributed.replicated import ReplicatedGRPOTrainer, ReplicatedPolicy
    from skyrl_tool_agent.grpo.checkpoint import seed_everything
    from tests.fixtures.tiny_db import SHOP_TASKS

    config = lora_config(model_dir)

    def replica_trainer(seed: int) -> ReplicatedGRPOTrainer:
        seed_everything(seed + ctx.rank)  # different adapters per rank: the trainer must start all from rank 0's
        return ReplicatedGRPOTrainer(config, ReplicatedPolicy.on_rank(config, ctx), None, build_loader(config, SHOP_TASKS),
                                     [], output_dir=out / "dist")

    batches = torch.load(out.parent / "batches.pt", weights_only=False)
    trainer = replica_trainer(1)
    stats = [trainer._update(batch) for batch in batches[:2]]
    checkpoint = trainer.save()
    trainer = replica_trainer(100)  # other adapters, a fresh optimizer: all of it must come from the checkpoint
    assert trainer.resume(str(checkpoint))
    stats.append(trainer._update(batches[2]))
    policy = trainer.policy
    policy.save(out / "weights")
    flat = torch.cat([p.detach().reshape(-1) for p in policy.trainable_parameters()])
    replicas = ctx.all_gather_object(flat)
    if ctx.is_main:
        diff = max(float((r - flat).abs().max()) for r in replicas)
        (out / "stats.json").write_text(json.dumps({"updates": stats, "replica_max_diff": diff,
                                                    "resumed_from": checkpoint.name}))


def _zero3_update(ctx, model_dir: Path, out: Path) -> None:
    """One `_update` on the saved batch with ZeRO-3 over the ranks, fp32 (bf16 off)."""
    from skyrl_tool_agent.data.loader import build_loader
    from skyrl_tool_agent.distributed.trainer import DistributedGRPOTrainer
    from skyrl_tool_agent.distributed.zero3 import build_deepspeed_policy, resolve_deepspeed_config
    from tests.fixtures.tiny_db import SHOP_TASKS

    config = full_config(model_dir)
    raw = config.load_deepspeed().model_dump(mode="json", exclude_none=True)
    raw["bf16"] = {"enabled": False}
    ds = resolve_deepspeed_config(raw, config, hidden_size=64, world_size=ctx.world_size)
    policy = build_deepspeed_policy(config, ctx, ds)
    trainer = DistributedGRPOTrainer(config, policy, None, build_loader(config, SHOP_TASKS), [],
                                     output_dir=out / "dist", ds_config=ds)
    calls = []
    # a submodule: transformers checkpoints the layer's forward, so hooks on the layer itself run once
    trainer.engine.module.model.layers[0].self_attn.register_forward_pre_hook(lambda *_: calls.append(1))
    policy.prepare_sampling()  # what DataParallelTrainer.collect does on every rank before a collection
    before = _sample(policy)
    stats = trainer._update(torch.load(out.parent / "batch.pt", weights_only=False))
    policy.prepare_sampling()
    after = _sample(policy)
    (out / f"samples-rank{ctx.rank}.json").write_text(json.dumps({"before": before, "after": after}))
    policy.save(out / "weights")
    trainer.save()  # the sharded checkpoint the test exports
    if ctx.is_main:
        (out / "stats.json").write_text(json.dumps({**stats, "layer0_calls": len(calls)}))


def _updates_worker(model_dir: str, out: str) -> None:
    """LoRA's updates, then ZeRO-3's, on one process group (DeepSpeed's, gloo on the CPU)."""
    from skyrl_tool_agent.distributed.comm import DistContext

    ctx = DistContext.init_deepspeed()
    for name, part in (("lora", _lora_updates), ("zero3", _zero3_update)):
        (Path(out) / name).mkdir(exist_ok=True)
        part(ctx, Path(model_dir), Path(out) / name)
    ctx.close()


if __name__ == "__main__":
    argv = [a for a in sys.argv[1:] if not a.startswith("--local_rank")]
    if argv[:1] == ["updates-worker"]:
        _updates_worker(*argv[1:3])
