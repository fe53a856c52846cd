"""Value types and errors of the MCP client pool (kept apart so they import without the SDK). A server
is the config's own model, `config.env.MCPServerConfig`, from the flag to the process."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict


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
