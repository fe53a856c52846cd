"""`Config` (the four sections composed) and `load_config`, which reads the section files (the
defaults shipped in the package, a directory like the repository's configs/, or one YAML file
holding every section), applies `--set` overrides, validates, and reports any problem as one
`ConfigError` line."""

from __future__ import annotations

import copy
import difflib
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, model_validator

from skyrl_tool_agent.config.base import Section, h100_value
from skyrl_tool_agent.config.distributed import DeepSpeedConfig
from skyrl_tool_agent.config.env import EnvConfig
from skyrl_tool_agent.config.errors import ConfigError
from skyrl_tool_agent.config.grpo import GRPOConfig
from skyrl_tool_agent.config.model import ModelConfig
from skyrl_tool_agent.config.overrides import Loc, Override, apply_override, parse_override, validation_message
from skyrl_tool_agent.config.training import TrainingConfig
from skyrl_tool_agent.config.yaml_io import read_mapping, render_section

logger = logging.getLogger(__name__)

#: The default section files, shipped inside the package (the repository's configs/ is the same
#: files as a copy to edit; tests/test_commands.py keeps the two equal).
PACKAGED_CONFIG_DIR = Path(__file__).resolve().parent / "defaults"
#: Section name -> (schema, file name in the config directory). The first four make up `Config`.
SECTIONS: dict[str, tuple[type[Section], str]] = {
    "model": (ModelConfig, "model_config.yaml"),
    "training": (TrainingConfig, "training_config.yaml"),
    "grpo": (GRPOConfig, "grpo_config.yaml"),
    "env": (EnvConfig, "env_config.yaml"),
    "deepspeed": (DeepSpeedConfig, "deepspeed_config.json"),
}
CORE_SECTIONS = ("model", "training", "grpo", "env")


@dataclass(frozen=True)
class ConfigSources:
    """Where a `Config` came from: the file of each section and the `--set` overrides."""

    files: dict[str, str] = field(default_factory=dict)
    overrides: tuple[Override, ...] = ()

    def overrides_for(self, section: str) -> list[Override]:
        return [o for o in self.overrides if o.section == section]


def cross_check(model: ModelConfig, training: TrainingConfig, grpo: GRPOConfig) -> list[tuple[str, Loc, str]]:
    """Rules spanning files, as (section, field location, message)."""
    problems: list[tuple[str, Loc, str]] = []
    if model.quantization.load_in_4bit and training.mode != "lora":
        problems.append(
            ("model", ("quantization", "load_in_4bit"), "4-bit loading (QLoRA) needs training.mode=lora, got full")
        )
    accumulation = training.gradient_accumulation
    if accumulation is not None and not grpo.batcher.enabled:
        micro_batches = nominal_micro_batches(training, grpo)
        if accumulation > micro_batches:
            problems.append(
                (
                    "training",
                    ("gradient_accumulation",),
                    f"{accumulation} is more than the {micro_batches} micro-batches a step has "
                    f"(tasks_per_step {training.tasks_per_step} x group_size {grpo.group_size} / "
                    f"micro_batch_size {training.micro_batch_size})",
                )
            )
    return problems


def nominal_micro_batches(training: TrainingConfig, grpo: GRPOConfig) -> int:
    """Micro-batches in one update epoch of a step with no filtered groups (fixed tasks_per_step)."""
    return math.ceil(training.tasks_per_step * grpo.group_size / training.micro_batch_size)


class Config(BaseModel):
    """Everything a run needs: the four validated sections, plus the DeepSpeed file loaded on
    demand (`load_deepspeed()`) by full-mode runs."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    model: ModelConfig = Field(default_factory=ModelConfig, description="configs/model_config.yaml")
    training: TrainingConfig = Field(default_factory=TrainingConfig, description="configs/training_config.yaml")
    grpo: GRPOConfig = Field(default_factory=GRPOConfig, description="configs/grpo_config.yaml")
    env: EnvConfig = Field(default_factory=EnvConfig, description="configs/env_config.yaml")

    _sources: ConfigSources = PrivateAttr(default_factory=ConfigSources)
    _distributed: dict[str, Any] = PrivateAttr(default_factory=dict)

    @model_validator(mode="after")
    def _cross_checks(self) -> Config:
        problems = cross_check(self.model, self.training, self.grpo)
        if problems:
            section, loc, message = problems[0]
            raise ValueError(f"{section}.{'.'.join(map(str, loc))}: {message}")
        return self

    def __eq__(self, other: object) -> bool:
        """Equal when the four sections are; where they were loaded from does not matter."""
        if not isinstance(other, Config):
            return NotImplemented
        return all(getattr(self, name) == getattr(other, name) for name in CORE_SECTIONS)

    __hash__ = None  # type: ignore[assignment] - mutable, like every pydantic model

    # ------------------------------------------------------------------ provenance and dumps
    @property
    def sources(self) -> ConfigSources:
        """The files and overrides this config was loaded from (empty when built in code)."""
        return self._sources

    def to_dict(self) -> dict[str, Any]:
        """JSON-compatible {'model': ..., 'training': ..., 'grpo': ..., 'env': ...}."""
        return self.model_dump(mode="json")

    def dump_yaml(self) -> str:
        """The resolved config as one YAML document (sections in file order), for run logs."""
        return yaml.safe_dump(self.to_dict(), sort_keys=False, allow_unicode=True)

    # ------------------------------------------------------------------ derived values
    def nominal_gradient_accumulation(self) -> int:
        """Micro-batches per optimizer step: `training.gradient_accumulation`, or (null) all
        micro-batches of a step, assuming no filtered groups and the fixed tasks_per_step."""
        return self.training.gradient_accumulation or nominal_micro_batches(self.training, self.grpo)

    def deepspeed_auto_values(self) -> dict[str, int | float]:
        """Values for the DeepSpeed 'auto' keys that accelerate cannot fill without a dataloader:
        assign them into `accelerator.state.deepspeed_plugin.deepspeed_config` before `prepare`."""
        return {
            "train_micro_batch_size_per_gpu": self.training.micro_batch_size,
            "gradient_accumulation_steps": self.nominal_gradient_accumulation(),
            "gradient_clipping": self.training.max_grad_norm,
        }

    # ------------------------------------------------------------------ on-demand files
    def load_deepspeed(self) -> DeepSpeedConfig:
        """deepspeed_config.json (packaged default or the path given), validated for `training.mode`
        (ZeRO-3 for full, bf16); cached."""
        if "deepspeed" not in self._distributed:
            path = self._sources.files.get("deepspeed", str(PACKAGED_CONFIG_DIR / SECTIONS["deepspeed"][1]))
            self._distributed["deepspeed"] = load_deepspeed_config(
                path, [o.text for o in self._sources.overrides_for("deepspeed")], mode=self.training.mode
            )
        return self._distributed["deepspeed"]


def section_yaml(name: str, value: BaseModel, profile: str = "cpu") -> str:
    """A core section as the commented YAML file it is stored in (see yaml_io.render_section)."""
    schema, filename = SECTIONS[name]
    gpu = profile_name(profile) == "gpu"
    header = [
        f"{filename}: {(schema.__doc__ or '').strip().splitlines()[0]}",
        f"Values: the {'gpu profile (Qwen2.5-1.5B on an H100)' if gpu else 'cpu profile (embedded tiny model)'}; "
        f"comments give the {'CPU' if gpu else 'H100 (gpu profile)'} value where it differs.",
        f"Each knob is documented once, in {schema.__module__.replace('.', '/')}.py (Field descriptions).",
        "Regenerate: python -m skyrl_tool_agent.config write-defaults configs" + (" --profile gpu" if gpu else ""),
    ]
    return render_section(value, header, "h100" if gpu else "cpu")


#: `--profile`: which column of defaults a packaged section takes (`gpu`: each knob's H100 value; no
#: data knob has one). `h100` is the earlier spelling of `gpu` (accepted, with a warning).
PROFILES = ("cpu", "gpu")
DEPRECATED_PROFILES = {"h100": "gpu"}


def profile_name(profile: str) -> str:
    """`profile` in its one spelling: a deprecated alias (h100) becomes its name (gpu), with a warning."""
    if profile in DEPRECATED_PROFILES:
        logger.warning("--profile %s is deprecated: it is spelled %s now", profile, DEPRECATED_PROFILES[profile])
        return DEPRECATED_PROFILES[profile]
    return profile


def profile_on_top(name: str, data: dict[str, Any], profile: str, shown: str) -> dict[str, Any]:
    """Section `name` read from a user's file (`data`), under `profile`: each value equal to its CPU
    default (as `write-defaults` writes it) takes the profile's value; a value the user edited is
    kept. Logs the values taken and kept, once per file."""
    taken: list[str] = []
    kept: list[str] = []

    def merge(mine: Any, cpu: Any, other: Any, dotted: str) -> Any:
        if isinstance(mine, dict) and isinstance(cpu, dict) and isinstance(other, dict):
            merged = {k: merge(v, cpu.get(k), other.get(k), f"{dotted}.{k}") if k in cpu else v for k, v in mine.items()}
            for k in other.keys() - mine.keys():  # not in the file (e.g. a knob newer than it): the default is the profile's
                if cpu.get(k) != other[k]:
                    taken.append(f"{dotted}.{k} (not in the file) -> {other[k]!r}")
                    merged[k] = other[k]
            return merged
        if cpu == other:
            return mine
        if mine == cpu:
            taken.append(f"{dotted} {mine!r} -> {other!r}")
            return other
        kept.append(f"{dotted} {mine!r}")
        return mine

    merged = merge(data, profile_defaults(name, "cpu"), profile_defaults(name, profile), name)
    if taken or kept:
        logger.info("profile %s on %s: %s%s", profile, shown,
                    f"{len(taken)} values at their CPU default take the {profile} value ({'; '.join(taken)})" if taken
                    else "no value at its CPU default", f"; edited, kept: {'; '.join(kept)}" if kept else "")
    return merged


def profile_defaults(name: str, profile: str) -> dict[str, Any]:
    """The packaged defaults of core section `name` under `profile`, as a mapping to validate."""
    schema = SECTIONS[name][0]
    return yaml.safe_load(section_yaml(name, schema(), profile))


def _parse_overrides(overrides: Sequence[str | Override]) -> tuple[Override, ...]:
    if isinstance(overrides, str):  # a lone string would be iterated character by character
        overrides = [overrides]
    return tuple(o if isinstance(o, Override) else parse_override(o, tuple(SECTIONS)) for o in overrides)


def _validate(name: str, data: dict[str, Any], shown: str, overrides: Sequence[Override]) -> Section:
    schema = SECTIONS[name][0]
    data = copy.deepcopy(data)
    written: list[tuple[Loc, Override]] = [(apply_override(data, o), o) for o in overrides]
    try:
        return schema.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(validation_message(exc, schema, shown, written)) from None


def load_deepspeed_config(path: str | Path, overrides: Sequence[str] = (), *, mode: str = "full") -> DeepSpeedConfig:
    """Read and validate a DeepSpeed JSON for training.mode `mode` (`deepspeed.*` overrides apply)."""
    parsed = [o for o in _parse_overrides(overrides) if o.section == "deepspeed"]
    result = _validate("deepspeed", read_mapping(path), str(path), parsed)
    assert isinstance(result, DeepSpeedConfig)
    for loc, message in result.check_for_mode(mode):
        raise ConfigError(f"{path}: {loc}: {message}")
    return result


def _read_single_file(path: str | Path) -> dict[str, dict[str, Any]]:
    """The sections of one YAML file holding several (`model:`, `training:`, `grpo:`, `env:` at the
    top level, as `Config.dump_yaml()` writes it); a section left out keeps its defaults."""
    shown = str(path)
    data = read_mapping(path)
    sections: dict[str, dict[str, Any]] = {}
    for key, value in data.items():
        if key not in CORE_SECTIONS:
            hint = difflib.get_close_matches(str(key), CORE_SECTIONS, n=1)
            extra = (
                "; the DeepSpeed file is given with --deepspeed-config"
                if key in SECTIONS
                else (f" (did you mean '{hint[0]}'?)" if hint else "")
            )
            raise ConfigError(
                f"{shown}: unknown section '{key}' (expected top-level keys {', '.join(CORE_SECTIONS)}){extra}"
            )
        if value is None:
            value = {}
        if not isinstance(value, dict):
            raise ConfigError(f"{shown}: {key}: expected a mapping of keys to values, got {type(value).__name__}")
        sections[key] = value
    return sections


def load_config(
    config_dir: str | Path | None = None,
    overrides: Sequence[str | Override] = (),
    *,
    config_file: str | Path | None = None,
    model_config: str | Path | None = None,
    training_config: str | Path | None = None,
    grpo_config: str | Path | None = None,
    env_config: str | Path | None = None,
    deepspeed_config: str | Path | None = None,
    profile: str = "cpu",
) -> Config:
    """Load `<config_dir>/{model,training,grpo,env}_config.yaml` (None: the packaged defaults),
    apply `overrides` (`["grpo.group_size=4"]`, values parsed as YAML) and validate.

    `config_file` instead reads every section from one YAML file (a missing section keeps its
    defaults; a run's config.yaml is one); it excludes `config_dir`. `*_config=` replaces one
    section's file. `profile` ("cpu"/"gpu") picks the packaged defaults' values; in a user's
    `config_dir` it replaces the values left at their CPU default (`profile_on_top`); files named
    one by one are read as they are. Any problem is one `ConfigError` line.
    """
    given = {
        "model": model_config,
        "training": training_config,
        "grpo": grpo_config,
        "env": env_config,
        "deepspeed": deepspeed_config,
    }
    if config_file is not None and config_dir is not None:
        raise ConfigError(f"give a config directory ({config_dir}) or a single config file ({config_file}), not both")
    if profile not in PROFILES and profile not in DEPRECATED_PROFILES:
        raise ConfigError(f"--profile must be one of {', '.join(PROFILES)}, got {profile!r}")
    profile = profile_name(profile)
    directory = Path(PACKAGED_CONFIG_DIR if config_dir is None else config_dir)
    single = _read_single_file(config_file) if config_file is not None else None
    paths: dict[str, str] = {}
    shown: dict[str, str] = {}  # how each core section's source is named in errors
    raw: dict[str, dict[str, Any]] = {}
    for name in SECTIONS:
        if given[name]:
            paths[name] = shown[name] = str(given[name])
        elif single is not None and name in CORE_SECTIONS:
            paths[name], shown[name] = str(config_file), f"{config_file}: {name}"
            raw[name] = single.get(name, {})
        else:
            source = PACKAGED_CONFIG_DIR if single is not None else directory
            paths[name] = shown[name] = str(source / SECTIONS[name][1])
            if profile != "cpu" and name in CORE_SECTIONS:
                if source == PACKAGED_CONFIG_DIR:
                    raw[name] = profile_defaults(name, profile)
                    shown[name] = f"{paths[name]} ({profile} profile)"
                else:  # a directory of the user's: the profile applies to the values left at their CPU default
                    raw[name] = profile_on_top(name, read_mapping(paths[name]), profile, paths[name])
    sources = ConfigSources(files=paths, overrides=_parse_overrides(overrides))
    parts = {
        name: _validate(name, raw[name] if name in raw else read_mapping(paths[name]), shown[name],
                        sources.overrides_for(name))
        for name in CORE_SECTIONS
    }
    model, training, grpo = parts["model"], parts["training"], parts["grpo"]
    assert isinstance(model, ModelConfig) and isinstance(training, TrainingConfig) and isinstance(grpo, GRPOConfig)
    for section, loc, message in cross_check(model, training, grpo):
        written = {o.path: o for o in sources.overrides_for(section)}
        dotted = ".".join(map(str, loc))
        where = written[loc].label if loc in written else shown[section]
        raise ConfigError(f"{where}: {dotted}: {message}")
    if grpo.batcher.enabled and _sets_tasks_per_step(raw, paths, sources):
        logger.warning("training.tasks_per_step=%d has no effect: grpo.batcher.enabled sizes each step instead "
                       "(up to grpo.batcher.max_batch=%d tasks within grpo.batcher.target_turns=%g expected turns); "
                       "set those, or grpo.batcher.enabled=false", training.tasks_per_step,
                       grpo.batcher.max_batch, grpo.batcher.target_turns)
    config = Config(**parts)
    config._sources = sources
    return config


def _sets_tasks_per_step(raw: dict[str, dict[str, Any]], paths: dict[str, str], sources: ConfigSources) -> bool:
    """Whether the user gave training.tasks_per_step: a `--set`, or a value in a training file of
    theirs other than the packaged default (a file written by write-defaults holds the default)."""
    if any(o.path == ("tasks_per_step",) for o in sources.overrides_for("training")):
        return True
    if paths["training"] == str(PACKAGED_CONFIG_DIR / SECTIONS["training"][1]):
        return False
    data = raw["training"] if "training" in raw else read_mapping(paths["training"])
    field = TrainingConfig.model_fields["tasks_per_step"]
    defaults = {field.get_default(), h100_value(field)}
    return "tasks_per_step" in data and data["tasks_per_step"] not in defaults
