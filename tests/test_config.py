"""The config schema, the shipped configs/ files, `--set` overrides and the one-line errors."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, get_args

import pytest
import yaml
from pydantic import BaseModel, ValidationError

from skyrl_tool_agent.config import (
    Config,
    ConfigError,
    DifficultyMix,
    EnvConfig,
    GRPOConfig,
    SHIPPED_EMBEDDED_DIR,
    ModelConfig,
    TrainingConfig,
    default_build_dir,
    load_config,
)
from skyrl_tool_agent.config.__main__ import main as config_cli
from skyrl_tool_agent.config.loader import CORE_SECTIONS, SECTIONS, section_yaml
from skyrl_tool_agent.data.tasks import Difficulty
from tests.fixtures.config_files import CONFIGS, REPO, edit


def config_error(*args: Any, **kwargs: Any) -> str:
    with pytest.raises(ConfigError) as info:
        load_config(*args, **kwargs)
    message = str(info.value)
    assert "\n" not in message
    return message


# ---------------------------------------------------------------------------- defaults and shipped files
def test_shipped_yaml_equals_model_defaults() -> None:
    loaded = load_config(CONFIGS)
    assert loaded == Config()
    for name in CORE_SECTIONS:
        assert getattr(loaded, name) == SECTIONS[name][0]()
    assert loaded.grpo.group_size == 8 and loaded.model.name_or_path == "embedded"
    assert loaded.sources.files["grpo"] == str(CONFIGS / "grpo_config.yaml")


@pytest.mark.parametrize("name", CORE_SECTIONS)
def test_shipped_yaml_is_the_generated_file(name: str) -> None:
    """The YAML files are written by `write-defaults`; a hand edit of a default must go to the schema."""
    schema, filename = SECTIONS[name]
    assert (CONFIGS / filename).read_text() == section_yaml(name, schema()), (
        f"configs/{filename} drifted: run `python -m skyrl_tool_agent.config write-defaults configs`"
    )


def test_gpu_profile_files_are_what_profile_gpu_loads_data_section_untouched(tmp_path: Path, caplog) -> None:
    """`write-defaults --profile gpu` writes exactly what `--profile gpu` loads: each knob's H100 value
    and the data section as it is (it wrote dataset: spider before, while the profile kept builtin)."""
    config_cli(["write-defaults", str(tmp_path), "--profile", "gpu"])
    gpu = load_config(tmp_path)
    assert gpu == load_config(profile="gpu")
    assert gpu.grpo.group_size == 16 and gpu.model.name_or_path == "Qwen/Qwen2.5-1.5B-Instruct"
    assert gpu.training.data.dataset == "builtin" and gpu.grpo.batcher.enabled
    assert gpu.grpo.curriculum == GRPOConfig().curriculum  # knobs without an H100 value keep the CPU one
    assert "CPU default 8; H100: 16." in (GRPOConfig.model_fields["group_size"].description or "")
    assert "group_size: 16" in (tmp_path / "grpo_config.yaml").read_text()
    assert "write-defaults configs --profile gpu" in (tmp_path / "grpo_config.yaml").read_text()
    # the earlier spelling still works, with a warning naming the one spelling
    with caplog.at_level("WARNING"):
        config_cli(["write-defaults", str(tmp_path / "old"), "--profile", "h100"])
        assert load_config(profile="h100") == gpu
    assert load_config(tmp_path / "old") == gpu
    said = [r.getMessage() for r in caplog.records if "deprecated" in r.getMessage()]
    assert said and all(m == "--profile h100 is deprecated: it is spelled gpu now" for m in said)


def test_tasks_per_step_under_the_batcher_says_it_has_no_effect(tmp_path: Path, caplog) -> None:
    """The gpu profile's batcher sizes steps: a tasks_per_step the user sets is ignored, and the load
    says so (in a --set or in the user's file); knobs says so too."""
    def warnings(**kwargs) -> list[str]:
        caplog.clear()
        with caplog.at_level("WARNING"):
            load_config(**kwargs)
        return [r.getMessage() for r in caplog.records if "tasks_per_step" in r.getMessage()]

    said = warnings(overrides=["training.tasks_per_step=32"], profile="gpu")
    assert len(said) == 1 and said[0].startswith("training.tasks_per_step=32 has no effect: grpo.batcher.enabled")
    assert warnings(profile="gpu") == [] and warnings(overrides=["training.tasks_per_step=32"]) == []
    config_cli(["write-defaults", str(tmp_path), "--profile", "gpu"])
    assert warnings(config_dir=tmp_path) == []  # the file holds the profile's own value
    text = (tmp_path / "training_config.yaml").read_text().replace("tasks_per_step: 16", "tasks_per_step: 32")
    (tmp_path / "training_config.yaml").write_text(text)
    assert len(warnings(config_dir=tmp_path)) == 1
    description = TrainingConfig.model_fields["tasks_per_step"].description or ""
    assert "No effect while it is on" in description and "grpo.batcher.max_batch" in description


def _all_fields(model: type[BaseModel], prefix: str = "") -> list[tuple[str, Any]]:
    out = []
    for name, field in model.model_fields.items():
        out.append((prefix + name, field))
        for arg in (field.annotation, *get_args(field.annotation)):
            if isinstance(arg, type) and issubclass(arg, BaseModel):
                out.extend(_all_fields(arg, f"{prefix}{name}."))
    return out


def test_every_knob_is_documented() -> None:
    for name in CORE_SECTIONS:
        for dotted, field in _all_fields(SECTIONS[name][0], f"{name}."):
            assert (field.description or "").strip(), f"{dotted} has no description"


def test_difficulty_mix_matches_task_difficulties() -> None:
    assert tuple(DifficultyMix.model_fields) == get_args(Difficulty)


def test_knobs_listing(capsys: pytest.CaptureFixture[str]) -> None:
    config_cli(["knobs", "--markdown"])
    out = capsys.readouterr().out
    assert "| grpo.group_size | int | 8 | 16 |" in out
    assert "| model.lora.r | int | 16 |  |" in out
    # Containers name their items' type, not a truncated repr (was "RewardTermConfig]").
    assert "| env.reward.terms | list[RewardTermConfig] |" in out
    assert "| env.offered_tools | list[str] \\| null |" in out  # the union's bar escaped in the table


# ---------------------------------------------------------------------------- one-line errors from files
def test_wrong_type_names_file_and_field(cfg_dir: Path) -> None:
    edit(cfg_dir / "grpo_config.yaml", "group_size: 8 ", "group_size: four ")
    assert config_error(cfg_dir) == (
        f"{cfg_dir}/grpo_config.yaml: group_size: Input should be a valid integer, "
        "unable to parse string as an integer (got 'four')"
    )


def test_unknown_key_names_file_and_suggests(cfg_dir: Path) -> None:
    edit(cfg_dir / "training_config.yaml", "learning_rate:", "learning_rat:")
    assert config_error(cfg_dir) == (
        f"{cfg_dir}/training_config.yaml: unknown key 'learning_rat' (did you mean 'learning_rate'?)"
    )


def test_nested_unknown_key(cfg_dir: Path) -> None:
    edit(cfg_dir / "training_config.yaml", "  dataset: builtin", "  datset: builtin")
    assert config_error(cfg_dir) == (
        f"{cfg_dir}/training_config.yaml: unknown key 'data.datset' (did you mean 'dataset'?)"
    )


def test_missing_file(cfg_dir: Path) -> None:
    (cfg_dir / "model_config.yaml").unlink()
    assert config_error(cfg_dir) == f"config file not found: {cfg_dir}/model_config.yaml"
    assert config_error("no/such/dir") == "config file not found: no/such/dir/model_config.yaml"


def test_yaml_syntax_error_has_line_number(cfg_dir: Path) -> None:
    edit(cfg_dir / "env_config.yaml", "sql_timeout_s: 5.0", "sql_timeout_s: [5.0")
    message = config_error(cfg_dir)
    assert message.startswith(f"{cfg_dir}/env_config.yaml: invalid YAML at line ")
    line = next(i for i, t in enumerate((cfg_dir / "env_config.yaml").read_text().splitlines(), 1) if "[5.0" in t)
    assert f"line {line}," in message or f"line {line + 1}," in message


def test_duplicate_key_is_an_error(cfg_dir: Path) -> None:
    path = cfg_dir / "grpo_config.yaml"
    path.write_text(path.read_text() + "group_size: 4\n")
    message = config_error(cfg_dir)
    assert message.startswith(f"{path}: invalid YAML at line ") and "duplicate key 'group_size'" in message


def test_top_level_must_be_a_mapping(cfg_dir: Path) -> None:
    (cfg_dir / "model_config.yaml").write_text("- a\n- b\n")
    assert config_error(cfg_dir) == (
        f"{cfg_dir}/model_config.yaml: expected a mapping of keys to values at the top level, got list"
    )


def test_empty_file_means_defaults(cfg_dir: Path) -> None:
    (cfg_dir / "env_config.yaml").write_text("# nothing\n")
    assert load_config(cfg_dir).env == EnvConfig()


def test_several_problems_stay_on_one_line(cfg_dir: Path) -> None:
    edit(cfg_dir / "grpo_config.yaml", "temperature: 1.0", "temperature: -1")
    edit(cfg_dir / "grpo_config.yaml", "top_p: 1.0", "top_p: 2")
    message = config_error(cfg_dir)
    assert "temperature: Input should be greater than 0 (got -1)" in message
    assert "; " in message and "top_p: Input should be less than or equal to 1 (got 2)" in message


def test_per_file_path_override(cfg_dir: Path, tmp_path: Path) -> None:
    other = tmp_path / "my_grpo.yaml"
    other.write_text("group_size: 4\n")
    assert load_config(cfg_dir, grpo_config=other).grpo.group_size == 4
    other.write_text("group_size: 1\n")
    assert config_error(cfg_dir, grpo_config=other) == (
        f"{other}: group_size: Input should be greater than or equal to 2 (got 1)"
    )


# ---------------------------------------------------------------------------- --set overrides
def test_overrides_apply_before_validation() -> None:
    cfg = load_config(
        CONFIGS,
        [
            "grpo.group_size=4",
            "model.lora.r=8",
            "training.data.dataset=spider",
            "training.learning_rate=1e-5",
            "model.lora.target_modules=[q_proj, v_proj]",
            "env.mcp_servers.0.args=[-m, mcp_tools.sqlite_server, --db-root, '${db_root}', --verbose]",
            "training.wandb.run_name=my run",
            "grpo.curriculum.start={easy: 0.5, medium: 0.5, hard: 0.0}",
        ],
    )
    assert cfg.grpo.group_size == 4 and cfg.model.lora.r == 8
    assert cfg.training.data.dataset == "spider" and cfg.training.learning_rate == 1e-5
    assert cfg.model.lora.target_modules == ["q_proj", "v_proj"]
    assert cfg.env.mcp_servers[0].args[-1] == "--verbose"
    assert cfg.training.wandb.run_name == "my run"
    assert cfg.grpo.curriculum.start.model_dump() == {"easy": 0.5, "medium": 0.5, "hard": 0.0}
    assert load_config(CONFIGS, "grpo.group_size=4").grpo.group_size == 4  # a lone string is one override


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        (
            "grpo.group_size=x",
            "--set grpo.group_size=x: group_size: Input should be a valid integer, "
            "unable to parse string as an integer (got 'x')",
        ),
        (
            "grpo.group_size=1",
            "--set grpo.group_size=1: group_size: Input should be greater than or equal to 2 (got 1)",
        ),
        (
            "training.learning_rat=1",
            "--set training.learning_rat=1: unknown key 'learning_rat' (did you mean 'learning_rate'?)",
        ),
        (
            "grpo.curriculum.start.easy=0.5",
            "--set grpo.curriculum.start.easy=0.5: curriculum.start: weights must sum to 1, got 1.2 "
            "(easy 0.5, medium 0.5, hard 0.2)",
        ),
        ("grpo.group_size", "--set grpo.group_size: expected KEY=VALUE, e.g. grpo.group_size=4"),
        (
            "grp.group_size=4",
            "--set grp.group_size=4: unknown section 'grp' (expected one of model, training, grpo, env, "
            "deepspeed); did you mean 'grpo'?",
        ),
        ("grpo=4", "--set grpo=4: name a key inside the section, e.g. grpo.<key>=VALUE"),
        ("model.dtype.x=1", "--set model.dtype.x=1: 'dtype' is str, not a mapping"),
        (
            "env.mcp_servers.3.name=x",
            "--set env.mcp_servers.3.name=x: index 3 out of range ('mcp_servers' has 1 item)",
        ),
        (
            "env.mcp_servers.name=x",
            "--set env.mcp_servers.name=x: 'mcp_servers' is a list; use an index, e.g. mcp_servers.0",
        ),
        (
            "training.seed=[1",
            "--set training.seed=[1: value is not valid YAML (expected ',' or ']', but got '<stream end>'); "
            "quote it if it is a string",
        ),
        (
            "model.quantization.load_in_4bit=true",
            "--set model.quantization.load_in_4bit=true: quantization.load_in_4bit: 4-bit loading (QLoRA) needs "
            "training.mode=lora, got full",
        ),
    ],
)
def test_bad_overrides_name_the_override(override: str, expected: str) -> None:
    extra = ["training.mode=full"] if "load_in_4bit" in override else []
    assert config_error(CONFIGS, [*extra, override]) == expected


def test_model_level_error_names_file_and_overrides(cfg_dir: Path) -> None:
    """A rule over several fields cannot be pinned on one override, so both are named."""
    message = config_error(cfg_dir, ["grpo.max_total_tokens=64"])
    assert message.startswith(f"{cfg_dir}/grpo_config.yaml (with --set grpo.max_total_tokens=64): ")
    assert "max_total_tokens (64) must be >= max_new_tokens_per_turn (128)" in message


# ---------------------------------------------------------------------------- validators
@pytest.mark.parametrize(
    ("mix", "ok"),
    [
        ({"easy": 0.1, "medium": 0.2, "hard": 0.7}, True),  # 0.1 + 0.2 != 0.3 exactly in floats
        ({"easy": 1.0, "medium": 0.0, "hard": 5e-7}, True),
        ({"easy": 1.0, "medium": 0.0, "hard": 2e-6}, False),
        ({"easy": 0.3, "medium": 0.3, "hard": 0.3}, False),
        ({"easy": 1.2, "medium": -0.2, "hard": 0.0}, False),
        ({"easy": 0.5, "medium": 0.5}, False),
    ],
)
def test_difficulty_mix_validation(mix: dict[str, float], ok: bool) -> None:
    if ok:
        DifficultyMix(**mix)
    else:
        with pytest.raises(ValidationError):
            DifficultyMix(**mix)


@pytest.mark.parametrize(
    ("override", "fragment"),
    [
        ("grpo.clip_eps_low=-0.1", "clip_eps_low: Input should be greater than or equal to 0"),
        ("grpo.curriculum.adaptive_low=0.95", "adaptive_low (0.95) must be below adaptive_high (0.9)"),
        ("grpo.top_p=0", "top_p: Input should be greater than 0"),
        (
            "grpo.loss_aggregation=mean",
            "loss_aggregation: Input should be 'token_mean', 'sequence_mean' or 'fixed_length'",
        ),
        ("training.adam_betas=[0.9, 1.5]", "each beta must be in [0, 1), got [0.9, 1.5]"),
        ("training.gradient_accumulation=9", "gradient_accumulation: 9 is more than the 8 micro-batches a step has"),
        ("env.mcp_servers.0.args=[--db, '${dbroot}']", "unknown placeholder '${dbroot}' (known: ${db_root}, ${sql_timeout_s})"),
        ("env.reward.terms.2.weight=.nan", "reward.terms.2.weight: Input should be a finite number"),
        # the fixed weights became terms: a stale config is told the new spelling
        ("env.reward.partial_weight=0", ("reward: partial_weight is now a term of reward.terms, a list of {name, weight}: "
                                         "the default is terms: [{name: execution, weight: 1}, {name: format, weight: 0.1}")),
        # removed: nothing ever read it (no value head, no per-turn advantages); a stale YAML must say so
        ("grpo.turn_level_credit.enabled=true", "unknown key 'turn_level_credit'"),
        ("model.dtype=fp16", "dtype: Input should be 'auto', 'float32', 'bfloat16' or 'float16' (got 'fp16')"),
    ],
)
def test_validators(override: str, fragment: str) -> None:
    message = config_error(CONFIGS, [override])
    assert message.startswith(f"--set {override}: ") and fragment in message


def test_reward_rules_are_not_checked_at_load(cfg_dir: Path) -> None:
    """The reward's rules need its terms' functions (a term of your own may count only when wrong):
    they are checked when the run is built (tests/test_reward_terms.py), so a config that breaks
    them loads; a value no reward can have (NaN) is still a config error."""
    zeros = [f"env.reward.terms.{i}.weight=0" for i in range(4)]
    assert [t.weight for t in load_config(CONFIGS, zeros).env.reward.terms] == [0.0] * 4
    assert "reward.terms.2.weight: Input should be a finite number" in config_error(CONFIGS, ["env.reward.terms.2.weight=.nan"])


def test_duplicate_server_names() -> None:
    with pytest.raises(ValidationError, match="duplicate server names"):
        EnvConfig(mcp_servers=[{"name": "a", "command": "x"}, {"name": "a", "command": "y"}])


def test_cross_file_rule_also_holds_in_code() -> None:
    with pytest.raises(ValidationError, match="needs training.mode=lora"):
        Config(model={"quantization": {"load_in_4bit": True}}, training={"mode": "full"})


# ---------------------------------------------------------------------------- resolution helpers
def test_server_placeholders_and_python(tmp_path: Path) -> None:
    cfg = load_config(CONFIGS, [f"training.data.db_root={tmp_path}", "env.sql_timeout_s=2.5"])
    (server,) = cfg.env.resolved_servers(cfg.training.data.resolved_db_root())
    assert server.command == sys.executable
    assert server.args == ["-m", "mcp_tools.sqlite_server", "--db-root", str(tmp_path.resolve()), "--timeout-s", "2.5"]
    assert cfg.env.mcp_servers[0].args[3] == "${db_root}"  # the config itself stays as written


def test_data_paths_follow_the_dataset() -> None:
    builtin = TrainingConfig().data
    # the built-in defaults are the checkout's data/processed, whatever the working directory
    assert builtin.resolved_db_root() == REPO / "data" / "processed" / "databases"
    assert builtin.resolved_train_file() == REPO / "data" / "processed" / "train.json"
    spider = load_config(CONFIGS, ["training.data.dataset=spider", "training.data.spider_root=/s"]).training.data
    assert spider.resolved_db_root() == Path("/s/database")
    assert spider.resolved_dev_file() == Path("/s/dev.json")
    assert spider.resolved_train_file() == Path("/s/train_spider_compact.json")


def test_wandb_auto_mode() -> None:
    wandb = TrainingConfig().wandb
    assert wandb.resolved_mode({"WANDB_API_KEY": "k"}) == "online"
    assert wandb.resolved_mode({}) == "offline"
    assert wandb.model_copy(update={"mode": "disabled"}).resolved_mode({"WANDB_API_KEY": "k"}) == "disabled"


def test_embedded_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # embedded_dir null = the copy shipped in the package, wherever the cache is.
    monkeypatch.setenv("SKYRL_TOOL_AGENT_CACHE", str(tmp_path))
    assert ModelConfig().resolved_embedded_dir() == SHIPPED_EMBEDDED_DIR and ModelConfig().uses_shipped_model()
    assert SHIPPED_EMBEDDED_DIR == REPO / "skyrl_tool_agent" / "assets" / "embedded"
    # Builds (train_grpo.py --rebuild, build_default_model.py) go to the cache.
    assert default_build_dir() == tmp_path / "embedded"
    monkeypatch.delenv("SKYRL_TOOL_AGENT_CACHE")
    assert default_build_dir() == Path.home() / ".cache/skyrl_tool_agent/embedded"
    built = ModelConfig(embedded_dir="~/x")
    assert built.resolved_embedded_dir() == Path.home() / "x" and not built.uses_shipped_model()
    assert ModelConfig().is_embedded() and not ModelConfig(name_or_path="Qwen/Qwen2.5-1.5B-Instruct").is_embedded()


def test_dump_round_trip(tmp_path: Path) -> None:
    cfg = load_config(CONFIGS, ["grpo.group_size=4", "training.data.dataset=spider", "env.shaping_rewards=true"])
    dumped = yaml.safe_load(cfg.dump_yaml())
    assert list(dumped) == list(CORE_SECTIONS)
    assert Config.model_validate(dumped) == cfg
    (tmp_path / "config.yaml").write_text(cfg.dump_yaml())
    assert load_config(config_file=tmp_path / "config.yaml") == cfg


def test_gradient_accumulation_and_deepspeed_values() -> None:
    cfg = load_config(CONFIGS, ["training.tasks_per_step=2", "grpo.group_size=8", "training.micro_batch_size=4"])
    assert cfg.nominal_gradient_accumulation() == 4  # 2 tasks x 8 episodes / micro-batch 4
    assert cfg.deepspeed_auto_values() == {
        "train_micro_batch_size_per_gpu": 4,
        "gradient_accumulation_steps": 4,
        "gradient_clipping": 1.0,
    }


def test_library_defaults_are_the_config_knobs() -> None:
    """A call made without a config (a library user's, a test's) gets the knob's own default:
    each default below is referenced from the schema (`config.base.default_of`), never written again."""
    import inspect

    from skyrl_tool_agent.data.validation import GOLD_TIMEOUT_S
    from skyrl_tool_agent.env.environment import DEFAULT_MAX_TURNS
    from skyrl_tool_agent.mcp.pool import MCPClientPool
    from skyrl_tool_agent.rewards import GoldResultCache, Rubric, compare_execution, execution_match, score_answer
    from skyrl_tool_agent.rewards.limits import database_fault
    from skyrl_tool_agent.rollout.collector import CollectorSettings

    env, grpo = EnvConfig(), GRPOConfig()

    def default(fn: Any, name: str) -> Any:
        return inspect.signature(fn).parameters[name].default

    for fn in (compare_execution, execution_match, score_answer, Rubric.score, database_fault):
        assert default(fn, "timeout_s") == env.sql_timeout_s, fn
    assert GOLD_TIMEOUT_S == env.sql_timeout_s
    assert default(MCPClientPool, "call_timeout_s") == env.call_timeout_s
    # The one-file server writes its own (it imports nothing from the library): the share of this one.
    from mcp_tools.call_lanes import SHARE_OF_CLIENT_DEADLINE
    from mcp_tools.one_file_server import DEFAULT_TIMEOUT_S

    assert DEFAULT_TIMEOUT_S == SHARE_OF_CLIENT_DEADLINE * env.call_timeout_s
    assert default(MCPClientPool, "sessions_per_server") == env.sessions_per_server
    assert default(GoldResultCache, "maxsize") == env.reward.gold_cache_size
    assert DEFAULT_MAX_TURNS == grpo.max_turns
    settings = CollectorSettings()
    assert (settings.max_turns, settings.max_new_tokens_per_turn, settings.max_total_tokens) == (
        grpo.max_turns, grpo.max_new_tokens_per_turn, grpo.max_total_tokens)
    assert (settings.concurrency, settings.max_episode_retries) == (env.collector.concurrency,
                                                                    env.collector.max_episode_retries)
