"""Config flags shared by every script: `--config-dir`, `--set KEY=VALUE`, `--<file>-config PATH`.

    parser = argparse.ArgumentParser()
    add_config_args(parser)
    args = parser.parse_args()
    with cli_main_guard():
        cfg = config_from_args(args)
"""

from __future__ import annotations

import argparse

from skyrl_tool_agent.config.loader import DEFAULT_CONFIG_DIR, SECTIONS, Config, load_config

#: Section -> the flag that replaces its file path.
FILE_FLAGS = {name: f"--{name}-config" for name in SECTIONS}


def add_config_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the config flags to `parser` (in their own argument group); returns the parser."""
    group = parser.add_argument_group("configuration")
    group.add_argument(
        "--config-dir",
        default=DEFAULT_CONFIG_DIR,
        help=f"directory holding the config files (default: {DEFAULT_CONFIG_DIR})",
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
            help=f"use this file instead of <config-dir>/{SECTIONS[name][1]}",
        )
    return parser


def config_from_args(args: argparse.Namespace) -> Config:
    """`load_config` with the flags added by `add_config_args`."""
    return load_config(
        args.config_dir,
        args.overrides,
        **{f"{name}_config": getattr(args, f"{name}_config") for name in SECTIONS},
    )
