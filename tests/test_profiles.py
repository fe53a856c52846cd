"""`--profile cpu|gpu|auto`: which column of the packaged defaults a run takes."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

from skyrl_tool_agent.config import ConfigError, load_config
from skyrl_tool_agent.config.base import h100_value, has_h100
from skyrl_tool_agent.config.training import TrainingConfig


def _show(*args: str) -> tuple[int, dict, str]:
    res = subprocess.run([sys.executable, "-m", "skyrl_tool_agent.config", "show", *args],
                         capture_output=True, text=True, timeout=120)
    return res.returncode, (yaml.safe_load(res.stdout) if res.returncode == 0 else {}), res.stderr


def test_gpu_profile_takes_every_h100_value_but_keeps_the_data_section():
    cpu, gpu = load_config(profile="cpu"), load_config(profile="gpu")
    changed = 0
    for name, field in TrainingConfig.model_fields.items():
        if has_h100(field) and name != "data":
            assert getattr(gpu.training, name) == h100_value(field), name
            assert getattr(cpu.training, name) == field.get_default(call_default_factory=True), name
            changed += 1
    assert changed >= 5
    assert gpu.model.name_or_path == "Qwen/Qwen2.5-1.5B-Instruct" and cpu.model.name_or_path == "embedded"
    assert gpu.grpo.max_new_tokens_per_turn == 512 and cpu.grpo.max_new_tokens_per_turn == 128
    assert gpu.training.data == cpu.training.data  # which tasks is the user's choice, not the machine's


def test_overrides_win_over_the_profile_and_bad_profiles_are_one_line_errors():
    config = load_config(overrides=["training.learning_rate=3e-6"], profile="gpu")
    assert config.training.learning_rate == 3e-6 and config.training.time_budget_minutes is None
    with pytest.raises(ConfigError, match="--profile must be one of cpu, gpu"):
        load_config(profile="tpu")
    # a config directory of the CPU defaults (the repository's configs/) takes the gpu values too
    assert load_config("configs", profile="gpu").training.learning_rate == 2e-5


def test_cli_profile_flag_and_auto_choice_without_cuda():
    rc, shown, err = _show("--profile", "gpu")
    assert rc == 0, err
    assert shown["training"]["learning_rate"] == pytest.approx(2e-5) and shown["grpo"]["group_size"] == 16
    # auto on a machine without CUDA: a real model keeps the CPU defaults (and says nothing about gpu)
    import torch

    if torch.cuda.is_available():
        pytest.skip("auto picks gpu on this machine; the CPU branch is what CI runs")
    rc, shown, err = _show("--set", "model.name_or_path=/tmp")
    assert rc == 0, err
    assert shown["training"]["learning_rate"] == pytest.approx(1e-3) and "profile gpu:" not in err
    # ... and says, in one line, which profile it took and why (it silently got the CPU lr before)
    said = [line for line in err.splitlines() if "profile cpu:" in line]
    assert len(said) == 1 and "model /tmp but no CUDA" in said[0] and "--profile gpu" in said[0], err
    rc, shown, err = _show("--profile", "gpu", "--config-dir", "configs")
    assert rc == 0 and shown["training"]["learning_rate"] == pytest.approx(2e-5), err


def test_gpu_profile_fits_an_80gb_gpu_with_every_episode_in_flight_by_the_memory_plan():
    """The gpu profile as configured (its 49,152-token update, 256 episodes in flight per GPU, KL,
    checkpointing) on the profile's model: the memory plan holds every episode beside the update on
    one 80 GB GPU in LoRA, and full mode's share on each of 8 (the plan, not the update alone)."""
    from skyrl_tool_agent.memory.device import GIB
    from skyrl_tool_agent.memory.shape import qwen25
    from skyrl_tool_agent.memory.sizing import plan_for

    gpu = load_config(profile="gpu")
    assert gpu.model.name_or_path == "Qwen/Qwen2.5-1.5B-Instruct" and gpu.model.gradient_checkpointing
    lora = plan_for(gpu, qwen25("Qwen2.5-1.5B"), device_bytes=80 * GIB, world=1, device_kind="cuda")
    assert lora.update_tokens == 49152 and lora.slots == lora.demand == 256, lora.describe()
    full = gpu.model_copy(update={"training": gpu.training.model_copy(update={"mode": "full"})})
    sharded = plan_for(full, qwen25("Qwen2.5-1.5B"), device_bytes=80 * GIB, world=8, device_kind="cuda")
    assert sharded.slots == sharded.demand == 64, sharded.describe()  # 32 tasks x 16 episodes over 8 GPUs


# ---------------------------------------------------------------- auto decides from the model loaded
def _tiny_model_dir(path, **shape) -> str:
    """A real random Qwen2 of another shape than the embedded model, with the embedded tokenizer."""
    import shutil

    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from skyrl_tool_agent.config import SHIPPED_EMBEDDED_DIR

    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=2054, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, eos_token_id=2, pad_token_id=0,
                      tie_word_embeddings=True, **shape)
    Qwen2ForCausalLM(cfg).save_pretrained(path)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json"):
        shutil.copy(SHIPPED_EMBEDDED_DIR / name, path)
    return str(path)


def test_auto_profile_decides_from_the_model_loaded_adapters_and_checkpoints_by_their_base(tmp_path):
    import json
    import shutil

    from skyrl_tool_agent.config import SHIPPED_EMBEDDED_DIR
    from skyrl_tool_agent.config.cli import auto_profile

    other = _tiny_model_dir(tmp_path / "other")
    full_copy = tmp_path / "embedded_full"  # e.g. a full-mode final/ of the embedded model
    full_copy.mkdir()
    shutil.copy(SHIPPED_EMBEDDED_DIR / "config.json", full_copy)
    adapters = {}
    for name, base in (("adapter_of_embedded", str(SHIPPED_EMBEDDED_DIR)), ("adapter_of_other", other),
                       ("adapter_of_hub", "Qwen/Qwen2.5-1.5B-Instruct")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": base}))
        adapters[name] = str(tmp_path / name)
    checkpoint = tmp_path / "checkpoints" / "step-000002"
    shutil.copytree(adapters["adapter_of_other"], checkpoint / "weights")

    def take(model: str, cuda: bool, device: str = "auto") -> str:
        return auto_profile(model, device=device, cuda=cuda)[0]

    for model in ("embedded", str(full_copy), adapters["adapter_of_embedded"]):
        assert take(model, cuda=True) == "cpu", model
    for model in (other, adapters["adapter_of_other"], adapters["adapter_of_hub"], str(checkpoint),
                  "Qwen/Qwen2.5-1.5B-Instruct"):
        assert take(model, cuda=True) == "gpu", model
        assert take(model, cuda=False) == "cpu", model
        assert take(model, cuda=True, device="cpu") == "cpu", model
    assert auto_profile(other, cuda=True)[1] == f"CUDA device and model {other}"
    assert auto_profile(other, cuda=False)[1] == f"model {other} but no CUDA device"


def test_eval_auto_profile_looks_at_model_path_and_says_why(tmp_path):
    """`eval --model-path X` is decided from X, not from model.name_or_path (the embedded model):
    on this CPU it logs that X got the CPU defaults for want of CUDA (it said nothing before, and on
    a GPU it silently took the CPU profile)."""
    import os

    other = _tiny_model_dir(tmp_path / "other")
    env = {**os.environ, "WANDB_MODE": "offline", "WEAVE_DISABLED": "true", "HF_HUB_OFFLINE": "1"}
    # --compare with a missing file ends the command right after the config is resolved (exit 2, one
    # error line): the profile decision is made and logged by then, without an evaluation's cost.
    res = subprocess.run([sys.executable, "-m", "skyrl_tool_agent.commands.main", "eval", "--policy", "model",
                          "--model-path", other, "--compare", str(tmp_path / "missing.json")],
                         capture_output=True, text=True, timeout=240, env=env)
    log = res.stdout + res.stderr
    assert res.returncode == 2 and "missing.json" in res.stderr, log[-3000:]
    import torch

    expected = "profile gpu: CUDA device and model" if torch.cuda.is_available() else "profile cpu: model"
    said = [line for line in log.splitlines() if "profile " in line and other in line]
    assert len(said) == 1 and expected in said[0], log[-3000:]
    if not torch.cuda.is_available():
        assert "but no CUDA device" in said[0] and "--profile gpu" in said[0]


def test_the_gpu_profile_applies_on_top_of_a_config_dir_and_keeps_what_the_user_edited(tmp_path, caplog):
    """`--config-dir configs` with the gpu profile (auto on a GPU): the files' values left at their
    CPU default take the gpu values, an edited one is kept, and the log says which (before: the
    directory's CPU values silently, lr 1e-3, 128 tokens x 3 turns, an 8-minute budget on a 1.5B)."""
    import logging
    import shutil

    shutil.copytree("configs", tmp_path / "configs")
    text = (tmp_path / "configs" / "grpo_config.yaml").read_text()
    assert "\ngroup_size: 8 " in text
    (tmp_path / "configs" / "grpo_config.yaml").write_text(text.replace("\ngroup_size: 8 ", "\ngroup_size: 6 "))
    # a file written before a knob existed: the knob's default is the profile's, not the CPU's
    training = (tmp_path / "configs" / "training_config.yaml").read_text()
    assert "\njob_budget_minutes: 14.5 " in training
    (tmp_path / "configs" / "training_config.yaml").write_text(
        "\n".join(line for line in training.splitlines() if not line.startswith("job_budget_minutes:")) + "\n")
    with caplog.at_level(logging.INFO, logger="skyrl_tool_agent.config"):
        config = load_config(tmp_path / "configs", profile="gpu")
    packaged = load_config(profile="gpu")
    assert config.training.learning_rate == 2e-5 and config.training.time_budget_minutes is None
    assert config.training.job_budget_minutes is None
    assert config.grpo.max_new_tokens_per_turn == packaged.grpo.max_new_tokens_per_turn == 512
    assert config.grpo.max_turns == packaged.grpo.max_turns and config.grpo.group_size == 6
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("profile gpu on ")]
    assert any("training.learning_rate 0.001 -> 2e-05" in line for line in said), said
    assert any("edited, kept: grpo.group_size 6" in line for line in said), said


QWEN_7B = {"hidden_size": 3584, "intermediate_size": 18944, "num_hidden_layers": 28, "num_attention_heads": 28,
           "num_key_value_heads": 4, "vocab_size": 152064, "tie_word_embeddings": False, "model_type": "qwen2"}
QWEN_1_5B = {"hidden_size": 1536, "intermediate_size": 8960, "num_hidden_layers": 28, "num_attention_heads": 12,
             "num_key_value_heads": 2, "vocab_size": 151936, "tie_word_embeddings": True, "model_type": "qwen2"}


def _shape_dir(path, shape: dict) -> str:
    import json

    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps(shape))
    return str(path)


def test_the_gpu_profile_is_sized_to_the_models_size_and_the_device_by_the_plan(tmp_path):
    """The 1.5B on 80 GB keeps its learning rate and gets the update the plan chooses beside every
    episode; a 7B takes the large model's learning rate, also on a first run whose config.json is
    read from its directory; a 7B LoRA run on a 24 GB card stops with one line naming what would
    fit (before: the 1.5B's values, and on 24 GB an engine with no episode). A knob the user set
    is not sized."""
    from skyrl_tool_agent.memory.device import GIB
    from skyrl_tool_agent.memory.plan import PlanError
    from skyrl_tool_agent.memory.shape import shape_of
    from skyrl_tool_agent.memory.sizing import size_gpu_profile

    gpu = load_config(profile="gpu")
    knobs = {"training.learning_rate", "training.micro_batch_tokens"}
    small, big = shape_of(_shape_dir(tmp_path / "s", QWEN_1_5B)), shape_of(_shape_dir(tmp_path / "b", QWEN_7B))
    assert small is not None and big is not None
    assert abs(small.params - 1.54e9) < 0.02e9 and abs(big.params - 7.6e9) < 0.05e9  # the published counts
    changes, why, plan = size_gpu_profile(gpu, small, device_bytes=80 * GIB, world=1, at_profile=knobs)
    assert changes == {"training.micro_batch_tokens": 12288} and plan.slots == 256, (changes, why)
    changes, why, plan = size_gpu_profile(gpu, big, device_bytes=80 * GIB, world=1, at_profile=knobs)
    assert changes["training.learning_rate"] == 1e-5 and "7.6 B parameters" in why[0]
    assert changes["training.micro_batch_tokens"] % gpu.grpo.max_total_tokens == 0 and plan.slots >= 96
    changes, _, _ = size_gpu_profile(gpu, big, device_bytes=80 * GIB, world=1, at_profile=set())
    assert changes == {}  # the user's values stay
    with pytest.raises(PlanError, match=r"would fit: .*load_in_4bit=true"):
        size_gpu_profile(gpu, big, device_bytes=24 * GIB, world=1, at_profile=knobs)
    # no config.json at hand (a hub name, offline and not cached): nothing scaled, and said
    assert shape_of("nobody/not-cached-anywhere") is None
    assert size_gpu_profile(gpu, None, device_bytes=80 * GIB, world=1, at_profile=knobs)[0] == {}


def test_train_on_a_gpu_sizes_the_profile_before_loading_and_a_users_set_wins(tmp_path, monkeypatch, caplog):
    """`train`'s `--profile auto --config-dir configs` on an 80 GB CUDA device loading a 7B: the gpu
    values on top of the directory, sized (lr 1e-5, the plan's update), one line saying what and why;
    a --set of the user's still wins. The device is the one thing simulated (no GPU on CI)."""
    import argparse
    import logging
    import types

    import torch

    from skyrl_tool_agent.commands.train import sized_to_device
    from skyrl_tool_agent.config import cli

    monkeypatch.setattr(cli, "_cuda_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: types.SimpleNamespace(total_memory=80 * 2**30))
    model = _shape_dir(tmp_path / "coder7b", QWEN_7B)
    parser = cli.add_config_args(argparse.ArgumentParser(allow_abbrev=False))

    def train_config(*flags: str):
        args = parser.parse_args(["--config-dir", "configs", "--set", f"model.name_or_path={model}", *flags])
        config = cli.config_from_args(args)
        assert args.resolved_profile == "gpu"
        return sized_to_device(args, config)

    with caplog.at_level(logging.INFO):
        config = train_config()
    assert config.training.learning_rate == 1e-5 and config.grpo.max_new_tokens_per_turn == 512
    assert config.training.time_budget_minutes is None and config.training.micro_batch_tokens < 49152
    [line] = [r.getMessage() for r in caplog.records if r.getMessage().startswith("profile gpu sized")]
    assert "training.learning_rate 2e-05 -> 1e-05" in line and "training.micro_batch_tokens 49152 ->" in line, line
    assert train_config("--set", "training.learning_rate=3e-5").training.learning_rate == 3e-5
