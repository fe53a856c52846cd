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
    with pytest.raises(ConfigError, match="picks among the packaged defaults"):
        load_config("configs", profile="gpu")


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
    assert shown["training"]["learning_rate"] == pytest.approx(1e-3) and "profile: gpu" not in err
    # ... and says, in one line, which profile it took and why (it silently got the CPU lr before)
    said = [line for line in err.splitlines() if "profile: cpu" in line]
    assert len(said) == 1 and "model /tmp but no CUDA" in said[0] and "--profile gpu" in said[0], err
    rc, _, err = _show("--profile", "gpu", "--config-dir", "configs")
    assert rc == 2 and err.startswith("error: --profile gpu picks among the packaged defaults"), err


def test_gpu_profile_micro_batch_fits_an_h100_by_the_memory_estimate():
    """The gpu profile's micro-batch at its longest episodes (rows padded to max_total_tokens) fits
    80 GB with 15% to spare for the CUDA context and fragmentation, for the profile's model in LoRA
    and in full ZeRO-3 on 8 GPUs (the estimate of distributed/memory.py; the profile's old 16
    episodes needed 75-76 GiB)."""
    from skyrl_tool_agent.distributed.memory import GB, estimate, shapes

    gpu = load_config(profile="gpu")
    assert gpu.model.name_or_path == "Qwen/Qwen2.5-1.5B-Instruct" and gpu.model.gradient_checkpointing
    tokens = gpu.training.micro_batch_size * gpu.grpo.max_total_tokens
    s = shapes("Qwen2.5-1.5B", lora_r=gpu.model.lora.r)
    for mode, gpus in (("lora", 1), ("full", 8)):
        total = estimate(s, mode=mode, tokens=tokens, gpus=gpus, kl=gpu.grpo.kl_coef > 0, checkpointing=True)["total"]
        assert total < 0.85 * 80e9, (mode, total / GB)
