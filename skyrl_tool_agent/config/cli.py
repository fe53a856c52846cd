"""Config flags shared by every script: `--config FILE` or `--config-dir DIR`, `--set KEY=VALUE`,
`--<file>-config PATH`.

    parser = argparse.ArgumentParser(allow_abbrev=False)
    add_config_args(parser)
    args = parser.parse_args()
    with cli_main_guard():
        cfg = config_from_args(args)
"""

from __future__ import annotations

import argparse
import logging

from skyrl_tool_agent.config.model import EMBEDDED
from skyrl_tool_agent.config.loader import PROFILES, SECTIONS, Config, load_config

logger = logging.getLogger(__name__)

#: Section -> the flag that replaces its file path.
FILE_FLAGS = {name: f"--{name}-config" for name in SECTIONS}


def add_config_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the config flags to `parser` (in their own argument group); returns the parser.

    Build the parser with `allow_abbrev=False`, or argparse also takes prefixes such as
    `--config-d` for `--config-dir` or `--model` for `--model-config`."""
    group = parser.add_argument_group("configuration")
    source = group.add_mutually_exclusive_group()
    source.add_argument(
        "--config",
        dest="config_file",
        default=None,
        metavar="FILE.yaml",
        help="one YAML file holding every section (top-level keys model, training, grpo, env; a missing "
        "section keeps its defaults), e.g. a run's config.yaml",
    )
    source.add_argument(
        "--config-dir",
        default=None,
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
        "auto: gpu when the model is not the embedded one and CUDA is available, else cpu (printed at start)",
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
            default=None,
            metavar="PATH",
            help=f"use this file for the {name} section instead of {SECTIONS[name][1]} of the config dir / --config",
        )
    return parser


def config_from_args(args: argparse.Namespace) -> Config:
    """`load_config` with the flags added by `add_config_args` (`--profile auto` resolved here)."""
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
    if getattr(args, "config_dir", None) is None and config.model.name_or_path != EMBEDDED and _cuda_available():
        logger.info("profile: gpu (model %s on CUDA: each knob's H100 default); --profile cpu keeps the CPU ones",
                    config.model.name_or_path)
        return load("gpu")
    if getattr(args, "config_dir", None) is None and config.model.name_or_path != EMBEDDED:
        logger.warning("profile: cpu (model %s but no CUDA: the embedded model's CPU defaults, e.g. lr %g and %d "
                       "tokens per turn); --profile gpu takes each knob's H100 value", config.model.name_or_path,
                       config.training.learning_rate, config.grpo.max_new_tokens_per_turn)
    return config


def _cuda_available() -> bool:
    import torch  # late: the config package does not import torch otherwise

    return torch.cuda.is_available()
