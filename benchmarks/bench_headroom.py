"""Headroom for RL: greedy execution accuracy vs pass@1 and pass@k under sampling, per temperature.

    python benchmarks/bench_headroom.py [--split dev|validation] [--num-samples 8]
                                        [--temperatures 0.6,0.8,1.0] [--set KEY=VALUE ...]

GRPO mostly turns pass@k into pass@1 (and greedy): the gap between greedy EX and pass@k bounds
what it can gain from sampling alone, and pass@1 at a temperature says how often a group of
episodes holds a success to learn from. The model is the config's (default: the shipped embedded
start), episodes run through the real MCP env exactly as in training (`grpo.max_turns`, token
caps). `--split validation` measures on the generated pool's validation split (what settings may
be chosen on); `--split dev` is for reporting only. Prints a table, writes JSON. Not a unit test.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from statistics import mean

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import RESULTS_DIR, console, load_note, machine_info, print_table, write_json  # noqa: E402

from skyrl_tool_agent.config import add_config_args, cli_main_guard, config_from_args  # noqa: E402


def plot(results: dict, out_png: Path, title: str) -> Path:
    """pass@k against k (1..samples) per temperature, greedy as a line: the room sampling finds."""
    from skyrl_tool_agent.eval.metrics import pass_at_k
    from skyrl_tool_agent.reports.plots import plt, save_figure  # pyplot on the headless backend

    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    for name, r in results.items():
        if r["temperature"] == 0:
            ax.axhline(r["pass@1"], color="black", linestyle="--", linewidth=1, label=f"greedy ({r['pass@1']:.3f})")
            continue
        n = r["samples"]
        ks = list(range(1, n + 1))
        ax.plot(ks, [mean(pass_at_k(n, c, k) for c in r["solved_per_task"]) for k in ks], marker="o", markersize=3,
                label=f"{name}: {100 * r['mixed_groups']:.0f}% of tasks mixed")
    ax.set_xlabel("k (samples per task)")
    ax.set_ylabel("pass@k (execution accuracy)")
    ax.set_ylim(0, 1)
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    return save_figure(fig, out_png, dpi=120)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                allow_abbrev=False)
    add_config_args(p)
    p.add_argument("--split", choices=["dev", "validation"], default="dev")
    p.add_argument("--num-samples", type=int, default=8, help="episodes per task at each temperature (k)")
    p.add_argument("--temperatures", default="0.6,0.8,1.0")
    p.add_argument("--concurrency", type=int, default=128, help="episodes in flight / per generation batch")
    p.add_argument("--limit", type=int, help="a stratified subset of N tasks (quick checks; reported figures use all)")
    p.add_argument("--json-out", default=None, help="default benchmarks/results/bench_headroom_<split>.json")
    p.add_argument("--png-out", default=None, help="default benchmarks/results/bench_headroom_<split>.png")
    args = p.parse_args(argv)
    with cli_main_guard(also=(FileNotFoundError,)):
        from skyrl_tool_agent.env.pools import EnvRuntime
        from skyrl_tool_agent.eval.metrics import pass_at_k
        from skyrl_tool_agent.eval.splits import load_eval_tasks
        from skyrl_tool_agent.policy.qwen import QwenPolicy
        from skyrl_tool_agent.policy.sampling_params import SamplingParams
        from skyrl_tool_agent.rollout.collector import CollectorSettings, collect_episodes

        config = config_from_args(args)
        selection = load_eval_tasks(config, args.split, limit=args.limit, seed=0)
        tasks, db_root = selection.tasks, selection.db_root
        temps = [float(x) for x in args.temperatures.split(",") if x]
        g = config.grpo
        settings = CollectorSettings.from_config(config, concurrency=args.concurrency)
        runtime = EnvRuntime(config.env, db_root)
        policy = QwenPolicy.from_config(config.model, mode="full")
        rows, results = [], {}
        try:
            for temp in [0.0, *temps]:
                k = 1 if temp == 0 else args.num_samples
                t0 = time.monotonic()
                # The turn's token cap is the collector's (`settings`, from grpo.max_new_tokens_per_turn).
                trajs = collect_episodes(policy, runtime, tasks, k, SamplingParams(temperature=temp), settings)
                seconds = time.monotonic() - t0
                solved = [sum(t.result.solved for t in trajs[i * k:(i + 1) * k]) for i in range(len(tasks))]
                p1 = mean(pass_at_k(k, c, 1) for c in solved)
                pk = mean(pass_at_k(k, c, k) for c in solved)
                mixed = mean(float(0 < c < k) for c in solved) if k > 1 else float("nan")
                name = "greedy" if temp == 0 else f"T={temp:g}"
                results[name] = {"temperature": temp, "samples": k, "pass@1": p1, f"pass@{k}": pk,
                                 "mixed_groups": mixed, "seconds": seconds, "solved_per_task": solved}
                rows.append([name, k, p1, pk if k > 1 else float("nan"), mixed, seconds])
                console.print(f"{name}: pass@1 {p1:.3f}" + (f", pass@{k} {pk:.3f}" if k > 1 else "") + f" ({seconds:.0f} s)")
        finally:
            runtime.close()
    info = machine_info()
    print_table(f"Headroom on {args.split} ({len(tasks)} tasks, {config.model.name_or_path})",
                ["decoding", "samples", "pass@1", f"pass@{args.num_samples}", "tasks with mixed outcomes", "seconds"],
                rows, caption=f"{info['cpu']}; {load_note(info)}")
    out = args.json_out or str(RESULTS_DIR / f"bench_headroom_{args.split}.json")
    write_json(out, "bench_headroom", {"split": args.split, "tasks": len(tasks), "num_samples": args.num_samples,
                                       "model": config.model.name_or_path, "max_turns": g.max_turns}, results, info)
    plot(results, Path(args.png_out or RESULTS_DIR / f"bench_headroom_{args.split}.png"),
         f"Headroom on {args.split} ({len(tasks)} tasks): pass@k vs greedy, {info['cpu']}")


if __name__ == "__main__":
    main()
