"""Check that this machine can train: device, memory, bf16, the rollout engine's CUDA-graph
capture and one tiny GRPO training step, one line each (PASS / WARN / FAIL / SKIP).

    skyrl-tool-agent doctor                 # CUDA if there is one, else the CPU (GPU-only checks skipped)
    skyrl-tool-agent doctor --device cpu

Needs nothing outside the package (the embedded model ships in it). Exit status 1 when a check
fails, else 0.
"""

from __future__ import annotations

import sys

from skyrl_tool_agent.commands._args import new_parser


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    p = new_parser(__doc__, prog)
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto",
                   help="where the checks run (auto: cuda when available)")
    args = p.parse_args(argv)
    from skyrl_tool_agent.cli import setup_logging

    setup_logging()
    from skyrl_tool_agent.config import cli_main_guard

    with cli_main_guard():
        import torch

        from skyrl_tool_agent.config import UserInputError
        from skyrl_tool_agent.doctor import FAIL, run_checks
        from skyrl_tool_agent.policy.loading import resolve_device

        if args.device == "cuda" and not torch.cuda.is_available():
            raise UserInputError("--device cuda: no CUDA device is visible to torch "
                                 f"(torch {torch.__version__}, CUDA build {torch.version.cuda or 'none'})")
        wanted = args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
        device = resolve_device(wanted)
        results = run_checks(device, emit=lambda check: print(check.line(), flush=True))
    failed = [c.name for c in results if c.status == FAIL]
    print(f"doctor: {len(results) - len(failed)} of {len(results)} checks without failure"
          + (f"; failed: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
