"""Which GRPO settings raise held-out accuracy? Each lever as a GRPO run of equal training time from the
same start, greedy on the generated pool's **validation split** before and after (never dev: this is
where settings are chosen), with paired-bootstrap intervals against the start and against the baseline.

    python benchmarks/sweep_levers.py --minutes 10 [--variant NAME=KEY=VALUE,KEY=VALUE ...] [--set KEY=VALUE ...]

`--set` applies to every variant (e.g. the start: `--set model.name_or_path=DIR`); each `--variant`
adds its own overrides on top (`--variant baseline=` is the main job's settings). Without
`--variant`, the levers of the learning issue: the baseline, an execution-only reward, DAPO
dynamic sampling (refilled groups), tasks with mixed recent outcomes (adaptive curriculum), per-turn
credit, a hotter sampler, a larger LoRA step, two update epochs, full fine-tuning. Runs are
sequential (one at a time is the only honest timing on 2 cores). Writes JSON (per-task outcomes
included) and a PNG of validation accuracy change per variant with its interval. Not a unit test.
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_learning import grpo_curve  # noqa: E402
from common import RESULTS_DIR, console, load_note, machine_info, print_table, write_json  # noqa: E402

from skyrl_tool_agent.config import add_config_args, cli_main_guard, config_from_args  # noqa: E402
from skyrl_tool_agent.eval.stats import paired_bootstrap  # noqa: E402

#: name -> overrides on top of the shared ones (the learning issue's list of levers)
DEFAULT_VARIANTS: dict[str, list[str]] = {
    "baseline": [],
    "execution_only": ["env.reward.terms=[{name: execution, weight: 1.0}]"],
    "refill_2": ["grpo.refill_rounds=2"],
    "adaptive_curriculum": ["grpo.curriculum.mode=adaptive"],
    "turn_credit_0.9": ["env.shaping_rewards=true", "grpo.turn_credit_discount=0.9"],
    "temperature_1.2": ["grpo.temperature=1.2"],
    "lr_3e-3": ["training.learning_rate=3e-3"],
    "update_epochs_2": ["training.update_epochs=2"],
    "full_lr_1e-4": ["training.mode=full", "training.learning_rate=1e-4"],
}


def parse_variant(text: str) -> tuple[str, list[str]]:
    """'NAME=KEY=VALUE,KEY=VALUE' -> (NAME, [KEY=VALUE, ...]); 'NAME=' is the shared settings alone."""
    name, sep, rest = text.partition("=")
    if not sep or not name:
        raise SystemExit(f"error: --variant {text!r}: expected NAME=KEY=VALUE[,KEY=VALUE...] (or NAME= for none)")
    return name, [o for o in re.split(r",(?=[\w.]+=)", rest) if o]  # a comma inside a value (a YAML list) stays


def interval(before: list[Any], after: list[Any]) -> dict[str, float]:
    return paired_bootstrap(before, after).to_dict()


def points(d: dict[str, float]) -> str:
    return f"{100 * d['delta']:+.1f} [{100 * d['low']:+.1f}, {100 * d['high']:+.1f}]"


def plot(results: dict[str, Any], out_png: Path, title: str) -> Path:
    from skyrl_tool_agent.reports.plots import plt, save_figure  # pyplot on the headless backend

    names = list(results)
    fig, ax = plt.subplots(figsize=(7, 0.5 * len(names) + 1.5))
    for y, name in enumerate(names):
        d = results[name]["change"]
        ax.errorbar(100 * d["delta"], y, xerr=[[100 * (d["delta"] - d["low"])], [100 * (d["high"] - d["delta"])]],
                    fmt="o", color="#c44e52" if d["low"] > 0 else "#4c72b0", capsize=3)
    ax.axvline(0, color="grey", linestyle="--", linewidth=1)
    ax.set_yticks(range(len(names)), [f"{n} ({results[n]['steps']} steps)" for n in names], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("validation EX change from the start, points (95% paired bootstrap)")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3, axis="x")
    return save_figure(fig, out_png, dpi=120)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                allow_abbrev=False)
    add_config_args(p)
    p.add_argument("--minutes", type=float, default=10.0, help="GRPO training minutes per variant (evaluation excluded)")
    p.add_argument("--variant", action="append", default=[], metavar="NAME=KEY=VALUE,...",
                   help="a variant (repeatable); default: the learning issue's levers (module doc)")
    p.add_argument("--json-out", default=str(RESULTS_DIR / "sweep_levers.json"))
    p.add_argument("--png-out", default=str(RESULTS_DIR / "sweep_levers.png"))
    args = p.parse_args(argv)
    variants = dict(parse_variant(v) for v in args.variant) if args.variant else DEFAULT_VARIANTS
    shared = [*args.overrides, "training.eval_split=validation", "training.eval_every=0",
              "training.wandb.mode=disabled", "training.time_budget_minutes=null"]
    results: dict[str, Any] = {}
    with cli_main_guard(also=(FileNotFoundError,)):
        for name, overrides in variants.items():
            out = Path(tempfile.mkdtemp(prefix=f"sweep_{name}_"))
            args.overrides = [*shared, *overrides, f"training.output_dir={out}"]
            config = config_from_args(args)  # a bad override fails here, before any run
            console.print(f"[bold]{name}[/]: {' '.join(overrides) or '(shared settings)'}")
            run = grpo_curve(config, [args.minutes], out)
            end = run["curve"][-1]
            results[name] = {"overrides": overrides, "steps": run["steps"], "minutes": end["minutes"],
                             "before": run["before"], "after": end, "change": interval(run["before"]["solved"], end["solved"])}
            write_json(args.json_out, "sweep_levers", {"minutes": args.minutes, "shared": shared, "variants": variants},
                       results, machine_info())  # after each variant: a long sweep keeps what it has
    base = results.get("baseline")
    rows = []
    for name, r in results.items():
        vs_base = (points(interval(base["after"]["solved"], r["after"]["solved"]))
                   if base is not None and name != "baseline" else "")
        rows.append([name, r["steps"], f"{r['minutes']:.1f}", r["before"]["execution_accuracy"],
                     r["after"]["execution_accuracy"], points(r["change"]), vs_base])
        if vs_base:
            r["vs_baseline"] = interval(base["after"]["solved"], r["after"]["solved"])
    info = machine_info()
    n = len(next(iter(results.values()))["before"]["solved"]) if results else 0
    print_table(f"GRPO levers, validation EX (greedy, {n} tasks), {args.minutes:g} training minutes each",
                ["variant", "steps", "minutes", "before", "after", "change, points [95% CI]", "vs baseline"], rows,
                caption=f"{info['cpu']}, {info['usable_cores']} cores; {load_note(info)}")
    write_json(args.json_out, "sweep_levers", {"minutes": args.minutes, "shared": shared, "variants": variants},
               results, info)
    if results:
        plot(results, Path(args.png_out), f"GRPO levers, {args.minutes:g} min each, validation split ({n} tasks)")


if __name__ == "__main__":
    main()
