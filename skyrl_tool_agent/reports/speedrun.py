"""The speedrun's record shown: the README tables (`markdown_tables`) and the curves
(`plot_speedrun`), both from `speedrun.json`'s record alone."""

from __future__ import annotations

from pathlib import Path
from statistics import mean, median
from typing import Any


def per_task_samples(record: dict[str, Any] | None) -> list | None:
    """An evaluation record's per-task sampled success (avg@k's paired data), if it has one."""
    return ((record or {}).get("sampled") or {}).get("per_task")


def _fmt_delta(d: dict[str, float] | None) -> str:
    return "" if not d else f"{100 * d['delta']:+.1f} [{100 * d['low']:+.1f}, {100 * d['high']:+.1f}]"


def _fmt(value: Any, spec: str = ".3f") -> str:
    return "–" if value is None else format(value, spec)


def markdown_tables(record: dict[str, Any]) -> str:
    """The README tables: dev results by arm (changes with 95% paired-bootstrap intervals), what
    each phase cost, and the GRPO step's throughput."""
    start = record.get("start") or {}
    k = (start.get("sampled") or {}).get("k")
    lines = [f"Dev, {int(start.get('n', 0) or len(start.get('solved') or []))} tasks: greedy EX and avg@{k} "
             "(common random numbers); changes in points, 95% paired-bootstrap interval", "",
             f"| arm | training min | steps | dev EX | change | dev avg@{k} | change |", "|---|---|---|---|---|---|---|",
             f"| start (plateau) | 0 | 0 | {_fmt(start.get('execution_accuracy'))} | | "
             f"{_fmt((start.get('sampled') or {}).get('avg@k'))} | |"]
    names = {"grpo": "GRPO", "sft": "continued SFT"}
    for arm in ("grpo", "sft"):
        for p in (record.get(arm) or {}).get("curve", []):
            lines.append(f"| {names[arm]} | {p['minutes']:.2f} | {p['step']} | {_fmt(p.get('execution_accuracy'))} | "
                         f"{_fmt_delta(p.get('delta'))} | {_fmt((p.get('sampled') or {}).get('avg@k'))} | "
                         f"{_fmt_delta(p.get('sampled_delta'))} |")
    if diff := record.get("grpo_minus_sft"):
        lines.append(f"| GRPO − SFT | | | | {_fmt_delta(diff['greedy'])} | | {_fmt_delta(diff['avg@k'])} |")
    lines += anatomy_table(record)
    build = record.get("build") or {}
    lines += ["", "| phase | status | seconds |", "|---|---|---|"]
    lines += [f"| {name} | {p['status']} | {p.get('seconds', 0):.1f} |" for name, p in record["phases"].items()
              if p["status"] != "running"]
    if build:
        curve = ", ".join(f"{e['step']}: {_fmt(e.get('execution_accuracy'))}" for e in build["validation_curve"])
        shape = build["shape"]
        lines += ["", f"Build: {build['parameters'] / 1e6:.1f}M parameters (hidden {shape['hidden_size']}, "
                      f"{shape['layers']} layers, {shape['heads']}/{shape['kv_heads']} heads, MLP "
                      f"{shape['intermediate_size']}), {build['steps']} "
                      f"supervised steps x {build['batch_size']} in {build['train_seconds']:.0f} s, loss "
                      f"{_fmt(build['loss_first'])} -> {_fmt(build['loss_last'], '.4f')}; validation EX by step: "
                      f"{curve}; {build['plateau']['stopped']}."]
    thr = (record.get("grpo") or {}).get("throughput") or {}
    if thr:
        lines += ["", "| GRPO step | rollout s | update s | generated tokens/s | turns/episode | tool calls/episode "
                      "| reward | peak GPU GiB |", "|---|---|---|---|---|---|---|---|",
                  f"| mean of {thr['steps_averaged']} | {_fmt(thr['rollout_s_mean'], '.2f')} | "
                  f"{_fmt(thr['update_s_mean'], '.2f')} | {_fmt(thr['generated_tokens_per_s_mean'], ',.0f')} | "
                  f"{_fmt(thr['turns_per_episode_mean'], '.2f')} | {_fmt(thr['tool_calls_per_episode_mean'], '.2f')} | "
                  f"{_fmt(thr['reward_mean'])} | {_fmt(thr['gpu_peak_gib'], '.1f')} |"]
    if sft := record.get("sft"):
        lines += ["", f"Continued SFT: {sft['steps']} steps in {sft['training_s']:.0f} s "
                      f"({sft['steps_per_s']:.1f} steps/s)."]
    return "\n".join(lines) + "\n"


def anatomy_table(record: dict[str, Any]) -> list[str]:
    """Why the dev answers are wrong (greedy, `eval.anatomy`): the start's count of each category
    and each arm's at its end, with the change of the rate (points, 95% paired-bootstrap interval);
    no lines when the start has no anatomy."""
    from skyrl_tool_agent.eval.anatomy import CATEGORIES, LABELS

    start = (record.get("start") or {}).get("error_anatomy")
    if not start:
        return []
    arms = [(name, record[arm]) for arm, name in (("grpo", "GRPO"), ("sft", "SFT"))
            if (record.get(arm) or {}).get("curve")]
    head = "| error | start |" + "".join(f" {name} | change |" for name, _ in arms)
    lines = ["", "Why the dev answers are wrong (greedy; each arm at its end)", "", head,
             "|---|---|" + "---|---|" * len(arms)]
    for c in CATEGORIES:
        row = f"| {LABELS[c]} | {start['counts'].get(c, 0)} |"
        for _, arm in arms:
            end = arm["curve"][-1].get("error_anatomy") or {}
            delta = (arm.get("error_anatomy_delta") or {}).get(c)
            row += f" {(end.get('counts') or {}).get(c, '–')} | {_fmt_delta(delta)} |"
        lines.append(row)
    return lines


def plot_speedrun(record: dict[str, Any], out_png: Path) -> Path:
    """Three panels: the build's validation curve; GRPO's training reward and probe by step; dev
    greedy EX and avg@k of both arms against training minutes, with their interval bands."""
    from skyrl_tool_agent.reports.plots import plt, save_figure

    fig, axes = plt.subplots(1, 3, figsize=(17, 4.5))
    build = record.get("build") or {}
    evals = [e for e in build.get("validation_curve", []) if e.get("execution_accuracy") is not None]
    ax = axes[0]
    ax.plot([e["step"] for e in evals], [e["execution_accuracy"] for e in evals], marker="o", color="#55a868")
    ax.set(xlabel="supervised step", ylabel="validation EX (greedy)", title="build from nothing", ylim=(0, 1))
    ax = axes[1]
    steps = (record.get("grpo") or {}).get("steps", [])
    ax.plot([s["step"] for s in steps], [s["reward"] for s in steps], color="#c44e52", label="training reward")
    probe = [(s["step"], s["probe"]) for s in steps if s["probe"] is not None]
    if probe:
        ax.plot(*zip(*probe), marker="o", color="#8172b2", label="probe: revisited training tasks")
    held_out = [(s["step"], s["probe_held_out"]) for s in steps if s.get("probe_held_out") is not None]
    if held_out:
        ax.plot(*zip(*held_out), marker="s", color="#55a868", label="probe: held-out tasks, never trained on")
    ax.set(xlabel="GRPO step", ylabel="reward / success", title="GRPO training", ylim=(0, 1))
    ax.legend(fontsize=8)
    ax = axes[2]
    start = record.get("start") or {}
    colors = {"grpo": "#c44e52", "sft": "#4c72b0"}
    for arm in ("grpo", "sft"):
        curve = (record.get(arm) or {}).get("curve", [])
        if not curve or start.get("execution_accuracy") is None:
            continue
        xs = [0.0] + [p["minutes"] for p in curve]
        ax.plot(xs, [start["execution_accuracy"]] + [p["execution_accuracy"] for p in curve], marker="o",
                color=colors[arm], label=f"{arm} greedy")
        if per_task_samples(start) and all(per_task_samples(p) for p in curve):
            ax.plot(xs, [start["sampled"]["avg@k"]] + [p["sampled"]["avg@k"] for p in curve], marker="s",
                    linestyle="--", color=colors[arm], label=f"{arm} avg@{start['sampled']['k']}")
        bands = [(p["minutes"], p["delta"]) for p in curve if p.get("delta")]
        if bands:
            ax.fill_between([0.0] + [m for m, _ in bands],
                            [start["execution_accuracy"]] + [start["execution_accuracy"] + d["low"] for _, d in bands],
                            [start["execution_accuracy"]] + [start["execution_accuracy"] + d["high"] for _, d in bands],
                            color=colors[arm], alpha=0.12, linewidth=0)
    ax.set(xlabel="training minutes (evaluations excluded)", ylabel="dev", title="dev: GRPO vs continued SFT",
           ylim=(0, 1))
    ax.legend(fontsize=8)
    for ax in axes:
        ax.grid(alpha=0.3)
    fig.suptitle(f"speedrun, {record['plan']['minutes']:g} min budget, "
                 f"{(record['phases'].get('setup') or {}).get('device', '?')}", fontsize=10)
    return save_figure(fig, out_png)


def throughput(steps: list[dict[str, Any]]) -> dict[str, Any]:
    """Per-step means (after the first step, which captures CUDA graphs and warms caches, when
    there are more), and the peak GPU memory of any step."""
    if not steps:
        return {}
    rows = steps[1:] if len(steps) > 1 else steps

    def avg(key: str) -> float | None:
        values = [r[key] for r in rows if r[key] is not None]
        return mean(values) if values else None

    peaks = [r["gpu_peak_gib"] for r in steps if r["gpu_peak_gib"] is not None]
    return {"steps_averaged": len(rows), "first_step_s": steps[0]["rollout_s"] + steps[0]["update_s"],
            **{f"{key}_mean": avg(key) for key in ("rollout_s", "update_s", "generated_tokens_per_s",
                                                    "turns_per_episode", "tool_calls_per_episode", "reward")},
            "step_s_median": median(r["rollout_s"] + r["update_s"] for r in rows),
            "gpu_peak_gib": max(peaks) if peaks else None}
