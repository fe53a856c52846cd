"""A trained LoRA adapter as what a server loads: merged into its base and saved as one plain model
directory, or the adapter itself on its base (`load_with_adapter`, as a LoRA-serving server does).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel

from skyrl_tool_agent.config import ModelConfig
from skyrl_tool_agent.policy.device import DTYPES, resolve_device
from skyrl_tool_agent.policy.loading import ModelLoadError, load_model, load_tokenizer, resolve_model_path

logger = logging.getLogger(__name__)

_TOKENIZER_FILES = ("tokenizer_config.json", "tokenizer.json")


def has_tokenizer(path: Path) -> bool:
    """Whether `path` holds a saved tokenizer."""
    return any((path / name).is_file() for name in _TOKENIZER_FILES)


def resolve_weights_dir(path: Path) -> Path:
    """A checkpoint dir (`step-XXXXXX/weights/...`) -> its weights dir; anything else unchanged."""
    weights = path / "weights"
    if weights.is_dir() and not (path / "config.json").is_file() and not (path / "adapter_config.json").is_file():
        return weights
    return path


def adapter_base(weights: Path) -> str | None:
    """The base model an adapter directory names (`base_model_name_or_path`), None when unnamed."""
    try:
        base = json.loads((weights / "adapter_config.json").read_text()).get("base_model_name_or_path")
    except (OSError, json.JSONDecodeError, AttributeError) as exc:
        raise ModelLoadError(f"{weights / 'adapter_config.json'}: unreadable ({exc})") from exc
    return base if isinstance(base, str) and base else None


def load_with_adapter(weights: Path, base: str, config: ModelConfig, device: torch.device, *,
                      merge: bool) -> PreTrainedModel:
    """The base model at `base` with the adapter in `weights` on it (peft `PeftModel`), merged into
    plain weights when `merge` (what `export --merge` saves and evaluation runs)."""
    from peft import PeftModel

    model = load_model(base, config, device, mode="full")
    try:
        model = PeftModel.from_pretrained(model, str(weights))
        if merge:
            model = model.merge_and_unload()
    except Exception as exc:  # noqa: BLE001 - one clear line for the user
        raise ModelLoadError(f"cannot load LoRA adapter {weights} onto {base}: {type(exc).__name__}: {exc}") from exc
    model.eval()
    return model


def export_merged(adapter: Path, out: Path, *, dtype: str = "bfloat16", device: str = "cpu",
                  base: str | None = None) -> dict[str, Any]:
    """Merge the LoRA adapter at `adapter` (training's `final/`, a run directory holding one, or a
    checkpoint) into its base and save the result in `dtype` to `out` with the tokenizer: one
    model directory any server loads. The merge runs in float32 on `device`. Returns what was done."""
    given = adapter
    if (adapter / "final").is_dir() and not (adapter / "adapter_config.json").is_file():
        adapter = adapter / "final"  # a run directory
    weights = resolve_weights_dir(adapter)
    if not (weights / "adapter_config.json").is_file():
        if (weights / "config.json").is_file():
            raise ModelLoadError(f"{given}: a whole model (config.json), not a LoRA adapter: nothing to merge, "
                                 "any server loads it as it is")
        raise ModelLoadError(f"{given}: no LoRA adapter (adapter_config.json) here, in final/ or in weights/")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ModelLoadError(f"--output-dir {out}: exists and is not empty; give a new directory")
    base = base or adapter_base(weights)
    if base is None:
        raise ModelLoadError(f"{weights / 'adapter_config.json'} names no base model; give --base MODEL")
    config = ModelConfig(name_or_path=base, device=device, dtype="float32")  # type: ignore[arg-type]
    base = resolve_model_path(config)  # 'embedded' -> its directory; a missing directory is one line
    torch_device = resolve_device(device)
    model = load_with_adapter(weights, base, config, torch_device, merge=True)
    model = model.to(DTYPES[dtype])
    model.config.use_cache = True
    tokenizer_src = next((p for p in (weights, adapter, given) if has_tokenizer(p)), None) or Path(base)
    tokenizer = load_tokenizer(str(tokenizer_src), config)
    tokenizer.padding_side = "right"  # a server's default; the project's loader sets left for its batches
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    record = {"adapter": str(weights.resolve()), "base": base, "dtype": dtype,
              "parameters": sum(p.numel() for p in model.parameters()), "tokenizer_from": str(tokenizer_src)}
    (out / "merged_from.json").write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    logger.info("merged adapter %s into %s: %s (%s)", weights, base, out, dtype)
    return record
