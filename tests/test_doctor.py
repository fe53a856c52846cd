"""`skyrl-tool-agent doctor` on this CPU: one line per check, GPU-only checks skipped with a line
saying so, one real GRPO training step of the embedded model that passes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from skyrl_tool_agent.commands.main import main
from skyrl_tool_agent.doctor import CHECKS

REPO = Path(__file__).resolve().parents[1]


def test_gpu_check_runs_doctor_from_the_clone_one_line_per_check_gpu_only_ones_skipped(tmp_path):
    """scripts/gpu_check.sh's first stage is `skyrl-tool-agent doctor`; from this checkout, with no
    .whl/ and nothing outside the repository, on this CPU: every check one line, a real training step."""
    env = {k: v for k, v in os.environ.items() if k not in ("STAGES", "OUT")}
    env.update(STAGES="doctor", OUT=str(tmp_path), PYTHON=sys.executable, HF_HUB_OFFLINE="1",
               WANDB_MODE="disabled", MODEL_DIR=str(tmp_path / "never_built"))
    if (REPO / ".whl").exists():
        pytest.skip(".whl/ is in this checkout: the script would install from it")
    done = subprocess.run(["bash", str(REPO / "scripts" / "gpu_check.sh")], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert "doctor: rc=0" in done.stdout, done.stdout + done.stderr + (tmp_path / "doctor.log").read_text()
    assert not (tmp_path / "never_built").exists()  # only the doctor stage ran: no model was built
    out = (tmp_path / "doctor.log").read_text()
    checks = [line for line in out.splitlines() if line.split(" ", 1)[0] in ("PASS", "WARN", "FAIL", "SKIP")]
    summary = out.strip().splitlines()[-1]
    assert [line.split(":")[0].split(None, 1)[1] for line in checks] == [name for name, _, _ in CHECKS]
    by_name = {name: line for (name, _, _), line in zip(CHECKS, checks)}
    assert by_name["device"].startswith("SKIP") and "no CUDA device" in by_name["device"]
    for gpu_only in ("bf16 matmul", "engine graph capture"):
        assert by_name[gpu_only].startswith("SKIP") and "GPU-only" in by_name[gpu_only]
    step = by_name["training step"]
    assert step.startswith("PASS"), step
    assert "4 episodes sampled" in step and "gradients finite" in step and "56/56 adapter tensors updated" in step
    assert by_name["torch"].startswith("PASS") and torch.__version__ in by_name["torch"]
    assert summary == "doctor: 6 of 6 checks without failure"


def test_doctor_asked_for_cuda_without_one_is_one_error_line(capsys):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(SystemExit) as exit_info:
        main(["doctor", "--device", "cuda"])
    err = capsys.readouterr().err.strip()
    assert exit_info.value.code == 2 and err.startswith("error: --device cuda: no CUDA device") and "\n" not in err
