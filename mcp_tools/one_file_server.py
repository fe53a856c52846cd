"""An MCP stdio server for the tools of a one-file task family (`--task-file my_task.py`).

    python -m mcp_tools.one_file_server path/to/my_task.py

Loads the file and serves each function of its `TOOLS` list as an MCP tool (official `mcp` SDK,
`MCPServer`): the function's name, docstring and annotated parameters are the tool's name,
description and input schema, as with `@server.tool()`. A tool that raises
`mcp.server.mcpserver.exceptions.ToolError` or any other exception returns an error result with
its message, which the model reads. The server's name is the file's `FAMILY.name` (else the file's stem).
"""

import argparse
import functools
import importlib.util
import sys
from pathlib import Path
from typing import Any

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError


def load(path: Path) -> Any:
    """The module at `path` (its directory first on sys.path, so it can import its neighbours)."""
    sys.path.insert(0, str(path.parent))
    spec = importlib.util.spec_from_file_location(path.stem, path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"error: cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def as_tool(fn: Any) -> Any:
    """`fn` with any exception turned into a `ToolError` that carries its message (the SDK hides
    the message of other exceptions, and logs a traceback for each)."""
    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except ToolError:
            raise
        except Exception as exc:  # noqa: BLE001 - the model reads what went wrong
            raise ToolError(f"{type(exc).__name__}: {exc}") from None

    return call


def build_server(module: Any, name: str) -> MCPServer:
    tools = getattr(module, "TOOLS", None)
    if not tools or not all(callable(t) for t in tools):
        raise SystemExit(f"error: {name}: TOOLS must be a non-empty list of functions")
    server = MCPServer(name, log_level="WARNING")
    for fn in tools:
        server.add_tool(as_tool(fn))
    return server


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("task_file", type=Path, help="the task family's Python file (its TOOLS)")
    args = parser.parse_args(argv)
    path = args.task_file.expanduser().resolve()
    module = load(path)
    family = getattr(module, "FAMILY", None)
    build_server(module, getattr(family, "name", None) or path.stem).run("stdio")


if __name__ == "__main__":
    main()
