"""PNG plots a person would rather see than read: training curves, accuracy by difficulty and
why answers are wrong (the error anatomy)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # headless: never needs a display
import matplotlib.pyplot as plt  # noqa: E402

from skyrl_tool_agent.reports.atomic import replaced_atomically  # noqa: E402

# Panels of the training curves: (title, y range or None for auto, [(metrics key, label, kind)]).
# A key ending in "@" is completed from the rows (eval/avg@4 for `training.eval_samples` 4).
# Rewards and accuracies live on 0-1 by construction, so their axes are fixed there: an auto
# range would blow a 0.01 wobble up to the full panel height.
PANELS = [
    ("reward", (0.0, 1.0), [("reward/mean", "train (sampled, per step)", "step"),
                            ("eval/reward_mean", "{eval_split} (greedy)", "eval")]),
    ("execution accuracy", (0.0, 1.0), [("train/execution_accuracy", "train (sampled, per step)", "step"),
                                        ("probe/execution_accuracy", "probe: the same training tasks (sampled)", "probe"),
                                        ("probe/held_out_execution_accuracy", "probe: held-out tasks, never trained on (sampled)",
                                         "probe"),
                                        ("eval/execution_accuracy", "{eval_split} (greedy)", "eval"),
                                        ("eval/avg@", "{eval_split} ({key}, sampled)", "eval")]),
    ("KL to reference", None, [("train/kl", "k-estimator mean", "step")]),
    ("policy entropy", None, [("train/entropy", "mean per policy token", "step")]),
]


def save_figure(fig: plt.Figure, out_png: Path, *, dpi: int = 110) -> Path:
    """Lay out `fig`, write it to `out_png` (its folder made; replaced atomically: a run rewrites
    its pictures while a person may be looking at them) and free it."""
    fig.tight_layout()
    # tight_layout leaves a placeholder layout engine, for which savefig lays the figure out once
    # more (a draw without pixels: ~12% of a picture's CPU); the layout is done, the bytes the same.
    fig.set_layout_engine(None)
    try:
        with replaced_atomically(out_png) as tmp:
            fig.savefig(tmp, dpi=dpi)
    finally:
        plt.close(fig)
    return out_png


def _rolling_mean(values: list[float], window: int) -> list[float]:
    return [sum(values[max(0, i - window + 1): i + 1]) / (i + 1 - max(0, i - window + 1)) for i in range(len(values))]


def plot_training_curves(metrics_path: Path, out_png: Path, *, eval_split: str = "dev", kl_off: bool = False,
                         state: str = "") -> Path:
    """Reward, execution accuracy, KL and entropy against step, from metrics.jsonl. `kl_off`: the
    logged KL is a placeholder 0 (no KL term), said instead of drawn. `state`: the run's state in
    words, the picture's title."""
    rows = [json.loads(line) for line in Path(metrics_path).read_text().splitlines() if line.strip()]
    fig, axes = plt.subplots(2, 2, figsize=(11, 7))
    if state:
        fig.suptitle(state, fontsize=10)
    for ax, (title, ylim, series) in zip(axes.flat, PANELS):
        if kl_off and title == "KL to reference":
            ax.text(0.5, 0.5, "no KL term\n(grpo.kl_coef = 0: no reference pass)", ha="center", va="center",
                    transform=ax.transAxes, color="#555555")
            ax.set_xticks([])
            ax.set_yticks([])
            series = []
        eval_colors, probe_colors = iter(("#c44e52", "#dd8452")), iter(("#55a868", "#8172b2"))
        for key, label, kind in series:
            if key.endswith("@"):
                key = next((k for r in rows for k in r if k.startswith(key)), key)
            label = label.format(eval_split=eval_split, key=key.removeprefix("eval/"))
            points = [(r["step"], r[key]) for r in rows if r.get(key) is not None]
            if not points:
                continue
            xs, ys = zip(*points)
            if kind == "eval":
                ax.plot(xs, ys, marker="o", markersize=5, linewidth=2, label=label, color=next(eval_colors))
            elif kind == "probe":
                ax.plot(xs, ys, marker="s", markersize=4, linewidth=2, label=label, color=next(probe_colors))
            else:
                ax.plot(xs, ys, linewidth=0.8, alpha=0.35, color="#4c72b0")
                ax.plot(xs, _rolling_mean(list(ys), 5), linewidth=1.8, color="#4c72b0",
                        label=f"{label}, 5-step mean")
        if ylim:
            ax.set_ylim(*ylim)
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8, loc="best")
    return save_figure(fig, out_png)


def plot_accuracy_by_difficulty(by_difficulty: Mapping[str, Mapping[str, float]], out_png: Path, title: str = "", *,
                                key: str = "execution_accuracy", label: str = "execution accuracy") -> Path:
    """Bar chart of accuracy (`key`, called `label`) per difficulty bucket (with n in the labels)."""
    names = [k for k in ("easy", "medium", "hard", "extra") if k in by_difficulty] or list(by_difficulty)
    rates = [by_difficulty[k][key] for k in names]  # None: nothing scored (no bar, labelled)
    values = [v or 0.0 for v in rates]
    labels = [f"{k}\n(n={int(by_difficulty[k].get('n', 0))})" for k in names]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.bar(labels, values, color="#4c72b0")
    ax.set_ylim(0, 1.1)  # headroom for the value labels above full bars
    ax.set_ylabel(label)
    ax.set_title(title or f"{label.capitalize()} by difficulty")
    for i, v in enumerate(rates):
        ax.text(i, (v or 0.0) + 0.02, "unscored" if v is None else f"{v:.2f}", ha="center")
    return save_figure(fig, out_png)


def plot_error_anatomy(anatomies: Sequence[tuple[str, Mapping[str, Any]]], out_png: Path, title: str = "") -> Path:
    """Horizontal bars: each error category's count (`eval.anatomy`) for one or more evaluations
    of the same tasks, e.g. [("before GRPO", before["error_anatomy"]), ("after GRPO", ...)]:
    side by side per category, the count written at each bar's end."""
    from skyrl_tool_agent.eval.anatomy import CATEGORIES, LABELS

    fig, ax = plt.subplots(figsize=(8, 0.45 * len(CATEGORIES) * max(1, len(anatomies)) + 1.2))
    height = 0.8 / max(1, len(anatomies))
    colors = ("#8c8c8c", "#4c72b0", "#dd8452", "#55a868")
    top = 1
    for j, (name, anatomy) in enumerate(anatomies):
        counts = [int((anatomy.get("counts") or {}).get(c, 0)) for c in CATEGORIES]
        ys = [i + j * height for i in range(len(CATEGORIES))]
        ax.barh(ys, counts, height=height, label=f"{name} ({anatomy.get('wrong', 0)} wrong of "
                f"{anatomy.get('scored', 0)})", color=colors[(j + (len(anatomies) == 1)) % len(colors)])
        for y, n in zip(ys, counts):
            ax.text(n, y, f" {n}", va="center", fontsize=8)
        top = max(top, *counts)
    ax.set_yticks([i + height * (len(anatomies) - 1) / 2 for i in range(len(CATEGORIES))])
    ax.set_yticklabels([LABELS[c] for c in CATEGORIES])
    ax.invert_yaxis()  # the classifier's order, top down
    ax.set_xlim(0, top * 1.15)
    ax.set_xlabel("wrong answers")
    ax.set_title(title or "Why answers are wrong")
    ax.grid(axis="x", alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    return save_figure(fig, out_png)
