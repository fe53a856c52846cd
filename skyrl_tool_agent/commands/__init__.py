"""The project's commands, installed as one console script, `skyrl-tool-agent COMMAND [flags]`
(`main.py`, whose `COMMANDS` maps each to its module); `training/scripts/*.py` are thin aliases of
the same `main` functions (each command's docstring names its own).

Every parser is built with `allow_abbrev=False` (`--config-d` is an error, not `--config-dir`), and
where a command writes a directory the flag is `--output-dir` (HF's `--output_dir` also works).
"""

import atexit
import gc
import os
import sys

# `python -m skyrl_tool_agent.commands.<module>` would define that command's functions and exit 0
# without running anything; only `.main` dispatches (sys.argv[0] is "-m" while -m imports this package).
_run_as_main = sys.orig_argv[sys.orig_argv.index("-m") + 1] if sys.argv[:1] == ["-m"] else ""
if _run_as_main.startswith(f"{__name__}.") and _run_as_main != f"{__name__}.main":
    print(f"error: python -m {_run_as_main} runs nothing by itself: run `skyrl-tool-agent COMMAND ...` "
          f"or `python -m {__name__}.main COMMAND ...`", file=sys.stderr)
    raise SystemExit(2)

# The commands never compile (nothing here calls torch.compile), but bitsandbytes, which peft
# imports in every run that loads a policy, wraps its device-generic fallback kernels in
# torch.compile at import, and that loads torch's compiler stack: ~0.9 CPU-s in every such process,
# each rank of a launch. With TorchDynamo off those wrappers are plain functions; the kernels that
# run are the same (bitsandbytes' own CPU and CUDA kernels replace the fallbacks). Set
# TORCHDYNAMO_DISABLE=0 to keep it on.
os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")


def _collect_then_freeze() -> None:
    """At a command's exit: collect the garbage there is (its finalizers run), then freeze the rest,
    so that the interpreter's teardown does not walk torch's and transformers' objects again with
    the cyclic collector: 1.1 CPU-s at every exit after those imports, 0.4 s this way (2-core AMD
    EPYC, issue 59; each rank of a launch, each test that runs a command, pays it)."""
    gc.collect()
    gc.freeze()


atexit.register(_collect_then_freeze)
