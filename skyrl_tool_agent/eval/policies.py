"""Load the policy an evaluation runs: a base model, a trained LoRA adapter, a full fine-tune, or a
training checkpoint, all as a `QwenPolicy` ready for generation.

`model_path`: None (the config's model), a `QwenPolicy.save` directory (adapter or whole model), a
training checkpoint `step-XXXXXX` (tokenizer from the adapter's base or the config's model), a hub
name or `embedded`. Adapters are merged into their base for evaluation.
"""

from __future__ import annotations

import logging
from pathlib import Path

from skyrl_tool_agent.config import ModelConfig
from skyrl_tool_agent.policy.export import adapter_base, has_tokenizer, load_with_adapter, resolve_weights_dir
from skyrl_tool_agent.policy.device import resolve_device
from skyrl_tool_agent.policy.loading import ModelLoadError, load_model, load_tokenizer, resolve_model_path
from skyrl_tool_agent.policy.qwen import QwenPolicy

logger = logging.getLogger(__name__)


def load_eval_policy(model_path: str | Path | None, model_config: ModelConfig) -> QwenPolicy:
    """The policy at `model_path` (see module doc) with `model_config`'s device, dtype and attention.

    Raises `ModelLoadError` (a `UserInputError`: one line, exit 2 in scripts) when nothing loadable
    is there.
    """
    # Evaluation never trains: no fresh adapters, no 4-bit base (adapters are merged into it).
    config = model_config.model_copy(update={"quantization": type(model_config.quantization)()})
    if model_path is None or str(model_path) == "embedded":
        return QwenPolicy.from_config(config, mode="full")
    path = Path(model_path).expanduser()
    if not path.exists():
        if str(model_path).startswith((".", "/", "~")) or len(Path(str(model_path)).parts) > 2:
            raise ModelLoadError(f"--model-path {model_path}: no such directory")
        return QwenPolicy.from_config(config.model_copy(update={"name_or_path": str(model_path)}), mode="full")
    weights = resolve_weights_dir(path)
    adapter = (weights / "adapter_config.json").is_file()
    if not adapter and not (weights / "config.json").is_file():
        if (path / "deepspeed").is_dir():  # distributed.checkpoint's layout: shards, no export (a layer above)
            raise ModelLoadError(f"{path}: a full-mode (ZeRO-3) checkpoint holds shards, not a model: export it "
                                 f"first (skyrl-tool-agent export {path} --output-dir DIR) and give DIR")
        raise ModelLoadError(f"{path}: neither a model (config.json) nor a LoRA adapter (adapter_config.json)")
    if adapter:
        base = adapter_base(weights) or resolve_model_path(config)
        tokenizer_src = next((p for p in (weights, path) if has_tokenizer(p)), None) or base
    else:
        tokenizer_src = weights if has_tokenizer(weights) else Path(resolve_model_path(config))
    device = resolve_device(config.device)
    tokenizer = load_tokenizer(str(tokenizer_src), config)
    if adapter:
        model = load_with_adapter(weights, base, config, device, merge=True)
        logger.info("loaded LoRA adapter %s merged into %s", weights, base)
    else:
        model = load_model(str(weights), config, device, mode="full")
        logger.info("loaded model %s (tokenizer from %s)", weights, tokenizer_src)
    return QwenPolicy(model, tokenizer, mode="full")
