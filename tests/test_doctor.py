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
from skyrl_tool_agent.jobs.doctor_checks import CHECKS

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
    assert "doctor: limit 200 s" in done.stdout and "doctor: rc=0" in done.stdout, done.stdout + done.stderr + (tmp_path / "doctor.log").read_text()
    assert not (tmp_path / "never_built").exists()  # only the doctor stage ran: no model was built
    out = (tmp_path / "doctor.log").read_text()
    checks = [line for line in out.splitlines() if line.split(" ", 1)[0] in ("PASS", "WARN", "FAIL", "SKIP")]
    summary = out.strip().splitlines()[-1]
    names = [name for name, _, _ in CHECKS] + ["memory plan"]  # the plan a train with these flags would make, last
    assert [line.split(":")[0].split(None, 1)[1] for line in checks] == names
    by_name = dict(zip(names, checks))
    assert by_name["memory plan"].startswith("PASS") and "lora embedded on" in by_name["memory plan"]
    assert "64 of 64 episodes in flight" in by_name["memory plan"], by_name["memory plan"]
    assert by_name["device"].startswith("SKIP") and "no CUDA device" in by_name["device"]
    for gpu_only in ("bf16 matmul", "engine graph capture", "4-bit matmul", "NCCL one rank", "DeepSpeed ZeRO-3 one rank"):
        assert by_name[gpu_only].startswith("SKIP") and "GPU-only" in by_name[gpu_only]
    assert by_name["MCP servers"].startswith("PASS") and "execute_sql" in by_name["MCP servers"]
    assert by_name["dataset"].startswith("PASS") and "320 dev tasks" in by_name["dataset"]
    assert by_name["Spider"].split()[0] in ("PASS", "SKIP") and "Spider" in by_name["Spider"]
    assert by_name["disk"].split()[0] in ("PASS", "WARN") and "GiB free" in by_name["disk"]
    step = by_name["training step"]
    assert step.startswith("PASS"), step
    assert "4 episodes sampled" in step and "gradients finite" in step and "56/56 adapter tensors updated" in step
    assert by_name["torch"].startswith("PASS") and torch.__version__ in by_name["torch"]
    assert summary == f"doctor: {len(names)} of {len(names)} checks without failure"


def test_doctor_asked_for_cuda_without_one_is_one_error_line(capsys):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(SystemExit) as exit_info:
        main(["doctor", "--device", "cuda"])
    err = capsys.readouterr().err.strip()
    assert exit_info.value.code == 2 and err.startswith("error: --device cuda: no CUDA device") and "\n" not in err


def test_a_failed_graph_capture_fails_the_training_step(monkeypatch):
    """The engine the sampled step used fell back to eager (its stats say `capture_failed`): the
    training step is a FAIL that says so (before: PASS, both runs eager). On a GPU the capture
    check reads the same stat of its own engine."""
    from skyrl_tool_agent.jobs import doctor_checks as doctor

    class EagerAfterAll:
        stats = {"capture_failed": 1}

    assert doctor.capture_failed(EagerAfterAll()) and not doctor.capture_failed(None)
    monkeypatch.setattr(doctor, "sampling_engine", lambda policy: EagerAfterAll())
    status, detail = doctor.check_training_step(torch.device("cpu"))
    assert status == "FAIL" and "CUDA-graph capture FAILED" in detail, detail


def test_one_rank_checks_run_in_a_child_and_a_hang_is_a_fail_line():
    """NCCL's (here gloo's) one-rank init in a child process: PASS with what it did; a child that
    does not answer in time is a FAIL line, never a doctor that hangs."""
    from skyrl_tool_agent.jobs.doctor_checks import one_rank

    status, detail = one_rank("nccl", torch.device("cpu"))
    assert status == "PASS" and "process group of 1 rank, all_reduce exact" in detail, detail
    status, detail = one_rank("nccl", torch.device("cpu"), timeout_s=0.01)
    assert status == "FAIL" and "no answer in 0.01 s" in detail


def test_gpu_check_sets_each_fit_one_lent_command_and_print_their_limits():
    """scripts/gpu_check.sh's default set, and each other named set, sum their stages' limits within
    9 minutes (a lent machine runs 10 at most per command; the default's stages needed ~1,005 s
    before, and lora_step timed out at its limit in both recorded runs)."""
    import re

    plan = subprocess.run(["bash", str(REPO / "scripts" / "gpu_check.sh"), "--plan"], capture_output=True, text=True,
                          timeout=60)
    assert plan.returncode == 0, plan.stderr
    sets = {m.group(1): (m.group(2), int(m.group(3)))
            for m in re.finditer(r"^SET=(\w+): (.*)= (\d+) s of limits$", plan.stdout, re.M)}
    assert set(sets) == {"default", "train", "update", "memory", "learning"}, plan.stdout
    stages = set()
    for name, (listed, total) in sets.items():
        limits = [int(x) for x in re.findall(r"\((\d+) s\)", listed)]
        assert sum(limits) == total <= 540, (name, listed)
        stages |= set(re.findall(r"(\w+) \(\d+ s\)", listed))
    assert {"doctor", "bench", "lora_step", "full_step", "update_profile", "memory_plan", "speedrun"} <= stages
    bad = subprocess.run(["bash", str(REPO / "scripts" / "gpu_check.sh")], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "SET": "nope"})
    assert bad.returncode == 2 and bad.stderr.startswith("error: SET=nope is not a set")
