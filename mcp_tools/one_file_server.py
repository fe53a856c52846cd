"""An MCP stdio server for the tools of a one-file task family (`--task-file my_task.py`).

    python -m mcp_tools.one_file_server path/to/my_task.py

Loads the file and serves each function of its `TOOLS` list as an MCP tool (official `mcp` SDK,
`MCPServer`): the function's name, docstring and annotated parameters are the tool's name,
description and input schema, as with `@server.tool()`. A tool that raises
`mcp.server.mcpserver.exceptions.ToolError` or any other exception returns an error result with
its message (clipped to `result_caps.MAX_ERROR_CHARS`), which the model reads. The server's name
is the file's `FAMILY.name` (else the file's stem).

The limits of the SQL server hold for these tools too, and for the same reasons:

* size: a result is measured before it is serialized and sent; one over
  `result_caps.MAX_RESPONSE_BYTES` (64 KiB, JSON-encoded) is answered `too large: ...` (an error
  the model reads) instead. A tool returning 32 MB used to make the client read a 64 MB line
  (the text plus its structured copy) for tens of seconds;
* time: each call runs on a worker thread of `call_lanes.CallLanes`, whose watchdog answers
  `timeout: ...` once the call has run `--timeout-s` (default: 0.8 x the MCP client pool's call
  timeout, `call_lanes.limit_under_client`), so the model reads that answer before the client
  gives up on the call. The watchdog then stops the tool's thread (`call_lanes.Abandoned`
  raised in it at its next Python instruction; a tool blocked inside one C call stops when the
  call returns): abandoned calls do not pile up running threads.

A result is its text alone (no output schema, no structured copy of the text), as for the SQL tools.
"""

import argparse
import functools
import importlib.util
import inspect
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.mcpserver.utilities.func_metadata import func_metadata
from mcp_types import CallToolResult, TextContent

from mcp_tools.call_lanes import SHARE_OF_CLIENT_DEADLINE, CallLanes, limit_under_client
from mcp_tools.process_memory import release_freed_memory
from mcp_tools.result_caps import capped_result, clip_error, too_large_result, too_long

#: A call's limit when no client says its own deadline (`limit_under_client`): the share a client
#: deadline of 10 s (the default `env.call_timeout_s`) would give. Written here, not read from the
#: library's config: the servers import nothing from it (tests/test_layers.py; test_config.py
#: checks the two defaults agree).
DEFAULT_TIMEOUT_S = SHARE_OF_CLIENT_DEADLINE * 10.0


def load(path: Path) -> Any:
    """The module at `path` (its directory first on sys.path, so it can import its neighbours)."""
    sys.path.insert(0, str(path.parent))
    spec = importlib.util.spec_from_file_location(path.stem, path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"error: cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def as_tool(fn: Callable[..., Any], lanes: CallLanes) -> Callable[..., Any]:
    """`fn` as an MCP tool body: run on a worker thread of `lanes` under its limit, its return
    value converted as the SDK would (text, no structured part) and capped (`capped_result`),
    any exception turned into a `ToolError` that carries its (clipped) message (the SDK hides the
    message of other exceptions, and logs a traceback for each)."""
    name = fn.__name__
    convert = func_metadata(fn, structured_output=False).convert_result

    def answer(kwargs: dict[str, Any]) -> CallToolResult:
        try:
            value = fn(**kwargs)
            if too_long(value):  # refused before the SDK converts it (a 100,000-item list: 100,000 blocks)
                return too_large_result(name)
            return capped_result(convert(value), name)
        except ToolError as exc:
            raise ToolError(clip_error(str(exc))) from None
        except Exception as exc:  # noqa: BLE001 - the model reads what went wrong
            raise ToolError(clip_error(f"{type(exc).__name__}: {exc}")) from None

    @functools.wraps(fn)
    async def call(**kwargs: Any) -> CallToolResult:
        def body(_limit_s: float) -> CallToolResult:
            try:
                return answer(kwargs)  # the tool's raw value is gone once this returns
            finally:
                release_freed_memory()  # what a large result took goes back to the OS

        result = await lanes.run(body, takes_budget=False)
        if result is None:  # the watchdog: the thread is stopped, its result (if any) dropped
            text = f"timeout: {name} ran longer than {lanes.timeout_s:g} s"
            return CallToolResult(content=[TextContent(type="text", text=text)], is_error=True)
        return result

    # The SDK reads the parameters from here (the wrapper's own are **kwargs); the return
    # annotation goes, so it sees a body that returns a CallToolResult as it is.
    call.__signature__ = inspect.signature(fn).replace(return_annotation=CallToolResult)  # type: ignore[attr-defined]
    return call


def build_server(module: Any, name: str, *, timeout_s: float = DEFAULT_TIMEOUT_S) -> MCPServer:
    """An MCPServer serving `module.TOOLS`, each call limited to `timeout_s` (module doc)."""
    tools = getattr(module, "TOOLS", None)
    if not tools or not all(callable(t) for t in tools):
        raise SystemExit(f"error: {name}: TOOLS must be a non-empty list of functions")
    lanes = CallLanes(timeout_s, stop_abandoned=True)
    server = MCPServer(name, log_level="WARNING")
    for fn in tools:
        server.add_tool(as_tool(fn, lanes), structured_output=False)
    return server


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("task_file", type=Path, help="the task family's Python file (its TOOLS)")
    parser.add_argument("--timeout-s", type=float, default=None,
                        help="limit of one call, in seconds (default: 0.8 x the MCP client pool's call timeout, "
                        f"else {DEFAULT_TIMEOUT_S:g})")
    args = parser.parse_args(argv)
    timeout_s = args.timeout_s if args.timeout_s is not None else limit_under_client(DEFAULT_TIMEOUT_S)
    if not timeout_s > 0:
        parser.error("--timeout-s must be positive")
    path = args.task_file.expanduser().resolve()
    module = load(path)
    family = getattr(module, "FAMILY", None)
    build_server(module, getattr(family, "name", None) or path.stem, timeout_s=timeout_s).run("stdio")


if __name__ == "__main__":
    main()
