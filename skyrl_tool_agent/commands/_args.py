"""Argparse helpers shared by the commands: one parser style and one output flag."""

from __future__ import annotations

import argparse
import re
import shlex
from typing import Any

from pydantic import ValidationError

from skyrl_tool_agent.config import MCPServerConfig, UserInputError
from skyrl_tool_agent.config.overrides import Override


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


def add_mcp_server(parser: argparse.ArgumentParser | Any) -> None:
    """`--mcp-server 'NAME=COMMAND ARGS...'` (repeatable) and `--mcp-writable NAME=PATH`."""
    parser.add_argument("--mcp-server", action="append", default=[], metavar="'NAME=COMMAND ARGS'",
                        help="serve the tools of this MCP stdio server (one quoted string, split like a shell line; "
                             "repeat for several): replaces env.mcp_servers; its tools are listed in the log at start. "
                             "--set env.mcp_servers.0.KEY=VALUE still sets its other keys (error_pattern, tool_prefix)")
    parser.add_argument("--mcp-writable", action="append", default=[], metavar="NAME=PATH",
                        help="the server NAME may write PATH (a file or directory its command line names): each "
                             "episode runs its own process of it on its own copy (env.mcp_servers[].writable_paths)")


def mcp_servers_of(specs: list[str], writable: list[str]) -> list[MCPServerConfig]:
    """`--mcp-server` / `--mcp-writable` values as env.mcp_servers, typed from the flag to the
    process (one error line each)."""
    servers: dict[str, dict[str, Any]] = {}
    for spec in specs:
        name, sep, command = spec.partition("=")
        try:
            words = shlex.split(command)
        except ValueError as exc:
            raise UserInputError(f"--mcp-server {spec!r}: {exc}") from None
        if not sep or not re.fullmatch(r"[A-Za-z0-9_.-]+", name.strip()) or not words:
            raise UserInputError(f"--mcp-server {spec!r}: expected NAME=COMMAND ARGS, e.g. --mcp-server "
                                 "'shop=mcp-server-sqlite --db-path shop.sqlite'")
        if name.strip() in servers:
            raise UserInputError(f"--mcp-server: two servers named {name.strip()!r}; give each its own name")
        servers[name.strip()] = {"name": name.strip(), "command": words[0], "args": words[1:]}
    for item in writable:
        name, sep, path = item.partition("=")
        if not sep or not path:
            raise UserInputError(f"--mcp-writable {item!r}: expected NAME=PATH")
        if name not in servers:
            raise UserInputError(f"--mcp-writable {item!r}: no --mcp-server named {name!r} (named: "
                                 f"{', '.join(servers) or 'none'})")
        servers[name].setdefault("writable_paths", []).append(path)
    try:
        return [MCPServerConfig(**server) for server in servers.values()]
    except ValidationError as exc:  # the validators quote the value they reject
        raise UserInputError(f"--mcp-server: {exc.errors()[0]['msg']}") from None


def task_file_args(args: argparse.Namespace) -> None:
    """Put `--task-file`'s overrides, then `--mcp-server`'s, before the command's own `--set`s
    (`args.overrides`), which win."""
    first: list[str | Override] = []
    if getattr(args, "task_file", None):
        from skyrl_tool_agent.examples.one_file import task_file_overrides

        first.extend(task_file_overrides(args.task_file))
    if getattr(args, "mcp_writable", None) and not getattr(args, "mcp_server", None):
        raise UserInputError("--mcp-writable names a server of --mcp-server; give --mcp-server 'NAME=COMMAND ARGS'")
    if getattr(args, "mcp_server", None):
        servers = mcp_servers_of(args.mcp_server, args.mcp_writable)
        first.append(Override(" ".join(args.mcp_server), "env", ("mcp_servers",), servers, flag="--mcp-server"))
    args.overrides = [*first, *args.overrides]
