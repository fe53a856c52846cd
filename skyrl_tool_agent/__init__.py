"""skyrl-tool-agent: multi-turn RL for tool-using LLM agents over MCP.

Importing the package registers the `mcp_tool_env` environment with skyrl-gym, so
`skyrl_gym.make("mcp_tool_env", env_config=..., extras=...)` works. SkyRL-train users who import
lazily can call `register_envs()` explicitly.
"""

from __future__ import annotations

import logging
from typing import Any

__version__ = "0.1.0"


# bitsandbytes (imported by peft on every model load) warns that its optional `kernels` package is
# missing for a CPU 4-bit matmul this project never calls (QLoRA trains on CUDA): a warning on every
# run that nobody can act on. Only that message is dropped.
logging.getLogger("bitsandbytes.backends.cpu.ops").addFilter(
    lambda record: not str(record.msg).startswith("Failed to load CPU gemm_4bit_forward from kernels-community"))

ENV_ID = "mcp_tool_env"


def register_envs(env_config: Any = None) -> None:
    """Register `mcp_tool_env` with skyrl-gym (idempotent).

    `env_config` (`SkyRLEnvConfig` fields) becomes the default under the env_config `skyrl_gym.make`
    passes (SkyRL-train passes {}: docs/skyrl_train.md); registering again replaces it.
    """
    import skyrl_gym
    from skyrl_gym.envs.registration import registry

    kwargs = {}
    if env_config is not None:
        from skyrl_tool_agent.env.pools import as_gym_env_config

        as_gym_env_config(env_config)  # a bad key fails here, not in the first episode
        kwargs["default_env_config"] = env_config
    spec = registry.get(ENV_ID)
    if spec is not None:
        if spec.kwargs == kwargs:
            return
        del registry[ENV_ID]
    skyrl_gym.register(id=ENV_ID, entry_point="skyrl_tool_agent.env.environment:MCPToolEnvironment", kwargs=kwargs)


try:  # registration must never make the library unimportable
    register_envs()
except ImportError:  # pragma: no cover - skyrl-gym is a hard dependency; this guards broken installs
    pass
