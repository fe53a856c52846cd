"""Checkpoints of a ZeRO-3 run, in the same `step-XXXXXX` layout as single-process runs:

    step-000010/
      deepspeed/state/   engine.save_checkpoint: each rank's parameter + optimizer shards
      weights/           consolidated 16-bit save_pretrained export + tokenizer (loads with from_pretrained)
      optim.pt           LR schedule (rank 0)
      rng_rank{r}.pt     each rank's RNG states
      trainer_state.json step, data-loader state, world size

Every rank writes into `step-XXXXXX.tmp`; rank 0 renames it once all have finished, so
`--resume auto` never picks up a half-written checkpoint. The ranks' shard files must land on
one filesystem (one node, or a shared filesystem across nodes). Resuming needs the same world
size (the optimizer shards are per rank); `weights/` can seed a fresh run of any size.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from skyrl_tool_agent.config import UserInputError
from skyrl_tool_agent.grpo.checkpoint import STATE_FILE, latest_checkpoint, rng_state, set_rng_state

if TYPE_CHECKING:
    from skyrl_tool_agent.distributed.trainer import DistributedGRPOTrainer

logger = logging.getLogger(__name__)

ENGINE_DIR = "deepspeed"
ENGINE_TAG = "state"


def save_distributed_checkpoint(trainer: DistributedGRPOTrainer) -> Path:
    """Write a checkpoint of `trainer` at its current step (collective: every rank calls it)."""
    ctx = trainer.ctx
    root = trainer.checkpoint_dir
    final = root / f"step-{trainer.step:06d}"
    tmp = root / f"step-{trainer.step:06d}.tmp"
    if ctx.is_main:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    ctx.barrier()
    trainer.engine.save_checkpoint(str(tmp / ENGINE_DIR), tag=ENGINE_TAG, save_latest=False)
    trainer.policy.save(tmp / "weights")
    torch.save(rng_state(), tmp / f"rng_rank{ctx.rank}.pt")
    if ctx.is_main:
        torch.save({"scheduler": trainer.scheduler.state_dict()}, tmp / "optim.pt")
        state = {"step": trainer.step, "loader": trainer.loader.state_dict(), "world_size": ctx.world_size}
        (tmp / STATE_FILE).write_text(json.dumps(state) + "\n")
    ctx.barrier()
    if ctx.is_main:
        shutil.rmtree(final, ignore_errors=True)
        tmp.rename(final)
        keep = trainer.config.training.keep_checkpoints
        for old in sorted(p for p in root.glob("step-*") if not p.name.endswith(".tmp"))[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
        logger.info("checkpoint saved: %s", final)
    ctx.barrier()
    return final


def load_distributed_checkpoint(trainer: DistributedGRPOTrainer, path: str) -> bool:
    """Restore engine (weights + optimizer shards), LR schedule, RNG, loader and step from `path`
    ('auto' = the latest complete checkpoint, if any). Collective; False when there is none."""
    ctx = trainer.ctx
    if ctx.is_main:
        found = latest_checkpoint(trainer.checkpoint_dir) if path == "auto" else Path(path)
        chosen = str(found) if found is not None else None
    else:
        chosen = None
    chosen = ctx.broadcast_object(chosen)  # one decision, even if a rank sees the directory late
    if chosen is None:
        logger.info("no checkpoint under %s: starting fresh", trainer.checkpoint_dir)
        return False
    ckpt = Path(chosen)
    if not (ckpt / STATE_FILE).is_file() or not (ckpt / ENGINE_DIR / ENGINE_TAG).is_dir():
        raise UserInputError(f"not a full-mode (DeepSpeed) checkpoint: {ckpt}")
    state = json.loads((ckpt / STATE_FILE).read_text())
    if state.get("world_size") != ctx.world_size:
        raise UserInputError(
            f"{ckpt} was written by {state.get('world_size')} ranks, this run has {ctx.world_size}: ZeRO-3 "
            f"optimizer shards are per rank; relaunch with the same count, or start fresh from {ckpt / 'weights'} "
            "(--set model.name_or_path=...)"
        )
    load_path, _ = trainer.engine.load_checkpoint(
        str(ckpt / ENGINE_DIR), tag=ENGINE_TAG, load_optimizer_states=True, load_lr_scheduler_states=False
    )
    if load_path is None:
        raise UserInputError(f"DeepSpeed could not load the engine state under {ckpt / ENGINE_DIR}")
    trainer.scheduler.load_state_dict(torch.load(ckpt / "optim.pt", weights_only=False)["scheduler"])
    rng_file = ckpt / f"rng_rank{ctx.rank}.pt"
    if rng_file.is_file():
        set_rng_state(torch.load(rng_file, weights_only=False))
    trainer.loader.load_state_dict(state["loader"])
    trainer.step = int(state["step"])
    logger.info("resumed from %s at step %d", ckpt, trainer.step)
    return True
