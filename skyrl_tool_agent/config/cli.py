"""Config flags shared by every script: `--config FILE` or `--config-dir DIR`, `--set KEY=VALUE`,
`--<file>-config PATH` (`add_config_args`, then `config_from_args`).
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

from skyrl_tool_agent.config.model import EMBEDDED, SHIPPED_EMBEDDED_DIR
from skyrl_tool_agent.config.loader import PROFILES, SECTIONS, Config, load_config

logger = logging.getLogger(__name__)

#: Section -> the flag that replaces its file path.
FILE_FLAGS = {name: f"--{name}-config" for name in SECTIONS}


def add_config_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the config flags to `parser` (build it with `allow_abbrev=False`); returns the parser."""
    group = parser.add_argument_group("configuration")
    source = group.add_mutually_exclusive_group()
    source.add_argument(
        "--config",
        dest="config_file",
        metavar="FILE.yaml",
        help="one YAML file holding every section (top-level keys model, training, grpo, env; a missing "
        "section keeps its defaults), e.g. a run's config.yaml",
    )
    source.add_argument(
        "--config-dir",
        metavar="DIR",
        help="directory holding the section files model_config.yaml, training_config.yaml, ... "
        "(default: the defaults shipped in the package; the repository's configs/ is a copy to edit)",
    )
    group.add_argument(
        "--profile",
        choices=("auto", *PROFILES),
        default="auto",
        help="which defaults the packaged config takes: cpu (the embedded tiny model on a CPU) or gpu (each "
        "knob's H100 value, e.g. lr 2e-5, 512 tokens per turn, no time budget; the data section is kept). "
        "auto: gpu when the model the command loads (model.name_or_path, or eval's --model-path; an adapter or "
        "checkpoint counts as its base) is not the embedded one and a CUDA device is there, else cpu; on a GPU "
        "train then sizes the learning rate and the update's token budget to the model's size and the device's "
        "memory, beside the rollout engine's episodes (skyrl_tool_agent/memory/sizing.py). With --config-dir, the gpu values replace the files' values left at "
        "their CPU default (edited ones are kept). The choice, the values and the reasons are logged at start",
    )
    group.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override one knob, e.g. --set grpo.group_size=4 --set model.lora.r=8 (value parsed as YAML; "
        "repeatable; applied before validation)",
    )
    for name, flag in FILE_FLAGS.items():
        group.add_argument(
            flag,
            dest=f"{name}_config",
            metavar="PATH",
            help=f"use this file for the {name} section instead of {SECTIONS[name][1]} of the config dir / --config",
        )
    return parser


def config_from_args(args: argparse.Namespace, *, model_path: str | None = None) -> Config:
    """`load_config` with the flags of `add_config_args`, `--profile auto` resolved from the model
    the command will load (`model_path`, when another flag names it)."""
    def load(profile: str) -> Config:
        return load_config(
            getattr(args, "config_dir", None),
            args.overrides,
            config_file=getattr(args, "config_file", None),
            profile=profile,
            **{f"{name}_config": getattr(args, f"{name}_config") for name in SECTIONS},
        )

    profile = getattr(args, "profile", "cpu")
    if profile != "auto":
        return load(profile)
    config = load("cpu")
    model = model_path or config.model.name_or_path
    choice, reason = auto_profile(model, device=config.model.device, cuda=None)
    args.resolved_profile = choice  # the train command sizes a gpu choice to the model and the device
    if choice == "gpu":
        logger.info("profile gpu: %s (each knob's H100 value); --profile cpu keeps the CPU ones", reason)
        return load("gpu")  # on a --config-dir too: its values left at the CPU default take the gpu ones
    if is_embedded_model(model):
        logger.info("profile cpu: %s", reason)
    else:
        logger.warning("profile cpu: %s: the embedded model's CPU defaults, e.g. lr %g and %d tokens per turn; "
                       "--profile gpu takes each knob's H100 value", reason, config.training.learning_rate,
                       config.grpo.max_new_tokens_per_turn)
    return config


def auto_profile(model: str, *, device: str = "auto", cuda: bool | None = None) -> tuple[str, str]:
    """What `--profile auto` takes for loading `model` ('embedded', a hub name, or a model, adapter
    or checkpoint directory) on `model.device` `device`, and why, in words for the log line.
    `cuda` None = ask torch whether a CUDA device is there (only when the answer matters)."""
    if is_embedded_model(model):
        return "cpu", f"the embedded model ({model})"
    if device in ("cpu", "mps"):
        return "cpu", f"model {model} on model.device {device}"
    if cuda is None:
        cuda = _cuda_available()
    if not cuda:
        return "cpu", f"model {model} but no CUDA device"
    return "gpu", f"CUDA device and model {model}"


#: config.json keys that identify the embedded model's architecture (its copies, fine-tunes and rebuilds).
_EMBEDDED_SHAPE_KEYS = ("model_type", "hidden_size", "num_hidden_layers", "vocab_size")


def is_embedded_model(model: str, _depth: int = 0) -> bool:
    """Whether `model` is the project's embedded tiny model: 'embedded', or a directory holding it
    (a model with its shape, e.g. a full fine-tune; an adapter whose base is it; a training
    checkpoint of either). Hub names and unreadable paths are not."""
    if model == EMBEDDED:
        return True
    path = Path(model).expanduser()
    if _depth > 3 or not path.is_dir():
        return False
    if not (path / "config.json").is_file() and not (path / "adapter_config.json").is_file():
        path = path / "weights"  # a checkpoint step-XXXXXX/ keeps its adapter or model there
    try:
        if (path / "adapter_config.json").is_file():
            base = json.loads((path / "adapter_config.json").read_text()).get("base_model_name_or_path")
            return isinstance(base, str) and is_embedded_model(base, _depth + 1)
        shape = json.loads((path / "config.json").read_text())
        shipped = json.loads((SHIPPED_EMBEDDED_DIR / "config.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(shape, dict) and all(shape.get(k) == shipped.get(k) for k in _EMBEDDED_SHAPE_KEYS)


def _cuda_available() -> bool:
    import torch  # late: the config package does not import torch otherwise

    return torch.cuda.is_available()
