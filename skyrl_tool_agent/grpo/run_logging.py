"""Where a run's numbers go: `metrics.jsonl` (always), W&B (when configured), curves as PNG.

W&B never blocks: `auto` mode is online only when `WANDB_API_KEY` is set, offline otherwise, and
any W&B failure downgrades to metrics.jsonl alone with one warning.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)


class RunLogger:
    def __init__(self, output_dir: Path, *, wandb_config: Any = None, run_config: dict | None = None) -> None:
        self.path = output_dir / "metrics.jsonl"
        output_dir.mkdir(parents=True, exist_ok=True)
        self._wandb = None
        if wandb_config is not None:
            self._start_wandb(output_dir, wandb_config, run_config or {})

    def _start_wandb(self, output_dir: Path, cfg: Any, run_config: dict) -> None:
        mode = cfg.mode
        if mode == "auto":
            mode = "online" if os.environ.get("WANDB_API_KEY") else "offline"
        if mode == "disabled":
            return
        if mode != "online":  # offline means offline: no error reports to sentry either
            os.environ.setdefault("WANDB_ERROR_REPORTING", "false")
        try:
            import wandb

            os.environ.setdefault("WANDB_SILENT", "true")
            self._wandb = wandb.init(
                project=cfg.project, entity=cfg.entity, name=cfg.run_name, mode=mode,
                dir=str(output_dir), config=run_config, reinit="finish_previous",
                settings=wandb.Settings(init_timeout=60, console="off"),
            )
        except Exception as exc:  # noqa: BLE001 - logging must never stop training
            logger.warning("W&B disabled for this run (%s: %s); metrics.jsonl still written", type(exc).__name__, exc)
            self._wandb = None

    def truncate_after(self, step: int) -> None:
        """On resume, drop lines logged after the checkpoint's step (they will be logged again)."""
        if not self.path.is_file():
            return
        kept = [line for line in self.path.read_text().splitlines() if line.strip() and json.loads(line)["step"] <= step]
        self.path.write_text("".join(line + "\n" for line in kept))

    def log(self, metrics: dict[str, Any]) -> None:
        with self.path.open("a") as f:
            f.write(json.dumps(metrics) + "\n")
        if self._wandb is not None:
            try:
                self._wandb.log({k: v for k, v in metrics.items() if k != "step"}, step=int(metrics["step"]))
            except Exception as exc:  # noqa: BLE001
                logger.warning("W&B log failed (%s); continuing without W&B", exc)
                self._wandb = None

    def finish(self) -> None:
        if self._wandb is not None:
            try:
                self._wandb.finish()
            except Exception:  # noqa: BLE001
                pass
