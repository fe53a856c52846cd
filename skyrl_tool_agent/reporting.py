"""End-of-run output: the before/after table and the optional Hub upload."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)


def print_before_after(summary: Any) -> None:
    from rich.console import Console
    from rich.table import Table

    n = int(summary.before.get("n", 0))
    table = Table(title=f"Held-out tasks (training.eval_split), greedy (n={n}) — {summary.steps} GRPO steps, "
                        f"{summary.seconds / 60:.1f} min")
    table.add_column("metric")
    table.add_column("before GRPO", justify="right")
    table.add_column("after GRPO", justify="right")
    table.add_column("delta", justify="right")
    for key in ("execution_accuracy", "reward_mean", "format_ok_rate"):
        b, a = summary.before.get(key), summary.after.get(key)
        if b is None or a is None:
            continue
        table.add_row(key, f"{b:.3f}", f"{a:.3f}", f"{a - b:+.3f}")
    Console().print(table)
    if summary.delta:
        d = summary.delta
        Console().print(f"execution accuracy change: {100 * d['delta']:+.1f} points, "
                        f"{100 * d['confidence']:.0f}% paired-bootstrap interval "
                        f"[{100 * d['low']:+.1f}, {100 * d['high']:+.1f}] over {d['n']} tasks")
    if summary.stop_reason:
        Console().print(f"training stopped: {summary.stop_reason}")
    Console().print(f"outputs: {summary.output_dir} (metrics.jsonl, training_curves.png, final/)")


def push_to_hub(folder: Path, repo_id: str, *, private: bool = True) -> str:
    """Upload a saved adapter/model folder with `huggingface_hub.HfApi`, creating the repo if needed."""
    from huggingface_hub import HfApi

    api = HfApi()
    api.create_repo(repo_id, private=private, exist_ok=True)
    info = api.upload_folder(folder_path=str(folder), repo_id=repo_id, commit_message="skyrl-tool-agent GRPO")
    logger.info("pushed %s to %s", folder, repo_id)
    return str(info)
