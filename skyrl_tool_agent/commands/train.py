"""Train a tool-using SQL agent with GRPO over MCP tools.

    skyrl-tool-agent train --mode lora            # the embedded default, on this CPU
    skyrl-tool-agent train --mode lora --set model.name_or_path=Qwen/Qwen2.5-1.5B-Instruct
    skyrl-tool-agent train --config run.yaml      # every section from one YAML file (e.g. a run's config.yaml)
    torchrun --nproc_per_node 8 training/scripts/train_grpo.py --mode lora   # data parallel: docs/distributed.md
    deepspeed --num_gpus 8 training/scripts/train_grpo.py --mode full        # ZeRO-3: docs/distributed.md

(`python training/scripts/train_grpo.py` is the same command.) All knobs have defaults shipped in the
package (the repository's configs/*.yaml are a documented copy; `skyrl-tool-agent knobs` lists them);
`--set section.key=value` overrides any of them through the same validation. Bad input exits with
status 2 and one `error:` line.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import os
import shlex
import sys

from skyrl_tool_agent.commands._args import (
    add_mcp_server,
    add_output_dir,
    add_task_file,
    new_parser,
    task_file_args,
)
from skyrl_tool_agent.config import Config, UserInputError, add_config_args, cli_main_guard, config_from_args


#: Errors of the output file system that a user fixes (not bugs): one `error:` line, exit 2.
OUTPUT_FAULTS = frozenset({errno.ENOSPC, errno.EROFS, errno.EACCES, errno.EPERM, errno.EDQUOT, errno.EFBIG,
                           errno.ENOTDIR, errno.EISDIR, errno.EEXIST, errno.ENAMETOOLONG})


def parse_args(argv: list[str] | None = None, prog: str | None = None) -> argparse.Namespace:
    p = new_parser(__doc__, prog)
    p.add_argument("--mode", choices=["lora", "full"], help="training.mode (LoRA adapters or all parameters)")
    add_config_args(p)
    add_task_file(p)
    add_mcp_server(p)
    add_output_dir(p, "run directory: training.output_dir")
    p.add_argument("--max-steps", type=int, help="training.max_steps")
    p.add_argument("--resume", help="'auto' (latest checkpoint in the output dir, if any) or a checkpoint dir")
    p.add_argument("--rebuild", action="store_true",
                   help="build the embedded model anew (into model.embedded_dir, else the cache) and train from it "
                        "instead of the shipped one (e.g. after changing its shape)")
    p.add_argument("--skip-bad-records", action="store_true",
                   help="leave out task records that fail the checks at load (a missing field, an unknown db_id, "
                        "gold SQL that fails, ...; each is reported) instead of refusing to start")
    p.add_argument("--push-to-hub", metavar="REPO", help="upload the final adapter/model to this Hub repo")
    p.add_argument("--local_rank", "--local-rank", type=int, default=None, help=argparse.SUPPRESS)  # set by deepspeed
    return p.parse_args(argv)


def resume_command(argv: list[str] | None, prog: str | None) -> str:
    """This command line again with `--resume auto`, shell-quoted and ready to paste, run by this
    very interpreter (`sys.executable`: it works without an activated venv). `prog` is how the
    dispatcher named us ("skyrl-tool-agent train": `python -m skyrl_tool_agent.commands.main train`);
    None means a script run by python."""
    args = list(sys.argv[1:] if argv is None else argv)
    if "--resume" in args:
        i = args.index("--resume")
        del args[i:i + 2]
    args = [a for a in args if not a.startswith("--resume=")]
    command = shlex.split(prog)[1:] if prog else []
    head = ([sys.executable, "-m", "skyrl_tool_agent.commands.main", *command] if prog
            else [sys.executable, sys.argv[0]])
    return shlex.join([*head, *args, "--resume", "auto"])


def sized_to_device(args: argparse.Namespace, config: Config) -> Config:
    """`--profile auto` on a GPU, before anything is loaded: the knobs still at their H100 value
    (a value set by `--set` or in a file is the user's) sized to the model and the device by the
    memory plan (`memory.sizing.size_gpu_profile`); nothing fits: one `error:` line naming what would."""
    import logging

    import torch

    from skyrl_tool_agent.memory.shape import shape_of
    from skyrl_tool_agent.memory.sizing import knobs_at_profile, size_gpu_profile

    changes, why, _ = size_gpu_profile(config, shape_of(config.model.name_or_path),
                                       device_bytes=int(torch.cuda.get_device_properties(0).total_memory),
                                       world=int(os.environ.get("WORLD_SIZE", "1")), at_profile=knobs_at_profile(config))
    logging.getLogger(__name__).info("profile gpu sized to the model and the device: %s", "; ".join(why))
    if not changes:
        return config
    args.overrides = [*(f"{k}={v}" for k, v in changes.items()), *args.overrides]  # the user's --set wins
    args.profile = "gpu"
    return config_from_args(args)


def raise_unless_rank_lost(backend: object, error: BaseException) -> None:
    """Under a launcher, when `error` came from a rank that stopped answering: one `error:` line
    naming it and exit status 1 (the last checkpoint is intact); else `error` goes on."""
    line = backend.ctx.lost_rank(error) if backend is not None else None  # type: ignore[attr-defined]
    if line is None:
        raise error
    sys.stderr.write(f"error: {line}\n")  # one write: the ranks share the launcher's stderr
    sys.stderr.flush()
    sys.exit(1)


def main(argv: list[str] | None = None, prog: str | None = None) -> None:
    args = parse_args(argv, prog)
    from skyrl_tool_agent.jobs.progress import setup_logging, training_progress

    setup_logging()
    with cli_main_guard(also=(FileNotFoundError,)):
        shortcuts = {"training.mode": args.mode, "training.output_dir": args.output_dir,
                     "training.max_steps": args.max_steps, "training.push_to_hub.repo_id": args.push_to_hub}
        extra = [f"{key}={value}" for key, value in shortcuts.items() if value not in (None, "")]
        if args.rebuild:
            from skyrl_tool_agent.config import default_build_dir

            extra.append(f"model.embedded_dir={default_build_dir()}")  # an explicit --set still wins
        args.overrides = [*extra, *args.overrides]  # explicit --set wins over the shortcuts
        task_file_args(args)
        config = config_from_args(args)
        if getattr(args, "resolved_profile", None) == "gpu":
            config = sized_to_device(args, config)
        repo = config.training.push_to_hub.repo_id
        if repo:
            from huggingface_hub import get_token  # HF_TOKEN, else the token `hf auth login` cached

            if not get_token():
                raise UserInputError(f"--push-to-hub {repo}: no Hugging Face token (set HF_TOKEN or run "
                                     "`hf auth login`); nothing was trained")
        from skyrl_tool_agent.reports.tables import print_before_after, push_to_hub

        from skyrl_tool_agent.grpo.interrupts import TrainingInterrupted
        from skyrl_tool_agent.jobs.budget import process_start
        from skyrl_tool_agent.jobs.train import run_training

        backend = None
        if "WORLD_SIZE" in os.environ:  # torchrun / accelerate / deepspeed: every rank runs this
            if config.training.mode == "full":
                from skyrl_tool_agent.distributed import deepspeed_backend

                backend = deepspeed_backend(config)  # ZeRO-3, also on 1 GPU
            else:
                from skyrl_tool_agent.distributed.agreement import joined_launch

                ctx = joined_launch(config)  # before the policy's imports: a refused launch stops in seconds
                from skyrl_tool_agent.distributed.replicated import ReplicatedBackend

                backend = ReplicatedBackend(ctx)  # LoRA/QLoRA: a replica per rank, gradients summed
        main_rank = backend is None or backend.ctx.is_main
        t = config.training
        from skyrl_tool_agent.env.families import resolve_family
        from skyrl_tool_agent.eval.vocabulary import vocabulary

        words = vocabulary(resolve_family(config.env.task_family).name)  # SQL words only for SQL
        bar = (training_progress(t.max_steps, t.time_budget_s, eval_split=t.eval_split, accuracy_short=words.short)
               if main_rank else contextlib.nullcontext())
        try:
            with bar as progress:
                summary = run_training(config, resume=args.resume, rebuild=args.rebuild, progress=progress,
                                       backend=backend, skip_bad_records=args.skip_bad_records,
                                       job_started=process_start())  # the job's budget counts the imports too
        except TrainingInterrupted as stop:
            if main_rank:
                print(f"{stop}\nresume with: {resume_command(argv, prog)}", file=sys.stderr)
            sys.exit(stop.exit_code)
        except OSError as exc:
            if exc.errno not in OUTPUT_FAULTS:
                raise_unless_rank_lost(backend, exc)
            # The output directory failed under the run (disk full, read-only, no permission): the
            # checkpoints written before stay intact (each is written aside, then renamed in place).
            raise UserInputError(
                f"cannot write the run's files ({exc.filename or t.output_dir}: {exc.strerror or exc}); finished "
                f"checkpoints in {t.output_dir} are kept: free space or fix the directory, then resume with: "
                f"{resume_command(argv, prog)}") from exc
        except RuntimeError as exc:  # under a launcher: a collective that failed because a rank died
            raise_unless_rank_lost(backend, exc)
        if summary is None:  # ranks other than 0
            return
        print_before_after(summary)
        if repo:
            push_to_hub(summary.output_dir / "final", repo, private=config.training.push_to_hub.private)
