"""Does GRPO raise held-out accuracy? N minutes of GRPO vs N minutes of continued supervised
training vs no training, from the same start, greedy on every dev task at fixed wall-clock points.

    python benchmarks/bench_learning.py [--minutes M] [--points 3] [--set KEY=VALUE ...]

- GRPO: the main job's trainer and settings (configs/ + --set), run in segments that each end at
  a wall-clock mark, then evaluated (evaluation time is off the clock, as in the main job).
- Continued SFT: the start's own warm-start recipe at its tail learning rate, on the tasks GRPO
  samples (`training.data.train_pool`), evaluated at the same marks.
- No training: the start's greedy accuracy (both arms' first point).

Every evaluation is greedy on all dev tasks; each change is reported with its paired-bootstrap 95%
interval (tasks resampled, before and after of a task kept together), and so is GRPO - SFT at the
last mark. M defaults to the main job's GRPO budget (`training.time_budget_minutes`). Writes
JSON and a PNG of dev execution accuracy against training minutes. `--arms-in-parallel` runs the two
arms at the same time, each a process on half the cores (equal time on equal hardware, half the
wall clock: how the 45-minute comparison fits a session). Dev is only reported here: no
setting is chosen on it. Not a unit test.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import RESULTS_DIR, console, load_note, machine_info, print_table, write_json  # noqa: E402

from skyrl_tool_agent.config import Config, add_config_args, cli_main_guard, config_from_args  # noqa: E402
from skyrl_tool_agent.eval.stats import paired_bootstrap  # noqa: E402


def grpo_curve(config: Config, marks: list[float], out: Path) -> dict[str, Any]:
    """GRPO from the config's model, evaluated greedy on all dev tasks at each training-time mark
    (`config` writes into `out`, evaluates only when `train` returns, saves no checkpoints)."""
    from skyrl_tool_agent.env.pools import EnvRuntime
    from skyrl_tool_agent.grpo.run_logging import RunLogger
    from skyrl_tool_agent.grpo.trainer import GRPOTrainer
    from skyrl_tool_agent.eval.splits import TaskSplits
    from skyrl_tool_agent.pipeline import build_loader
    from skyrl_tool_agent.policy.qwen import QwenPolicy

    splits = TaskSplits.load(config)
    pool = splits.rl_train()
    runtime = EnvRuntime(config.env, splits.db_root)
    try:
        policy = QwenPolicy.from_config(config.model, mode=config.training.mode)
        eval_tasks = splits.run_eval()
        trainer = GRPOTrainer(config, policy, runtime, build_loader(config, pool), eval_tasks, output_dir=out)
        run_logger = RunLogger(out, wandb_config=config.training.wandb)
        before = trainer.evaluate()
        curve, trained_s = [], 0.0

        def step_line(metrics: dict[str, Any]) -> None:  # a long run shows progress
            if metrics["step"] % 10 == 0:
                console.print(f"GRPO step {metrics['step']}, {metrics['time/elapsed_s'] / 60:.1f} min, "
                              f"reward {metrics['reward/mean'] or 0:.3f}")
        for mark in marks:
            t0 = time.monotonic()
            trainer.train(run_logger, deadline=t0 + 60 * mark - trained_s, on_step=step_line)
            trained_s += time.monotonic() - t0 - trainer.last_eval_seconds
            curve.append({"minutes": trained_s / 60, "step": trainer.step, **trainer.last_eval})
            console.print(f"GRPO {trained_s / 60:.1f} min, step {trainer.step}: {config.training.eval_split} EX "
                          f"{trainer.last_eval['execution_accuracy']:.3f}")
            if trainer.step >= config.training.max_steps:
                if mark != marks[-1]:  # the arm would otherwise look shorter than asked, silently
                    console.print(f"[yellow]warning: GRPO reached training.max_steps={config.training.max_steps} at "
                                  f"{trained_s / 60:.1f} of {marks[-1]:g} minutes; raise it for a longer run")
                break
        run_logger.finish()
    finally:
        runtime.close()
    return {"before": before, "curve": curve, "steps": trainer.step, "metrics": str(out / "metrics.jsonl")}


def grpo_from_run(run_dir: Path) -> dict[str, Any]:
    """The GRPO arm as a finished main job recorded it (one point: its end)."""
    path = run_dir / "before_after.json"
    if not path.is_file():
        raise SystemExit(f"error: {path} not found (run train_grpo.py with --output-dir {run_dir} first)")
    record = json.loads(path.read_text())
    if not record["before"].get("solved"):
        raise SystemExit(f"error: {path} has no per-task outcomes (written by an older version)")
    point = {"minutes": record["training_minutes"], "step": record["steps"], **record["after"]}
    return {"before": record["before"], "curve": [point], "steps": record["steps"], "metrics": str(run_dir / "metrics.jsonl"),
            "from_run": str(run_dir), "stop_reason": record["stop_reason"]}


def arms_in_parallel(argv: list[str], tmp: Path) -> dict[str, Any]:
    """Both arms at once, each a child process of this script (`--only`) pinned to half the cores:
    equal time on equal hardware, in half the wall clock. Returns {arm: results}."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 2)
    threads = str(max(1, cores // 2))
    env = {**os.environ, "OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads, "TOKENIZERS_PARALLELISM": "false"}
    children = {arm: subprocess.Popen([sys.executable, __file__, *argv, "--only", arm,
                                       "--json-out", str(tmp / f"{arm}.json"), "--png-out", "-"], env=env)
                for arm in ("grpo", "sft")}
    failed = [arm for arm, child in children.items() if child.wait() != 0]
    if failed:
        raise SystemExit(f"error: the {' and '.join(failed)} arm failed (its output is above)")
    return {arm: json.loads((tmp / f"{arm}.json").read_text())["results"][arm] for arm in children}


def plot(results: dict[str, Any], out_png: Path, title: str) -> Path:
    from skyrl_tool_agent.eval.plots import plt, save_figure  # pyplot on the headless backend

    fig, ax = plt.subplots(figsize=(7, 4.5))
    start = results["start"]["execution_accuracy"]
    for name, color in (("grpo", "#c44e52"), ("sft", "#4c72b0")):
        arm = results[name]
        xs = [0.0] + [p["minutes"] for p in arm["curve"]]
        ys = [start] + [p["execution_accuracy"] for p in arm["curve"]]
        lo = [start] + [start + p["delta"]["low"] for p in arm["curve"]]
        hi = [start] + [start + p["delta"]["high"] for p in arm["curve"]]
        label = "GRPO" if name == "grpo" else "continued SFT"
        ax.plot(xs, ys, marker="o", color=color, label=f"{label} ({arm['steps']} steps)")
        ax.fill_between(xs, lo, hi, color=color, alpha=0.15, linewidth=0)
    ax.axhline(start, color="grey", linestyle="--", linewidth=1, label="no training")
    ax.set_ylim(0, 1)
    ax.set_xlabel("training minutes (evaluation excluded)")
    ax.set_ylabel("dev execution accuracy (greedy, all tasks)")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left", fontsize=9)
    fig.text(0.01, 0.01, "bands: 95% paired-bootstrap interval of the change from the start", fontsize=7, color="grey")
    return save_figure(fig, out_png, dpi=120)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                allow_abbrev=False)
    add_config_args(p)
    p.add_argument("--minutes", type=float, help="training minutes per method (default: training.time_budget_minutes); "
                   "GRPO also stops at training.max_steps (200 by default, ~14 min on 2 cores): raise it for longer runs")
    p.add_argument("--points", type=int, default=3, help="evaluations per method, evenly spaced in time")
    p.add_argument("--only", choices=["grpo", "sft"], help="run one method (the other's figures are left out)")
    p.add_argument("--grpo-run", metavar="OUTPUT_DIR",
                   help="take the GRPO arm from a finished main job (train_grpo.py's before_after.json: its before/after "
                        "on all dev tasks and its training minutes) instead of running it; --minutes defaults to its time")
    p.add_argument("--arms-in-parallel", action="store_true",
                   help="run GRPO and SFT at the same time, each on half the cores (equal hardware, half the wall clock)")
    p.add_argument("--json-out", default=str(RESULTS_DIR / "bench_learning.json"))
    p.add_argument("--png-out", default=str(RESULTS_DIR / "bench_learning.png"))
    argv = list(sys.argv[1:] if argv is None else argv)
    args = p.parse_args(argv)
    if args.arms_in_parallel and (args.only or args.grpo_run):
        p.error("--arms-in-parallel runs both arms: leave out --only and --grpo-run")
    with cli_main_guard(also=(FileNotFoundError,)):
        from skyrl_tool_agent.eval.splits import TaskSplits
        from skyrl_tool_agent.pipeline import continue_warm_start

        config = config_from_args(args)
        results: dict[str, Any] = {}
        if args.grpo_run:
            results["grpo"] = grpo_from_run(Path(args.grpo_run))
            args.minutes = args.minutes or results["grpo"]["curve"][-1]["minutes"]
        minutes = args.minutes or config.training.time_budget_minutes
        if not minutes:
            raise SystemExit("error: give --minutes (training.time_budget_minutes is null)")
        marks = [minutes * (i + 1) / args.points for i in range(args.points)]
        splits = TaskSplits.load(config)
        eval_tasks, dev = splits.run_eval(), splits.dev  # what the main job evaluates: all dev by default
        if args.arms_in_parallel:
            # the children's own --json-out comes last, so it wins over the user's
            results = arms_in_parallel([a for a in argv if a != "--arms-in-parallel"],
                                       Path(tempfile.mkdtemp(prefix="bench_learning_arms_")))
        if args.only != "sft" and not args.grpo_run and not args.arms_in_parallel:
            out = Path(tempfile.mkdtemp(prefix="bench_learning_grpo_"))
            args.overrides += [f"training.output_dir={out}", "training.eval_every=0", "training.wandb.mode=disabled"]
            results["grpo"] = grpo_curve(config_from_args(args), marks, out)
        if "grpo" in results:
            results["start"] = results["grpo"]["before"]
        if args.arms_in_parallel and results["grpo"]["before"]["solved"] != results["sft"]["before"]["solved"]:
            console.print("[yellow]warning: the two arms' greedy starts differ (nondeterministic decoding?)")
        if args.only != "grpo" and not args.arms_in_parallel:
            def sft_line(step: int, loss: float) -> None:
                if step % 100 == 0:
                    console.print(f"SFT step {step}, loss {loss:.4f}")

            sft = continue_warm_start(config, minutes, eval_at_minutes=tuple(marks[:-1]), eval_tasks=eval_tasks,
                                      progress=sft_line)
            results["sft"] = sft
            results.setdefault("start", sft["before"])
            if "grpo" in results and results["grpo"]["before"]["solved"] != sft["before"]["solved"]:
                console.print("[yellow]warning: the two arms' greedy starts differ (nondeterministic decoding?)")
    start = results["start"]
    rows = [["no training", 0.0, 0, start["execution_accuracy"], ""]]
    for name in ("grpo", "sft"):
        if name not in results:
            continue
        for point in results[name]["curve"]:
            point["delta"] = paired_bootstrap(start["solved"], point["solved"]).to_dict()
            d = point["delta"]
            rows.append(["GRPO" if name == "grpo" else "continued SFT", point["minutes"], point["step"],
                         point["execution_accuracy"], f"{100 * d['delta']:+.1f} [{100 * d['low']:+.1f}, {100 * d['high']:+.1f}]"])
    if "grpo" in results and "sft" in results:
        g, s = results["grpo"]["curve"][-1], results["sft"]["curve"][-1]
        results["grpo_minus_sft"] = d = paired_bootstrap(s["solved"], g["solved"]).to_dict()
        rows.append(["GRPO - SFT (last point)", "", "", g["execution_accuracy"] - s["execution_accuracy"],
                     f"{100 * d['delta']:+.1f} [{100 * d['low']:+.1f}, {100 * d['high']:+.1f}]"])
    info = machine_info()
    print_table(f"Dev execution accuracy (greedy, {len(eval_tasks)} of {len(dev)} tasks) from {config.model.name_or_path}",
                ["method", "minutes", "steps", "dev EX", "change, points [95% CI]"], rows,
                caption=f"{info['cpu']}, {info['usable_cores']} cores; {load_note(info)}")
    write_json(args.json_out, "bench_learning", {"minutes": minutes, "marks": marks, "arms_in_parallel": args.arms_in_parallel,
                                                 "config": config.to_dict()},
               results, info)
    if "grpo" in results and "sft" in results:
        plot(results, Path(args.png_out), f"GRPO vs continued SFT from the shipped start, {info['cpu']}, "
                                          f"{info['usable_cores']} cores")


if __name__ == "__main__":
    main()
