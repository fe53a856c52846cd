"""The one config schema for every YAML file, `load_config`, `--set` overrides and one-line errors:
a module per file it validates (model, training, grpo, env, distributed) beside the loader, the
overrides, the errors and the script flags (cli); each module's docstring says what it holds.

Every knob is documented once, in its `Field(description=...)`; the YAML files are generated from
the schemas (`python -m skyrl_tool_agent.config write-defaults configs`) and ship in the package
(`config/defaults/`); the repository's configs/ is a copy to edit. This package never imports torch.
"""

from __future__ import annotations

from skyrl_tool_agent.config.cli import add_config_args, config_from_args
from skyrl_tool_agent.config.distributed import DeepSpeedConfig
from skyrl_tool_agent.config.env import (
    CollectorConfig,
    EnvConfig,
    MCPServerConfig,
    RewardConfig,
    RewardTermConfig,
)
from skyrl_tool_agent.config.errors import ConfigError, UserInputError, cli_main_guard, require_extra
from skyrl_tool_agent.config.grpo import (
    BatcherConfig,
    CurriculumConfig,
    DifficultyMix,
    GRPOConfig,
)
from skyrl_tool_agent.config.loader import (
    Config,
    load_config,
    load_deepspeed_config,
)
from skyrl_tool_agent.config.model import (
    EMBEDDED,
    SHIPPED_EMBEDDED_DIR,
    LoraConfig,
    ModelConfig,
    QuantizationConfig,
    default_build_dir,
)
from skyrl_tool_agent.config.training import DataConfig, PushToHubConfig, TrainingConfig, WandbConfig

__all__ = [
    "EMBEDDED",
    "SHIPPED_EMBEDDED_DIR",
    "default_build_dir",
    "BatcherConfig",
    "CollectorConfig",
    "Config",
    "ConfigError",
    "CurriculumConfig",
    "DataConfig",
    "DeepSpeedConfig",
    "DifficultyMix",
    "EnvConfig",
    "GRPOConfig",
    "LoraConfig",
    "MCPServerConfig",
    "ModelConfig",
    "PushToHubConfig",
    "QuantizationConfig",
    "RewardConfig",
    "RewardTermConfig",
    "TrainingConfig",
    "UserInputError",
    "WandbConfig",
    "add_config_args",
    "cli_main_guard",
    "require_extra",
    "config_from_args",
    "load_config",
    "load_deepspeed_config",
]
