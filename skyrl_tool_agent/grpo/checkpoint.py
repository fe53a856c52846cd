"""Checkpoints: weights (adapter or model), optimizer, scheduler, RNG states, data-loader state, step.

`step-XXXXXX/` holds

    weights/             save_pretrained (LoRA adapter or full model; safetensors)
    optim.pt             optimizer and scheduler state dicts: tensors and plain containers only
    rng.json             Python, NumPy and torch RNG states as plain lists and ints
    trainer_state.json   step and data-loader state (JSON)
    config.yaml          the run's resolved config, which `--resume` compares (`resume_settings_problem`)
    manifest.json        sha256 and size of every other file, written last

It is written to `step-XXXXXX.tmp` and renamed when complete, so `--resume auto` never picks up a
half-written one (e.g. after `kill -9` mid-save).

Resuming trusts nothing it reads: `optim.pt` is loaded with `weights_only=True` (a crafted file
cannot run code); every file must match the manifest before anything is restored; nothing is read
through a link that leaves the checkpoint; sizes are checked (against the manifest's, or for a
format-1 manifest `UNRECORDED_FILE_MAX_BYTES`) before anything is hashed, so a 10 GB sparse file
is refused after a `stat`.
"""

from __future__ import annotations

import json
import logging
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

from skyrl_tool_agent.config import UserInputError
from skyrl_tool_agent.data.loader import rng_state_from_json, rng_state_to_json
from skyrl_tool_agent.data.json_input import loads_bounded
from skyrl_tool_agent.policy.manifest import links_leaving, tree_hashes, tree_problems, tree_sizes

logger = logging.getLogger(__name__)

STATE_FILE = "trainer_state.json"
CONFIG_FILE = "config.yaml"
RNG_FILE = "rng.json"
MANIFEST = "manifest.json"
#: 2: `sizes` (bytes per file) beside `files` (sha256 per file); 1 had `files` only.
MANIFEST_FORMAT = 2
#: Largest file a format-1 manifest (no recorded sizes) may vouch for: above a full-mode 1.5B
#: model's bf16 optimizer state (6 GB), below what takes most of a minute to hash.
UNRECORDED_FILE_MAX_BYTES = 8 << 30
#: Largest manifest.json read (a real one is a few kB, even for a sharded ZeRO-3 checkpoint).
MANIFEST_MAX_BYTES = 16 << 20


class CheckpointError(UserInputError):
    """A checkpoint that is missing, incomplete or corrupt (one line naming it and why)."""


def seed_everything(seed: int) -> None:
    """Seed Python's, NumPy's and torch's (CUDA included) global RNGs from `seed`; called before the
    policy is built, so what a run draws before its first step (LoRA initialisation) repeats too."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def rng_state() -> dict[str, Any]:
    """The process's RNG states as plain JSON data (no pickles: `rng.json` must be safe to load)."""
    name, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)
    return {
        "python": rng_state_to_json(random.getstate()),
        "numpy": [name, [int(k) for k in keys], int(pos), int(has_gauss), float(cached)],
        "torch": torch.get_rng_state().tolist(),
    }


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore `rng_state()` output."""
    random.setstate(rng_state_from_json(state["python"]))
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(torch.tensor(state["torch"], dtype=torch.uint8))


def write_manifest(directory: Path, hashes: dict[str, str] | None = None) -> None:
    """Record the sha256 and size of every file in `directory` (call it last, after every file is
    written). `hashes`: every file's sha256 when the caller has them (the ranks of a launch hash
    their shares of a checkpoint in parallel), else they are computed here."""
    files = tree_hashes(directory, exclude=(MANIFEST,)) if hashes is None else hashes
    manifest = {"format": MANIFEST_FORMAT, "files": files, "sizes": tree_sizes(directory, exclude=(MANIFEST,))}
    (directory / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")


def _read_manifest(path: Path) -> tuple[dict[str, str], dict[str, int] | None]:
    """(sha256 by file, size by file or None for a format-1 manifest) of checkpoint `path`;
    ValueError (in a few words) for a manifest that is missing, not a regular file, oversized or
    malformed. Called after `links_leaving`: the manifest is not a link out of the checkpoint."""
    file = path / MANIFEST
    if not file.is_file():
        raise ValueError("it is missing" if not file.exists() else "it is not a regular file")
    if (size := file.stat().st_size) > MANIFEST_MAX_BYTES:
        raise ValueError(f"it is {size:,} bytes, over {MANIFEST_MAX_BYTES:,}")
    manifest = loads_bounded(file.read_text(encoding="utf-8"))
    files = manifest.get("files") if isinstance(manifest, dict) else None
    if not isinstance(files, dict) or not files or not all(isinstance(v, str) for v in files.values()):
        raise ValueError("it lists no files")
    sizes = manifest.get("sizes")
    if sizes is not None and (not isinstance(sizes, dict) or not all(
            isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in sizes.values())):
        raise ValueError("its sizes are not byte counts")
    return files, sizes


def checkpoint_problems(path: Path) -> list[str]:
    """Why `path` is not an intact checkpoint (empty list: every file matches its manifest)."""
    if not path.is_dir():
        return [f"{path} is not a directory"]
    if leaving := links_leaving(path):  # before reading anything, the manifest included
        return leaving
    try:
        files, sizes = _read_manifest(path)
    except (OSError, ValueError) as exc:
        return [f"no readable {MANIFEST} ({type(exc).__name__}: {exc}); written by an older version, or not at all"]
    # The cap also holds for a file a format-2 manifest gives no size (a crafted `"sizes": {}`).
    return tree_problems(path, files, exclude=(MANIFEST,), sizes=sizes, max_bytes=UNRECORDED_FILE_MAX_BYTES)


def _signature(path: Path) -> tuple[tuple[str, int, int, int], ...]:
    # lstat: a file swapped for a link (to a file of the same size and time) changes the signature.
    return tuple((p.relative_to(path).as_posix(), st.st_mode, st.st_size, st.st_mtime_ns)
                 for p in sorted(path.rglob("*")) for st in (p.lstat(),))


# Checkpoints verified in this process, by path -> file names, sizes and mtimes then: `--resume auto`
# verifies while choosing and again while loading; hashing a full model twice would double the wait.
_verified: dict[Path, tuple[tuple[str, int, int, int], ...]] = {}


def _problems(path: Path) -> list[str]:
    """`checkpoint_problems`, skipped for a checkpoint verified before whose files look unchanged."""
    if path.is_dir() and _verified.get(path.resolve()) == _signature(path):
        return []
    problems = checkpoint_problems(path)
    if not problems:
        _verified[path.resolve()] = _signature(path)
    return problems


def hashable_as_recorded(path: Path) -> dict[str, str] | None:
    """The sha256 `path`'s manifest records per file, when its files are exactly those it lists, at
    the sizes it records, none a link out of it (`stat` alone: nothing hashed yet); else None."""
    if not path.is_dir() or links_leaving(path):
        return None
    try:
        files, sizes = _read_manifest(path)
    except (OSError, ValueError):
        return None
    if sizes is None or tree_sizes(path, exclude=(MANIFEST,)) != sizes or set(files) != set(sizes):
        return None
    return files


def record_verified(path: Path, hashes: dict[str, str]) -> bool:
    """`path` counts as verified in this process (`verify_checkpoint` does not read it again) when
    `hashes`, its files hashed elsewhere (by the ranks of a launch, each its share), are what its
    manifest records at the sizes it records; whether it does."""
    recorded = hashable_as_recorded(path)
    if recorded is None or recorded != hashes:
        return False
    _verified[path.resolve()] = _signature(path)
    return True


def verify_checkpoint(path: Path) -> None:
    """Raise CheckpointError unless every file of `path` matches its manifest."""
    problems = _problems(path)
    if problems:
        shown = "; ".join(problems[:3]) + (f"; and {len(problems) - 3} more" if len(problems) > 3 else "")
        raise CheckpointError(f"checkpoint {path} is corrupt or incomplete: {shown}")


def save_checkpoint(
    root: Path,
    step: int,
    *,
    policy: Any,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    trainer_state: dict[str, Any],
    keep: int,
    config_yaml: str | None = None,
) -> Path:
    """Write checkpoint `step` under `root` (module doc), keeping the newest `keep`; `config_yaml`:
    the run's resolved config, recorded for `--resume` to compare with."""
    final = root / f"step-{step:06d}"
    tmp = root / f"step-{step:06d}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tmp.mkdir(parents=True)
        policy.model.save_pretrained(tmp / "weights")
        torch.save({"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict()}, tmp / "optim.pt")
        (tmp / RNG_FILE).write_text(json.dumps(rng_state()) + "\n")
        (tmp / STATE_FILE).write_text(json.dumps({"step": step, **trainer_state}) + "\n")
        if config_yaml is not None:
            (tmp / CONFIG_FILE).write_text(config_yaml, encoding="utf-8")
        write_manifest(tmp)
    except Exception as exc:
        shutil.rmtree(tmp, ignore_errors=True)  # the checkpoints before stay as they were
        _raise_file_system_fault(root, exc)
        raise
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    for old in sorted(p for p in root.glob("step-*") if not p.name.endswith(".tmp"))[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    logger.info("checkpoint saved: %s", final)
    return final


def _raise_file_system_fault(root: Path, exc: BaseException) -> None:
    """torch and safetensors report a full or read-only disk as RuntimeError or their own errors:
    if a small probe write to `root` fails too, raise that OSError (ENOSPC, EROFS, ...) instead."""
    if isinstance(exc, OSError):
        return
    probe = root / ".write-probe"
    try:
        probe.write_bytes(b"x" * 65536)
        probe.unlink()
    except OSError as fault:
        probe.unlink(missing_ok=True)
        raise fault from exc


def latest_checkpoint(root: Path) -> Path | None:
    """The newest intact checkpoint under `root`, None if there is no checkpoint at all.

    Newer ones that fail verification are skipped with a warning each; if every one fails,
    CheckpointError says why for each (resuming from none would overwrite them from step 0).
    """
    candidates = sorted((p for p in root.glob("step-*") if p.is_dir() and not p.name.endswith(".tmp")), reverse=True)
    skipped = []
    for path in candidates:
        problems = _problems(path)
        if not problems:
            if skipped:
                logger.warning("resuming from %s, the newest intact checkpoint (skipped %s)", path.name,
                               ", ".join(skipped))
            return path
        logger.warning("checkpoint %s is corrupt or incomplete, skipping it: %s", path, "; ".join(problems[:3]))
        skipped.append(f"{path.name}: {problems[0]}")
    if skipped:
        raise CheckpointError(f"no intact checkpoint under {root} ({'; '.join(skipped)}); "
                              "resume from a checkpoint directory you trust, or move them away to start fresh")
    return None


def load_checkpoint(path: Path, *, policy: Any, optimizer: torch.optim.Optimizer, scheduler: Any) -> dict[str, Any]:
    """Restore weights, optimizer, scheduler and RNG in place; returns the trainer state dict.

    Verifies the manifest first and reads every file before changing anything, so a bad
    checkpoint raises CheckpointError and leaves the policy and optimizer as they were.
    """
    verify_checkpoint(path)
    weights = path / "weights"
    try:
        if policy.mode == "lora":
            from safetensors.torch import load_file

            loaded: Any = load_file(str(weights / "adapter_model.safetensors"))
        else:
            from transformers import AutoModelForCausalLM

            loaded = AutoModelForCausalLM.from_pretrained(weights, dtype=next(policy.model.parameters()).dtype)
        # Tensors and plain containers only: unpickling anything else (code included) is refused.
        blob = torch.load(path / "optim.pt", weights_only=True)
        rng = json.loads((path / RNG_FILE).read_text())
        state = json.loads((path / STATE_FILE).read_text())
        optimizer_state, scheduler_state = blob["optimizer"], blob["scheduler"]
    except Exception as exc:  # noqa: BLE001 - whatever a bad file raises, the user gets one line
        raise CheckpointError(f"cannot load checkpoint {path}: {type(exc).__name__}: {exc}") from exc
    try:
        if policy.mode == "lora":
            from peft import set_peft_model_state_dict

            set_peft_model_state_dict(policy.model, loaded)
        else:
            policy.model.load_state_dict(loaded.state_dict())
        optimizer.load_state_dict(optimizer_state)
        scheduler.load_state_dict(scheduler_state)
        set_rng_state(rng)
    except (RuntimeError, ValueError, KeyError, TypeError) as exc:  # e.g. written for another model
        raise CheckpointError(f"checkpoint {path} does not fit this run: {type(exc).__name__}: {exc}") from exc
    return state


def restore_loader_state(ckpt: Path, state: Any, loader: Any, max_steps: int) -> int:
    """Check and restore trainer_state.json's data-loader state into `loader`; returns its step. A
    crafted or damaged state, or one saved by a run with another seed, max_steps or group size, is
    a CheckpointError (one `error:` line), never a traceback or a step count from nowhere."""
    step = state.get("step") if isinstance(state, dict) else None
    saved = state.get("loader") if isinstance(state, dict) else None
    if not isinstance(step, int) or isinstance(step, bool) or not 0 <= step <= max_steps:
        raise CheckpointError(f"checkpoint {ckpt}: {STATE_FILE} has step {step!r}; this run has steps 0 to "
                              f"{max_steps} (training.max_steps)")
    if not isinstance(saved, dict):
        raise CheckpointError(f"checkpoint {ckpt}: {STATE_FILE} has no data-loader state")
    try:
        loader.load_state_dict(saved)
    except (ValueError, KeyError, TypeError, AttributeError, IndexError) as exc:
        raise CheckpointError(
            f"checkpoint {ckpt} does not fit this run: data-loader state: {type(exc).__name__}: {exc} "
            "(resume with the run's own training.seed, training.max_steps and grpo.group_size)") from exc
    if loader.step != step:
        raise CheckpointError(f"checkpoint {ckpt}: {STATE_FILE} says step {step} but its data loader is at "
                              f"step {loader.step}")
    return step


def checkpoint_to_resume(root: Path, resume: str) -> Path | None:
    """The checkpoint `--resume` names: a directory as given, or with 'auto' the newest under `root`
    by name (not verified here: the load verifies it, and may fall back to an older one of the same
    run). None: there is none."""
    if resume != "auto":
        return Path(resume)
    found = sorted(p for p in root.glob("step-*") if p.is_dir() and not p.name.endswith(".tmp"))
    return found[-1] if found else None


def resume_settings_problem(launch: dict[str, Any], checkpoint: Path, *, world_size: int | None = None) -> str | None:
    """Why resuming `checkpoint` with the resolved config `launch` would train on other settings
    than its optimizer state was made under (config.yaml against `MAY_CHANGE_ON_RESUME`; for
    ZeRO-3, `world_size` against its rank count), as one line; None when it would not. Never
    raises (an unreadable file is left to the load, which verifies the manifest)."""
    import yaml

    from skyrl_tool_agent.config.resume import resume_differences

    try:
        saved = yaml.safe_load((checkpoint / CONFIG_FILE).read_text(encoding="utf-8")[:MANIFEST_MAX_BYTES])
        state = loads_bounded((checkpoint / STATE_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError, yaml.YAMLError) as exc:
        if isinstance(exc, FileNotFoundError) and exc.filename == str(checkpoint / CONFIG_FILE):
            logger.warning("%s records no config (written before checkpoints did): its settings are not compared "
                           "with this launch's", checkpoint)
        return None
    ranks = state.get("world_size") if isinstance(state, dict) else None
    if world_size is not None and isinstance(ranks, int) and ranks != world_size:
        return world_size_problem(checkpoint, ranks, world_size)
    differences = resume_differences(launch, saved) if isinstance(saved, dict) else []
    if not differences:
        return None
    knob, mine, theirs = differences[0]
    more = f" (and {len(differences) - 1} more: {', '.join(k for k, _, _ in differences[1:4])}" \
           f"{', ...' if len(differences) > 4 else ''})" if len(differences) > 1 else ""
    return (f"--resume {checkpoint}: {knob} is {mine} in this launch but {theirs} in the checkpoint's run"
            f"{more}: its optimizer and data state were made under those settings; resume with the checkpoint's "
            "values (its config.yaml), or start a new run in another --output-dir (README, Training: what a resume may change)")


def world_size_problem(checkpoint: Path, ranks: Any, world_size: int) -> str:
    """The one line for resuming a ZeRO-3 checkpoint of `ranks` ranks on `world_size`."""
    return (f"{checkpoint} was written by {ranks} ranks, this run has {world_size}: ZeRO-3 optimizer shards are "
            f"per rank; relaunch with the same count, or export it (skyrl-tool-agent export {checkpoint} "
            "--output-dir DIR) and start fresh from DIR (--set model.name_or_path=DIR)")
