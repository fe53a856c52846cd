"""PNG plots a person would rather see than read: training curves and accuracy by difficulty."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # headless: never needs a display
import matplotlib.pyplot as plt  # noqa: E402

CURVES = [
    ("reward/mean", "train reward (mean)"),
    ("eval/execution_accuracy", "dev execution accuracy (greedy)"),
    ("train/kl", "KL to reference"),
    ("train/entropy", "policy entropy"),
]


def plot_training_curves(metrics_path: Path, out_png: Path) -> Path:
    """Reward, dev EX, KL and entropy against step, from metrics.jsonl."""
    rows = [json.loads(line) for line in Path(metrics_path).read_text().splitlines() if line.strip()]
    fig, axes = plt.subplots(2, 2, figsize=(10, 7))
    for ax, (key, title) in zip(axes.flat, CURVES):
        points = [(r["step"], r[key]) for r in rows if key in r and r[key] is not None]
        if points:
            xs, ys = zip(*points)
            ax.plot(xs, ys, marker="o", markersize=3)
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    fig.tight_layout()
    out_png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out_png, dpi=110)
    plt.close(fig)
    return out_png


def plot_accuracy_by_difficulty(by_difficulty: Mapping[str, Mapping[str, float]], out_png: Path, title: str = "") -> Path:
    """Bar chart of execution accuracy per difficulty bucket (with n in the labels)."""
    names = [k for k in ("easy", "medium", "hard", "extra") if k in by_difficulty] or list(by_difficulty)
    values = [by_difficulty[k]["execution_accuracy"] for k in names]
    labels = [f"{k}\n(n={int(by_difficulty[k].get('n', 0))})" for k in names]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.bar(labels, values, color="#4c72b0")
    ax.set_ylim(0, 1.1)  # headroom for the value labels above full bars
    ax.set_ylabel("execution accuracy")
    ax.set_title(title or "Execution accuracy by difficulty")
    for i, v in enumerate(values):
        ax.text(i, v + 0.02, f"{v:.2f}", ha="center")
    fig.tight_layout()
    out_png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out_png, dpi=110)
    plt.close(fig)
    return out_png
