"""`skyrl-tool-agent COMMAND [flags]`: the project's commands as one console script.

    skyrl-tool-agent train --mode lora                  # GRPO on the embedded model (training/scripts/train_grpo.py)
    skyrl-tool-agent eval --policy oracle --limit 50    # evaluate through the MCP environment
    skyrl-tool-agent build-data                         # the built-in SQLite tasks
    skyrl-tool-agent build-model --force                # rebuild the embedded model
    skyrl-tool-agent export RUN/final --merge --output-dir DIR   # a merged model for any server
    skyrl-tool-agent doctor                             # is this machine ready? one line per check
    skyrl-tool-agent knobs                              # every config knob, documented
    skyrl-tool-agent COMMAND --help                     # a command's own flags

Commands run from any directory: with no --config/--config-dir the defaults shipped in the package
are used, and the built-in data is found in the package's checkout or built into the cache.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from importlib import import_module

PROG = "skyrl-tool-agent"
DISTRIBUTION = "skyrl-tool-agent"

#: command -> (module under skyrl_tool_agent, function, fixed leading args, one-line help)
COMMANDS: dict[str, tuple[str, str, tuple[str, ...], str]] = {
    "train": ("commands.train", "main", (), "train a tool-using SQL agent with GRPO over MCP tools"),
    "eval": ("commands.evaluate", "main", (), "evaluate a policy (model or oracle) through the MCP environment"),
    "build-data": ("commands.build_data", "main", (), "build the built-in text-to-SQL dataset (SQLite + JSON)"),
    "build-model": ("commands.build_model", "main", (), "build (or --ship) the embedded default model"),
    "doctor": ("commands.doctor", "main", (), "check this machine: device, memory, graph capture, one training step"),
    "export": ("commands.export", "main", (), "a LoRA adapter merged into its base, or a full-mode checkpoint consolidated: a model any server loads"),
    "sft-baseline": ("commands.sft_baseline", "main", (), "continue the warm start for a wall time (GRPO's baseline)"),
    "speedrun": ("commands.speedrun", "main", (), "from nothing to a GRPO-trained agent in one budget, beside SFT"),
    "memory-profile": ("commands.memory_profile", "main", (), "peak memory of one GRPO update per training mode"),
    "knobs": ("config.__main__", "main", ("knobs",), "list every config knob (--markdown for a table)"),
    "config": ("config.__main__", "main", (), "show the resolved config, write default config files, list knobs"),
}


def version() -> str:
    """The installed distribution's version (the package's own when it is not installed)."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    try:
        return dist_version(DISTRIBUTION)
    except PackageNotFoundError:
        from skyrl_tool_agent import __version__

        return __version__


def _parser() -> argparse.ArgumentParser:
    listing = "\n".join(f"  {name:<16}{spec[3]}" for name, spec in COMMANDS.items())
    parser = argparse.ArgumentParser(
        prog=PROG, description=__doc__, epilog=f"commands:\n{listing}", allow_abbrev=False,
        formatter_class=argparse.RawDescriptionHelpFormatter, usage=f"{PROG} [-h] [--version] COMMAND [flags]",
    )
    parser.add_argument("--version", action="version", version=f"{PROG} {version()}")
    parser.add_argument("command", choices=list(COMMANDS), metavar="COMMAND", help="one of: " + ", ".join(COMMANDS))
    parser.add_argument("args", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    return parser


def resolve(command: str) -> Callable[..., object]:
    module, function, _, _ = COMMANDS[command]
    return getattr(import_module(f"skyrl_tool_agent.{module}"), function)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(sys.argv[1:] if argv is None else argv)
    _, _, leading, _ = COMMANDS[args.command]
    prog = PROG if leading else f"{PROG} {args.command}"  # `knobs` is a subcommand of the config CLI
    try:
        result = resolve(args.command)([*leading, *args.args], prog=prog)
    except BrokenPipeError:  # `skyrl-tool-agent knobs | head`: the reader left, not an error of ours
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    return result if isinstance(result, int) else 0


if __name__ == "__main__":
    sys.exit(main())
