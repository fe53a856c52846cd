"""How the config reaches launchers and scripts: the DeepSpeed file (validated, and accepted by
accelerate with the launcher file, which accelerate alone reads), the scripts' config flags, and the exit-2 one-line guard."""

from __future__ import annotations

import argparse
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from skyrl_tool_agent.config import (
    ConfigError,
    add_config_args,
    cli_main_guard,
    config_from_args,
    load_config,
    load_deepspeed_config,
)
from tests.fixtures.config_files import CONFIGS, REPO, edit


# ---------------------------------------------------------------------------- accelerate / DeepSpeed files
def test_distributed_files_load_and_are_real() -> None:
    cfg = load_config(CONFIGS, ["training.mode=full"])
    ds = cfg.load_deepspeed()
    assert ds.zero_optimization.stage == 3 and ds.bf16.enabled is True
    assert ds.zero_optimization.offload_optimizer is None  # no offload by default
    # accelerate alone reads the launcher file (it rejects unknown keys): DeepSpeed with our JSON,
    # the precision left to it (mixed_precision null: see the next test).
    config_args = pytest.importorskip("accelerate.commands.config.config_args")
    launcher = config_args.ClusterConfig.from_yaml_file(str(CONFIGS / "accelerate_config.yaml"))
    assert launcher.distributed_type == "DEEPSPEED" and launcher.num_processes == 8 and launcher.mixed_precision is None
    assert launcher.deepspeed_config["deepspeed_config_file"] == "configs/deepspeed_config.json"


def test_accelerate_accepts_the_deepspeed_file(monkeypatch: pytest.MonkeyPatch) -> None:
    """The DeepSpeed plugin as `accelerate launch` builds it from our files: ZeRO-3 and bf16 on."""
    utils = pytest.importorskip("accelerate.utils")
    monkeypatch.chdir(REPO)
    monkeypatch.setenv("ACCELERATE_CONFIG_DS_FIELDS", "deepspeed_config_file,zero3_init_flag")
    plugin = utils.DeepSpeedPlugin(hf_ds_config="configs/deepspeed_config.json", zero3_init_flag=True)
    plugin.set_mixed_precision("no")  # what the launcher passes when mixed_precision is null
    assert plugin.zero_stage == 3 and plugin.deepspeed_config["bf16"]["enabled"] is True
    # Why the launcher file keeps mixed_precision null next to a deepspeed_config_file:
    monkeypatch.setenv("ACCELERATE_CONFIG_DS_FIELDS", "deepspeed_config_file,zero3_init_flag,mixed_precision")
    with pytest.raises(ValueError, match="will be ignored"):
        utils.DeepSpeedPlugin(hf_ds_config="configs/deepspeed_config.json")


def test_distributed_file_errors(cfg_dir: Path) -> None:
    ds = cfg_dir / "deepspeed_config.json"
    edit(ds, '"stage": 3', '"stage": 2')
    assert load_deepspeed_config(ds, mode="lora").zero_optimization.stage == 2
    with pytest.raises(ConfigError) as info:
        load_config(cfg_dir, ["training.mode=full"]).load_deepspeed()
    assert str(info.value) == f"{ds}: zero_optimization.stage: must be 3 for training.mode=full, got 2"
    with pytest.raises(ConfigError, match=r"bf16.enabled: must be true, got 'auto'"):
        load_deepspeed_config(CONFIGS / "deepspeed_config.json", ["deepspeed.bf16.enabled=auto"])
    with pytest.raises(ConfigError, match=r"train_micro_batch_size_per_gpu: expected an integer or 'auto', got 'big'"):
        load_deepspeed_config(CONFIGS / "deepspeed_config.json", ["deepspeed.train_micro_batch_size_per_gpu=big"])
    edit(ds, '"stage": 2,', '"stage": 2')
    with pytest.raises(ConfigError, match=rf"^{ds}: invalid JSON at line \d+, column \d+: "):
        load_deepspeed_config(ds)


# ---------------------------------------------------------------------------- scripts
def test_cli_args(tmp_path: Path) -> None:
    other = tmp_path / "g.yaml"
    other.write_text("group_size: 6\n")
    parser = add_config_args(argparse.ArgumentParser())
    args = parser.parse_args(["--config-dir", str(CONFIGS), "--set", "model.lora.r=4", "--grpo-config", str(other)])
    cfg = config_from_args(args)
    assert cfg.model.lora.r == 4 and cfg.grpo.group_size == 6


def test_guard_in_process(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info, cli_main_guard():
        load_config(CONFIGS, ["grpo.group_size=x"])
    assert info.value.code == 2
    assert capsys.readouterr().err.startswith("error: --set grpo.group_size=x: group_size: ")
    with pytest.raises(RuntimeError), cli_main_guard():  # bugs are not swallowed
        raise RuntimeError("bug")


def test_script_with_bad_config_exits_2_with_one_line(cfg_dir: Path) -> None:
    edit(cfg_dir / "grpo_config.yaml", "group_size: 8 ", "group_size: four ")
    script = textwrap.dedent(
        """
        import sys
        from skyrl_tool_agent.config import cli_main_guard, load_config

        @cli_main_guard()
        def main() -> None:
            load_config(sys.argv[1])
            print("loaded")

        main()
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", script, str(cfg_dir)], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == ""
    assert proc.stderr.splitlines() == [
        f"error: {cfg_dir}/grpo_config.yaml: group_size: Input should be a valid integer, "
        "unable to parse string as an integer (got 'four')"
    ]
    assert "Traceback" not in proc.stderr


def test_a_missing_optional_dependency_is_one_line_naming_its_extra():
    from skyrl_tool_agent.config import UserInputError, require_extra

    require_extra("yaml", "dev", "reading configs")  # installed: nothing happens
    with pytest.raises(UserInputError) as err:
        require_extra("skyrl_no_such_module", "deepspeed", "training.mode=full under a launcher")
    message = str(err.value)
    assert "\n" not in message and "training.mode=full under a launcher needs skyrl_no_such_module" in message
    assert "pip install 'skyrl-tool-agent[deepspeed]'" in message
