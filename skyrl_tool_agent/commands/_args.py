"""Argparse helpers shared by the commands: one parser style and one output flag."""

from __future__ import annotations

import argparse
from typing import Any


def new_parser(doc: str | None, prog: str | None = None, **kwargs: Any) -> argparse.ArgumentParser:
    """A command's parser: the module docstring as description, no prefix abbreviations."""
    return argparse.ArgumentParser(prog=prog, description=doc, formatter_class=argparse.RawDescriptionHelpFormatter,
                                   allow_abbrev=False, **kwargs)


def add_output_dir(parser: argparse.ArgumentParser | Any, help: str, *, default: Any = None,
                   legacy: tuple[str, ...] = ()) -> argparse.Action:
    """`--output-dir DIR` (also spelled `--output_dir`, as in Hugging Face scripts) into
    `args.output_dir`; `legacy` flags (an earlier name) are accepted without being shown."""
    action = parser.add_argument("--output-dir", "--output_dir", dest="output_dir", metavar="DIR", default=default,
                                 help=help)
    for flag in legacy:
        parser.add_argument(flag, dest="output_dir", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    return action


def add_task_file(parser: argparse.ArgumentParser | Any) -> argparse.Action:
    """`--task-file my_task.py`: a task family declared in one Python file (`examples.one_file`)."""
    return parser.add_argument("--task-file", metavar="FILE.py",
                               help="a task family in one Python file (TOOLS, TASKS, its verdict term, FAMILY; see "
                                    "examples/price_lookup.py): served, scored and loaded without other files; "
                                    "--set still wins")


def task_file_args(args: argparse.Namespace) -> None:
    """Put `--task-file`'s overrides before the command's own (`args.overrides`)."""
    if getattr(args, "task_file", None):
        from skyrl_tool_agent.examples.one_file import task_file_overrides

        args.overrides = [*task_file_overrides(args.task_file), *args.overrides]
