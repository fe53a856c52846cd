"""skyrl-tool-agent: multi-turn RL for tool-using LLM agents over MCP.

Importing the package registers the `mcp_tool_env` environment with skyrl-gym, so
`skyrl_gym.make("mcp_tool_env", env_config=..., extras=...)` works. SkyRL-train users who import
lazily can call `register_envs()` explicitly.
"""

from __future__ import annotations

__version__ = "0.1.0"

ENV_ID = "mcp_tool_env"


def register_envs() -> None:
    """Register `mcp_tool_env` with skyrl-gym (idempotent)."""
    import skyrl_gym
    from skyrl_gym.envs.registration import registry

    if ENV_ID not in registry:
        skyrl_gym.register(id=ENV_ID, entry_point="skyrl_tool_agent.env.environment:MCPToolEnvironment")


try:  # registration must never make the library unimportable
    register_envs()
except ImportError:  # pragma: no cover - skyrl-gym is a hard dependency; this guards broken installs
    pass
