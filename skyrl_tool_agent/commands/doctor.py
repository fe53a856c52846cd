"""Check that this machine can train: device, memory, bf16, the rollout engine's CUDA-graph
capture and one tiny GRPO training step, one line each (PASS / WARN / FAIL / SKIP).

    skyrl-tool-agent doctor                 # CUDA if there is one, else the CPU (GPU-only checks skipped)
    skyrl-tool-agent doctor --device cpu
    skyrl-tool-agent doctor --mode lora --set model.name_or_path=Qwen/Qwen2.5-7B-Instruct --gpu-memory 24

The last line is the memory plan a `train` with the same flags would make (episodes in flight and
what bounds them, the update's tokens, the snapshot, the cache): for this machine's GPU, or for a
card of `--gpu-memory` GiB (x `--gpus`) you do not have yet. It fails where not even one episode fits,
naming the knobs that would.

Needs nothing outside the package (the embedded model ships in it). Exit status 1 when a check
fails, else 0.
"""

from __future__ import annotations

import argparse

from skyrl_tool_agent.commands._args import new_parser
from skyrl_tool_agent.config import Config, UserInputError, add_config_args, cli_main_guard, config_from_args
from skyrl_tool_agent.jobs.progress import setup_logging


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    p = new_parser(__doc__, prog)
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto",
                   help="where the checks run (auto: cuda when available)")
    p.add_argument("--mode", choices=["lora", "full"], help="training.mode of the run to plan (as train's --mode)")
    p.add_argument("--gpu-memory", type=float, metavar="GIB",
                   help="plan for a GPU of this many GiB instead of this machine's device (the gpu profile, as "
                        "--profile auto would take on it)")
    p.add_argument("--gpus", type=int, default=None, metavar="N",
                   help="GPUs of the run to plan (full mode shards over them; default: WORLD_SIZE, else 1)")
    add_config_args(p)
    args = p.parse_args(argv)
    setup_logging()
    with cli_main_guard():
        import torch

        from skyrl_tool_agent.jobs.doctor import doctor
        from skyrl_tool_agent.jobs.doctor_checks import FAIL
        from skyrl_tool_agent.policy.device import resolve_device

        if args.device == "cuda" and not torch.cuda.is_available():
            raise UserInputError("--device cuda: no CUDA device is visible to torch "
                                 f"(torch {torch.__version__}, CUDA build {torch.version.cuda or 'none'})")
        wanted = args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
        results = doctor(resolve_device(wanted), plan_config(args), gpu_memory_gib=args.gpu_memory, gpus=args.gpus,
                         emit=lambda line: print(line, flush=True))
    return 1 if any(c.status == FAIL for c in results) else 0


def plan_config(args: argparse.Namespace) -> Config:
    """The config of the run train's flags describe (module docstring): `--mode`, and `--gpu-memory`
    planning for the gpu profile, as --profile auto would take on such a card."""
    if args.mode:
        args.overrides = [f"training.mode={args.mode}", *args.overrides]
    if args.gpu_memory is not None and args.profile == "auto":
        args.profile = "gpu"
    return config_from_args(args)
