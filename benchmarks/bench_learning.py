"""Does GRPO raise held-out accuracy? N minutes of GRPO on the frontier vs N minutes of GRPO on
the whole generated pool vs N minutes of continued supervised training, from the same start, on
every dev task at fixed wall-clock points: greedy EX and avg@k (k samples per task at the training
temperature, `training.eval_samples`).

    python benchmarks/bench_learning.py [--arms frontier,pool,sft] [--minutes M] [--points 3]
                                        [--run ARM=OUTPUT_DIR ...] [--arms-in-parallel] [--set KEY=VALUE ...]

- frontier: the main job's trainer and settings (configs/ + --set) with
  `training.data.train_pool=frontier` (the start's mixed-outcome pool tasks, revisited), run in
  segments that each end at a wall-clock mark, then evaluated (evaluation time is off the clock,
  as in the main job).
- pool: the same with `train_pool=generated` (a fresh draw of the whole pool, before session 13's
  default).
- sft: the start's own warm-start recipe at its tail learning rate, on the generated pool,
  evaluated at the same marks.
- No training: the start's figures (every arm's first point).

Each change is reported with its paired-bootstrap 95% interval (tasks resampled, before and after
of a task kept together; avg@k pairs each task's fraction of k samples), and so are the
differences between arms at the last mark. M defaults to the main job's GRPO budget
(`training.time_budget_minutes`). `--run frontier=outputs/grpo` takes an arm from a finished main
job (its before_after.json: one point, its end). `--arms-in-parallel` runs the arms at the same
time, each a process on an equal share of the cores (equal time on equal hardware). Writes JSON
and a PNG of both measures against training minutes. Dev is only reported here: no setting is
chosen on it. Not a unit test.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import RESULTS_DIR, console, load_note, machine_info, print_table, write_json  # noqa: E402

from skyrl_tool_agent.config import Config, add_config_args, cli_main_guard, config_from_args  # noqa: E402
from skyrl_tool_agent.eval.stats import paired_bootstrap  # noqa: E402


ARMS = ("frontier", "pool", "sft")
LABELS = {"frontier": "GRPO (frontier)", "pool": "GRPO (whole pool)", "sft": "continued SFT"}
COLORS = {"frontier": "#c44e52", "pool": "#dd8452", "sft": "#4c72b0"}
TRAIN_POOL = {"frontier": "frontier", "pool": "generated"}


def grpo_curve(config: Config, marks: list[float], out: Path) -> dict[str, Any]:
    """GRPO from the config's model, evaluated on the eval tasks at each training-time mark
    (`pipeline.GRPOCurve`; `config` writes into `out`, evaluates only when a segment ends)."""
    from skyrl_tool_agent.jobs.arms import GRPOCurve

    arm = GRPOCurve(config, out)
    try:
        before = arm.evaluate_start()

        def step_line(metrics: dict[str, Any]) -> None:  # a long run shows progress
            if metrics["step"] % 10 == 0:
                console.print(f"GRPO step {metrics['step']}, {metrics['time/elapsed_s'] / 60:.1f} min, "
                              f"reward {metrics['reward/mean'] or 0:.3f}")
        for mark in marks:
            point = arm.train_for(60 * mark, on_step=step_line)
            console.print(f"GRPO {point['minutes']:.1f} min, step {point['step']}: {config.training.eval_split} EX "
                          f"{point['execution_accuracy']:.3f}")
            if arm.finished:
                if mark != marks[-1]:  # the arm would otherwise look shorter than asked, silently
                    console.print(f"[yellow]warning: GRPO reached training.max_steps={config.training.max_steps} at "
                                  f"{point['minutes']:.1f} of {marks[-1]:g} minutes; raise it for a longer run")
                break
    finally:
        arm.close()
    return {"before": before, "curve": arm.curve, "steps": arm.trainer.step, "metrics": str(out / "metrics.jsonl")}


def arm_from_run(run_dir: Path) -> dict[str, Any]:
    """An arm as a finished main job recorded it (one point: its end)."""
    path = run_dir / "before_after.json"
    if not path.is_file():
        raise SystemExit(f"error: {path} not found (run train_grpo.py with --output-dir {run_dir} first)")
    record = json.loads(path.read_text())
    if not record["before"].get("solved"):
        raise SystemExit(f"error: {path} has no per-task outcomes (written by an older version)")
    point = {"minutes": record["training_minutes"], "step": record["steps"], **record["after"]}
    return {"before": record["before"], "curve": [point], "steps": record["steps"], "metrics": str(run_dir / "metrics.jsonl"),
            "from_run": str(run_dir), "stop_reason": record["stop_reason"]}


def run_arm(arm: str, args: argparse.Namespace, marks: list[float], minutes: float, eval_tasks: list) -> dict[str, Any]:
    """One arm in this process."""
    from skyrl_tool_agent.jobs.arms import continue_warm_start

    if arm == "sft":
        def sft_line(step: int, loss: float) -> None:
            if step % 100 == 0:
                console.print(f"SFT step {step}, loss {loss:.4f}")

        args.overrides += ["training.data.train_pool=generated"]
        return continue_warm_start(config_from_args(args), minutes, eval_at_minutes=tuple(marks[:-1]),
                                   eval_tasks=eval_tasks, progress=sft_line)
    out = Path(tempfile.mkdtemp(prefix=f"bench_learning_{arm}_"))
    args.overrides += [f"training.data.train_pool={TRAIN_POOL[arm]}", f"training.output_dir={out}",
                       "training.eval_every=0", "training.wandb.mode=disabled"]
    return grpo_curve(config_from_args(args), marks, out)


def arms_in_parallel(argv: list[str], arms: list[str], tmp: Path) -> dict[str, Any]:
    """The arms at once, each a child process of this script (`--only`) pinned to an equal share of
    the cores: equal time on equal hardware, in a fraction of the wall clock. Returns {arm: results}."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 2)
    threads = str(max(1, cores // len(arms)))
    env = {**os.environ, "OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads, "TOKENIZERS_PARALLELISM": "false"}
    children = {arm: subprocess.Popen([sys.executable, __file__, *argv, "--arms", arm, "--only-child",
                                       "--json-out", str(tmp / f"{arm}.json"), "--png-out", "-"], env=env)
                for arm in arms}
    failed = [arm for arm, child in children.items() if child.wait() != 0]
    if failed:
        raise SystemExit(f"error: the {' and '.join(failed)} arm failed (its output is above)")
    return {arm: json.loads((tmp / f"{arm}.json").read_text())["results"][arm] for arm in children}


def interval(before: list, after: list) -> dict[str, float]:
    return paired_bootstrap(before, after).to_dict()


def fmt(d: dict[str, float] | None) -> str:
    return "" if d is None else f"{100 * d['delta']:+.1f} [{100 * d['low']:+.1f}, {100 * d['high']:+.1f}]"


def per_task_sampled(record: dict[str, Any]) -> list | None:
    return (record.get("sampled") or {}).get("per_task")


def plot(results: dict[str, Any], arms: list[str], out_png: Path, title: str) -> Path:
    from skyrl_tool_agent.reports.plots import plt, save_figure  # pyplot on the headless backend

    start = results["start"]
    sampled = start.get("sampled")
    panels = [("execution_accuracy", "delta", "dev execution accuracy (greedy)")]
    if sampled:
        panels.append(("avg@k", "sampled_delta", f"dev avg@{sampled['k']} (T={sampled['temperature']:g})"))
    fig, axes = plt.subplots(1, len(panels), figsize=(6.5 * len(panels), 4.5), squeeze=False)
    for ax, (key, delta_key, ylabel) in zip(axes[0], panels):
        def value(record: dict[str, Any]) -> float:
            return record[key] if key == "execution_accuracy" else record["sampled"][key]

        y0 = value(start)
        for name in arms:
            arm = results[name]
            xs = [0.0] + [p["minutes"] for p in arm["curve"]]
            ys = [y0] + [value(p) for p in arm["curve"]]
            lo = [y0] + [y0 + p[delta_key]["low"] for p in arm["curve"]]
            hi = [y0] + [y0 + p[delta_key]["high"] for p in arm["curve"]]
            ax.plot(xs, ys, marker="o", color=COLORS[name], label=f"{LABELS[name]} ({arm['steps']} steps)")
            ax.fill_between(xs, lo, hi, color=COLORS[name], alpha=0.12, linewidth=0)
        ax.axhline(y0, color="grey", linestyle="--", linewidth=1, label="no training")
        ax.set_ylim(max(0.0, y0 - 0.15), min(1.0, y0 + 0.2))
        ax.set_xlabel("training minutes (evaluation excluded)")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        ax.legend(loc="upper left", fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.text(0.01, 0.01, "bands: 95% paired-bootstrap interval of the change from the start", fontsize=7, color="grey")
    return save_figure(fig, out_png, dpi=120)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                allow_abbrev=False)
    add_config_args(p)
    p.add_argument("--arms", default=",".join(ARMS), help=f"comma-separated, of {', '.join(ARMS)}")
    p.add_argument("--minutes", type=float, help="training minutes per arm (default: training.time_budget_minutes); "
                   "GRPO also stops at training.max_steps: raise it for longer runs")
    p.add_argument("--points", type=int, default=3, help="evaluations per arm, evenly spaced in time")
    p.add_argument("--run", action="append", default=[], metavar="ARM=OUTPUT_DIR",
                   help="take a GRPO arm from a finished main job (train_grpo.py's before_after.json) instead of "
                        "running it; --minutes defaults to its training time")
    p.add_argument("--arms-in-parallel", action="store_true",
                   help="run the arms at the same time, each on an equal share of the cores")
    p.add_argument("--only-child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--json-out", default=str(RESULTS_DIR / "bench_learning.json"))
    p.add_argument("--png-out", default=str(RESULTS_DIR / "bench_learning.png"))
    argv = list(sys.argv[1:] if argv is None else argv)
    args = p.parse_args(argv)
    arms = [a for a in args.arms.split(",") if a]
    if unknown := set(arms) - set(ARMS):
        p.error(f"unknown arms {sorted(unknown)}; choose from {', '.join(ARMS)}")
    from_runs = dict(item.split("=", 1) for item in args.run)
    if bad := set(from_runs) - {"frontier", "pool"}:
        p.error(f"--run takes a GRPO arm (frontier, pool), not {sorted(bad)}")
    arms = [a for a in ARMS if a in {*arms, *from_runs}]  # the table's order: frontier, pool, sft
    with cli_main_guard(also=(FileNotFoundError,)):
        from skyrl_tool_agent.eval.splits import TaskSplits

        config = config_from_args(args)
        results: dict[str, Any] = {arm: arm_from_run(Path(d)) for arm, d in from_runs.items()}
        minutes = args.minutes or (next(iter(results.values()))["curve"][-1]["minutes"] if results else None) \
            or config.training.time_budget_minutes
        if not minutes:
            raise SystemExit("error: give --minutes (training.time_budget_minutes is null)")
        marks = [minutes * (i + 1) / args.points for i in range(args.points)]
        splits = TaskSplits.load(config)
        eval_tasks, dev = splits.run_eval(), splits.dev  # what the main job evaluates: all dev by default
        to_run = [a for a in arms if a not in results]
        if args.arms_in_parallel and len(to_run) > 1:
            child_argv = [a for a in argv if a != "--arms-in-parallel"]
            results.update(arms_in_parallel(child_argv, to_run, Path(tempfile.mkdtemp(prefix="bench_learning_arms_"))))
        else:
            for arm in to_run:
                arm_args = argparse.Namespace(**{**vars(args), "overrides": list(args.overrides)})
                results[arm] = run_arm(arm, arm_args, marks, minutes, eval_tasks)
    if args.only_child:
        write_json(args.json_out, "bench_learning", {"arm": arms[0]}, results, machine_info())
        return
    start = results[arms[0]]["before"]
    for arm in arms[1:]:
        if results[arm]["before"]["solved"] != start["solved"]:
            console.print(f"[yellow]warning: the {arm} arm's greedy start differs from the {arms[0]} arm's")
    results["start"] = start
    k = (start.get("sampled") or {}).get("k")
    rows = [["no training", 0.0, 0, start["execution_accuracy"], "", (start.get("sampled") or {}).get("avg@k"), ""]]
    for name in arms:
        for point in results[name]["curve"]:
            point["delta"] = interval(start["solved"], point["solved"])
            if k and per_task_sampled(point):
                point["sampled_delta"] = interval(per_task_sampled(start), per_task_sampled(point))
            rows.append([LABELS[name], point["minutes"], point["step"], point["execution_accuracy"], fmt(point["delta"]),
                         (point.get("sampled") or {}).get("avg@k"), fmt(point.get("sampled_delta"))])
    results["differences"] = {}
    for i, a in enumerate(arms):  # every pair of arms at their last points
        for b in arms[i + 1:]:
            pa, pb = results[a]["curve"][-1], results[b]["curve"][-1]
            d = {"greedy": interval(pb["solved"], pa["solved"])}
            if k and per_task_sampled(pa) and per_task_sampled(pb):
                d["avg@k"] = interval(per_task_sampled(pb), per_task_sampled(pa))
            results["differences"][f"{a} - {b}"] = d
            rows.append([f"{LABELS[a]} - {LABELS[b]}", "", "", d["greedy"]["delta"], fmt(d["greedy"]),
                         (d.get("avg@k") or {}).get("delta"), fmt(d.get("avg@k"))])
    info = machine_info()
    print_table(f"Dev (greedy EX and avg@{k}, {len(eval_tasks)} of {len(dev)} tasks) from {config.model.name_or_path}",
                ["method", "minutes", "steps", "dev EX", "change, points [95% CI]", f"dev avg@{k}",
                 "change, points [95% CI]"], rows,
                caption=f"{info['cpu']}, {info['usable_cores']} cores; {load_note(info)}")
    write_json(args.json_out, "bench_learning", {"minutes": minutes, "marks": marks, "arms": arms,
                                                 "arms_in_parallel": args.arms_in_parallel, "from_runs": from_runs,
                                                 "config": config.to_dict()},
               results, info)
    if args.png_out != "-":
        plot(results, arms, Path(args.png_out), f"{' vs '.join(LABELS[a] for a in arms)} from the shipped start, "
                                                f"{info['cpu']}, {info['usable_cores']} cores")


if __name__ == "__main__":
    main()
