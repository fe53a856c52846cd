"""Value types and errors of the MCP client pool (kept apart so they import without the SDK)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class ServerSpec(BaseModel):
    """How to start one MCP server over stdio (any server, not only ours)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(description="Unique server name; tool calls are routed by the tools it lists.")
    command: str = Field(description="Executable to run.")
    args: list[str] = Field(default_factory=list, description="Command-line arguments.")
    env: dict[str, str] | None = Field(
        default=None,
        description="Extra environment variables, over the SDK's safe default set (HOME, PATH, ...) "
        "plus PYTHONPATH and VIRTUAL_ENV of this process.",
    )
    cwd: str | Path | None = Field(default=None, description="Working directory; None = this process's.")
    tool_prefix: str = Field(
        default="",
        description="Prefix added to this server's tool names in the pool (to run two servers that "
        "list the same tool names); the server still sees the unprefixed name.",
    )
    error_pattern: str | None = Field(
        default=None,
        description="Regular expression: a result whose text matches (re.search) is a tool error even "
        "when the server did not set is_error.",
    )


class ToolSpec(BaseModel):
    """A tool as the pool exposes it."""

    model_config = ConfigDict(frozen=True)

    name: str
    description: str
    input_schema: dict[str, Any]
    server: str


@dataclass(frozen=True)
class ToolResult:
    """Outcome of one tool call. `is_error` results are tool-level errors for the model to read."""

    text: str
    is_error: bool = False
    structured: dict[str, Any] | None = None


class MCPPoolError(Exception):
    """Base of every error the pool raises."""


class MCPServerUnavailable(MCPPoolError):
    """The server died, hung, or is restarting; retryable (the pool respawns it in the background)."""


class MCPToolNotFound(MCPPoolError, KeyError):
    """No server lists a tool of that name."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class MCPConfigError(MCPPoolError):
    """Bad pool configuration: duplicate server or tool names, or a server that never started."""


class MCPPoolClosed(MCPPoolError):
    """The pool was closed (or never started)."""
