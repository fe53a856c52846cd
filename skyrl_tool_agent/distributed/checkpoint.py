"""Checkpoints of a ZeRO-3 run, in the same `step-XXXXXX` layout as single-process runs:

    step-000010/
      deepspeed/state/   engine.save_checkpoint: each rank's parameter + optimizer shards
      model/             the model's config.json and tokenizer, no weights (what `export` builds on)
      optim.pt           LR schedule (rank 0; loaded with torch.load(weights_only=True))
      rng_rank{r}.json   each rank's RNG states, as plain JSON data
      trainer_state.json step, data-loader state, world size
      config.yaml        the run's resolved config, which `--resume` compares with the launch's
      manifest.json      sha256 of every file above (each rank hashes its share, by size, once all
                         ranks have written; rank 0 writes them)

Every rank writes into `step-XXXXXX.tmp`; rank 0 writes the manifest and renames it once all have
finished (as `grpo.checkpoint`). The shard files must land on one filesystem, and resuming needs
the same world size (the optimizer shards are per rank).

No consolidated export is written at a save (~15 GB and a full gather per checkpoint for 7B): the
run's end writes final/, and `export_consolidated` builds one from any checkpoint on request.
"""

from __future__ import annotations

import json
import logging
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from skyrl_tool_agent.config import UserInputError
from skyrl_tool_agent.data.json_input import loads_bounded
from skyrl_tool_agent.distributed.data_parallel import balanced_shards
from skyrl_tool_agent.grpo.checkpoint import (
    CONFIG_FILE,
    MANIFEST,
    STATE_FILE,
    CheckpointError,
    hashable_as_recorded,
    latest_checkpoint,
    record_verified,
    rng_state,
    set_rng_state,
    verify_checkpoint,
    world_size_problem,
    write_manifest,
)
from skyrl_tool_agent.policy.device import DTYPES
from skyrl_tool_agent.policy.manifest import file_sha256, tree_sizes

logger = logging.getLogger(__name__)

ENGINE_DIR = "deepspeed"
ENGINE_TAG = "state"
MODEL_DIR = "model"  # config.json + tokenizer, no weights
EXPORT_RECORD = "exported_from.json"


@dataclass(frozen=True)
class CheckpointParts:
    """What a ZeRO-3 checkpoint saves and restores (the trainer passes its own pieces, so this
    module needs nothing from the trainer's)."""

    ctx: Any  # distributed.comm.DistContext
    engine: Any  # the DeepSpeed engine (weights + optimizer shards)
    policy: Any  # DeepSpeedPolicy: `save_model_files(dir)` writes config.json + tokenizer (rank 0)
    scheduler: Any  # the LR schedule
    loader: Any  # TaskDataLoader (state_dict / load_state_dict)
    root: Path  # the run's checkpoint directory
    config_yaml: str  # the run's resolved config, recorded for `--resume` to compare with


def save_distributed_checkpoint(parts: CheckpointParts, step: int, *, keep: int, elapsed_s: float) -> Path:
    """Write a checkpoint at `step` keeping the newest `keep` (collective: every rank calls it);
    `elapsed_s`: the time budget's clock (rank 0's), which a resumed run goes on counting."""
    ctx = parts.ctx
    root = parts.root
    final = root / f"step-{step:06d}"
    tmp = root / f"step-{step:06d}.tmp"
    if ctx.is_main:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    ctx.barrier()
    parts.engine.save_checkpoint(str(tmp / ENGINE_DIR), tag=ENGINE_TAG, save_latest=False)
    (tmp / f"rng_rank{ctx.rank}.json").write_text(json.dumps(rng_state()) + "\n")
    if ctx.is_main:
        parts.policy.save_model_files(tmp / MODEL_DIR)
        torch.save({"scheduler": parts.scheduler.state_dict()}, tmp / "optim.pt")
        state = {"step": step, "loader": parts.loader.state_dict(), "world_size": ctx.world_size,
                 "elapsed_s": elapsed_s}
        (tmp / STATE_FILE).write_text(json.dumps(state) + "\n")
        (tmp / CONFIG_FILE).write_text(parts.config_yaml, encoding="utf-8")
    ctx.barrier()
    hashes = hashed_in_parallel(ctx, tmp)  # every rank has written its files (barrier above)
    if ctx.is_main:
        write_manifest(tmp, hashes)
        shutil.rmtree(final, ignore_errors=True)
        tmp.rename(final)
        for old in sorted(p for p in root.glob("step-*") if not p.name.endswith(".tmp"))[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
        logger.info("checkpoint saved: %s", final)
    ctx.barrier()
    return final


def hashed_in_parallel(ctx: Any, directory: Path) -> dict[str, str]:
    """The sha256 of every file under `directory` (as `write_manifest` records them), each rank
    hashing its share, balanced by size: a 7B full checkpoint is ~120 GB, which one rank alone
    would read at every save. Collective; every rank gets all of them."""
    sizes = tree_sizes(directory, exclude=(MANIFEST,))
    names = list(sizes)
    share = balanced_shards([sizes[name] for name in names], ctx.world_size)[ctx.rank]
    hashes: dict[str, str] = {}
    for part in ctx.all_gather_object({names[i]: file_sha256(directory / names[i]) for i in share}):
        hashes.update(part)
    return {name: hashes[name] for name in names}


def verify_in_parallel(ctx: Any, root: Path, path: str) -> None:
    """Hash the checkpoint `agreed_checkpoint` looks at first on every rank, each its share, when
    its sizes match the manifest, so rank 0 chooses without reading it again; anything else rank 0
    verifies alone. Collective."""
    target = None
    if ctx.is_main:
        newest = sorted(p for p in root.glob("step-*") if p.is_dir() and not p.name.endswith(".tmp"))[-1:]
        candidate = (newest or [None])[0] if path == "auto" else Path(path)
        target = str(candidate) if candidate is not None and hashable_as_recorded(candidate) is not None else None
    target = ctx.broadcast_object(target)
    if target is not None:
        hashes = hashed_in_parallel(ctx, Path(target))
        if ctx.is_main:
            record_verified(Path(target), hashes)


def agreed_checkpoint(ctx: Any, root: Path, path: str) -> Path | None:
    """The checkpoint every rank resumes from: `path`, or with 'auto' the latest intact one under
    `root` (None: none). Rank 0 chooses and tells the others, so all load the same one and a bad
    checkpoint is a CheckpointError on every rank. Collective."""
    verify_in_parallel(ctx, root, path)
    decision: tuple[str | None, str | None] = (None, None)  # (checkpoint, or why none can be used)
    if ctx.is_main:
        try:
            found = latest_checkpoint(root) if path == "auto" else Path(path)
            if found is not None:
                verify_checkpoint(found)
            decision = (str(found) if found is not None else None, None)
        except CheckpointError as exc:
            decision = (None, str(exc))
    chosen, problem = ctx.broadcast_object(decision)
    if problem is not None:
        raise CheckpointError(problem)
    if chosen is None:
        logger.info("no checkpoint under %s: starting fresh", root)
        return None
    return Path(chosen)


def load_distributed_checkpoint(parts: CheckpointParts, path: str) -> tuple[int, float] | None:
    """Restore engine (weights + optimizer shards), LR schedule, RNG and loader from `path` ('auto' =
    the latest complete checkpoint, if any) and return its step and the time budget's clock then
    (seconds). Collective; None when there is none."""
    ctx = parts.ctx
    ckpt = agreed_checkpoint(ctx, parts.root, path)
    if ckpt is None:
        return None
    if not (ckpt / STATE_FILE).is_file() or not (ckpt / ENGINE_DIR / ENGINE_TAG).is_dir():
        raise UserInputError(f"not a full-mode (DeepSpeed) checkpoint: {ckpt}")
    try:  # checked before anything is restored: a crafted state is one line, not a traceback
        state = loads_bounded((ckpt / STATE_FILE).read_text(encoding="utf-8"))
        step, elapsed_s, loader_state = int(state["step"]), float(state.get("elapsed_s", 0.0)), state["loader"]
    except (OSError, ValueError, KeyError, TypeError, AttributeError, ArithmeticError) as exc:
        raise CheckpointError(f"cannot load {ckpt}: {STATE_FILE}: {type(exc).__name__}: {exc}") from exc
    if state.get("world_size") != ctx.world_size:
        raise UserInputError(world_size_problem(ckpt, state.get("world_size"), ctx.world_size))
    load_path, _ = parts.engine.load_checkpoint(
        str(ckpt / ENGINE_DIR), tag=ENGINE_TAG, load_optimizer_states=True, load_lr_scheduler_states=False
    )
    if load_path is None:
        raise UserInputError(f"DeepSpeed could not load the engine state under {ckpt / ENGINE_DIR}")
    try:  # plain tensors and containers only: a crafted optim.pt cannot run code
        scheduler_state = torch.load(ckpt / "optim.pt", weights_only=True)["scheduler"]
        rng_file = ckpt / f"rng_rank{ctx.rank}.json"
        rng = json.loads(rng_file.read_text()) if rng_file.is_file() else None
    except Exception as exc:  # noqa: BLE001 - whatever a bad file raises, the user gets one line
        raise CheckpointError(f"cannot load {ckpt}: {type(exc).__name__}: {exc}") from exc
    parts.scheduler.load_state_dict(scheduler_state)
    if rng is not None:
        set_rng_state(rng)
    parts.loader.load_state_dict(loader_state)
    logger.info("resumed from %s at step %d (%.1f min of the time budget spent)", ckpt, step, elapsed_s / 60)
    return step, elapsed_s


def is_sharded_checkpoint(path: Path) -> bool:
    """Whether `path` is a full-mode (ZeRO-3) checkpoint `step-XXXXXX/` (its engine shards)."""
    return (path / ENGINE_DIR / ENGINE_TAG).is_dir()


def export_consolidated(checkpoint: Path, out: Path, *, dtype: str = "bfloat16") -> dict[str, Any]:
    """The model a full-mode checkpoint holds, consolidated from its ZeRO-3 shards into one
    `save_pretrained` directory at `out`, with no launch and no GPU; the files must match the
    manifest first (DeepSpeed unpickles the shards). The fp32 master weights are read whole into
    RAM and rounded to `dtype` as the engine rounds, so the last checkpoint's bf16 export equals
    final/. Returns what was done."""
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint
    from transformers import AutoConfig, AutoModelForCausalLM

    if not is_sharded_checkpoint(checkpoint) or not (checkpoint / MODEL_DIR / "config.json").is_file():
        raise UserInputError(f"{checkpoint}: not a full-mode (ZeRO-3) checkpoint step-XXXXXX/ "
                             f"({ENGINE_DIR}/{ENGINE_TAG}/ and {MODEL_DIR}/config.json)")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UserInputError(f"--output-dir {out}: exists and is not empty; give a new directory")
    verify_checkpoint(checkpoint)
    state = loads_bounded((checkpoint / STATE_FILE).read_text(encoding="utf-8"))
    step = state.get("step") if isinstance(state, dict) else None
    torch_dtype = DTYPES[dtype]
    fp32 = get_fp32_state_dict_from_zero_checkpoint(str(checkpoint / ENGINE_DIR), tag=ENGINE_TAG)
    weights = {name: tensor.to(torch_dtype) for name, tensor in fp32.items()}
    del fp32  # bf16: half the RAM from here on
    model_config = AutoConfig.from_pretrained(checkpoint / MODEL_DIR)
    with torch.device("meta"):  # no second copy of the weights: the state dict's tensors are assigned
        model = AutoModelForCausalLM.from_config(model_config, dtype=torch_dtype)
    _, unexpected = model.load_state_dict(weights, strict=False, assign=True)
    model.tie_weights()  # a tied head shares the embedding, which the shards hold once
    missing = [name for name, param in model.named_parameters() if param.is_meta]
    if missing or unexpected:
        raise CheckpointError(f"{checkpoint}: its shards do not fit its {MODEL_DIR}/config.json (missing "
                              f"{missing[:3]}, unexpected {unexpected[:3]})")
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    for source in (checkpoint / MODEL_DIR).iterdir():  # the tokenizer, as the run saved it
        if source.is_file() and not (out / source.name).exists():
            shutil.copy2(source, out / source.name)
    record = {"checkpoint": str(checkpoint.resolve()), "step": step, "dtype": dtype,
              "parameters": sum(p.numel() for p in model.parameters())}
    (out / EXPORT_RECORD).write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    logger.info("exported %s (step %s) consolidated from its ZeRO-3 shards: %s (%s)", checkpoint, step, out, dtype)
    return record
