"""LoRA data parallel on 2 CPU processes (torchrun, gloo): the update equals a single-process update
on the same batch, and a checkpoint rank 0 wrote resumes on every rank to the update an
uninterrupted process makes next. A launched run's training, checkpoints and exact resume over
two "nodes" are tests/test_multinode.py's (in full mode: the same `DataParallelTrainer`).

The launched tests are marked slow (each launch imports torch and transformers in two processes);
they are the only way to exercise the collectives. This file is also the worker the update test
launches (`__main__` at the bottom).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.fixtures.distributed import (
    launch,
    synthetic_batch,
    update_config,
)


def _torchrun(script: Path, *args: str, timeout: int = 280) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", str(script), *args]
    return launch(cmd, timeout=timeout)


def _update_config(model_dir: Path):
    # max_grad_norm below the gradient's norm: clipping acts on the summed gradient
    return update_config(model_dir, "lora", max_grad_norm=0.05, lora={"r": 4, "alpha": 8, "dropout": 0.0})


def test_gradient_accumulation_is_refused_under_a_launcher(tiny_run):
    from skyrl_tool_agent.config import UserInputError
    from skyrl_tool_agent.distributed.data_parallel import DataParallelTrainer

    config = _update_config(tiny_run / "model")
    config.training.gradient_accumulation = 2
    with pytest.raises(UserInputError, match=r"^training\.gradient_accumulation: .*distributed launcher"):
        DataParallelTrainer(config, None, None, None, [], output_dir=tiny_run / "unused", ctx=None)  # type: ignore[arg-type]


# ------------------------------------------------------------------ launched
@pytest.mark.slow
@pytest.mark.timeout(600)  # launches of 2 ranks, each bounded by its own timeout
def test_two_rank_lora_update_equals_single_process_update(tiny_run, tmp_path):
    """Same batches, fp32: 5 rows of different lengths (shards of 3 and 2 rows at micro-batch 2,
    KL against the adapter-free model, entropy bonus, clipping, 2 epochs), then 1 row (rank 1's
    shard is empty): the ranks' adapters equal each other and the single-process GRPOTrainer's.
    Then the checkpoint rank 0 saved is resumed by a fresh replica on every rank (other adapters
    drawn first) and a third batch's update equals the single process's third: adapters and
    optimizer moments restored on every rank (a rank that kept its own would leave the replicas
    apart, an optimizer not restored would change the update)."""
    from peft import get_peft_model_state_dict
    from safetensors.torch import load_file

    from skyrl_tool_agent.grpo.checkpoint import seed_everything
    from skyrl_tool_agent.grpo.trainer import GRPOTrainer
    from skyrl_tool_agent.policy.qwen import QwenPolicy

    config = _update_config(tiny_run / "model")
    seed_everything(1)  # rank 0's seed in the worker; rank 1 draws other adapters, replaced by rank 0's
    policy = QwenPolicy.from_config(config.model, mode="lora")
    batches = [synthetic_batch(policy), synthetic_batch(policy, seed=1, lengths=(26,)), synthetic_batch(policy, seed=2)]
    torch.save(batches, tmp_path / "batches.pt")
    res = _torchrun(Path(__file__), "update-worker", str(tiny_run / "model"), str(tmp_path))
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]

    trainer = GRPOTrainer(config, policy, None, None, [], output_dir=tmp_path / "single")
    expected = [trainer._update(batch) for batch in batches]
    got = json.loads((tmp_path / "stats.json").read_text())
    assert got.pop("replica_max_diff") == 0.0  # the same update on every rank
    assert got.pop("resumed_from") == "step-000000" and len(got["updates"]) == 3
    for want, have in zip(expected, got["updates"], strict=True):
        assert set(have) == set(want)
        for key, value in want.items():
            if key != "ratio_max":  # a token-weighted maximum depends on how rows are split
                assert have[key] == pytest.approx(value, rel=1e-4, abs=1e-6), key
    assert expected[0]["grad_norm"] > 2 * config.training.max_grad_norm and expected[0]["kl"] > 0

    adapters = load_file(str(tmp_path / "weights" / "adapter_model.safetensors"))
    state = get_peft_model_state_dict(policy.model)
    assert adapters.keys() == state.keys()
    for name, value in adapters.items():  # AdamW's first steps (~lr each) magnify float noise in tiny gradients
        torch.testing.assert_close(value, state[name], rtol=0, atol=2e-5, msg=name)


# ------------------------------------------------------------------ worker
def _update_worker(model_dir: str, out: str) -> None:
    """Two `_update`s on the saved batches over the launched ranks and a checkpoint; a fresh replica
    per rank resumes it and makes the third `_update`; rank 0 writes the stats."""
    from skyrl_tool_agent.data.loader import build_loader
    from skyrl_tool_agent.distributed.comm import DistContext
    from skyrl_tool_agent.distributed.replicated import ReplicatedGRPOTrainer, ReplicatedPolicy
    from skyrl_tool_agent.grpo.checkpoint import seed_everything
    from tests.fixtures.tiny_db import SHOP_TASKS

    config = _update_config(Path(model_dir))
    ctx = DistContext.init(torch.device("cpu"))

    def replica_trainer(seed: int) -> ReplicatedGRPOTrainer:
        seed_everything(seed + ctx.rank)  # different adapters per rank: the trainer must start all from rank 0's
        return ReplicatedGRPOTrainer(config, ReplicatedPolicy.on_rank(config, ctx), None, build_loader(config, SHOP_TASKS),
                                     [], output_dir=Path(out) / "dist")

    batches = torch.load(Path(out) / "batches.pt", weights_only=False)
    trainer = replica_trainer(1)
    stats = [trainer._update(batch) for batch in batches[:2]]
    checkpoint = trainer.save()
    trainer = replica_trainer(100)  # other adapters, a fresh optimizer: all of it must come from the checkpoint
    assert trainer.resume(str(checkpoint))
    stats.append(trainer._update(batches[2]))
    policy = trainer.policy
    policy.save(Path(out) / "weights")
    flat = torch.cat([p.detach().reshape(-1) for p in policy.trainable_parameters()])
    replicas = ctx.all_gather_object(flat)
    if ctx.is_main:
        diff = max(float((r - flat).abs().max()) for r in replicas)
        (Path(out) / "stats.json").write_text(json.dumps({"updates": stats, "replica_max_diff": diff,
                                                          "resumed_from": checkpoint.name}))
    ctx.close()


if __name__ == "__main__":
    if sys.argv[1:2] == ["update-worker"]:
        _update_worker(*sys.argv[2:4])
