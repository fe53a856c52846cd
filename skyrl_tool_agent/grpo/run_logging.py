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


#: The W&B run id of a run directory, so that `--resume` continues the same W&B run.
WANDB_RUN_FILE = "wandb_run.json"


class RunLogger:
    """`resume`: this run continues the one logged in `output_dir` (same W&B run id)."""

    def __init__(self, output_dir: Path, *, wandb_config: Any = None, run_config: dict | None = None,
                 resume: bool = False) -> None:
        self.path = output_dir / "metrics.jsonl"
        self.rollouts_path = output_dir / "rollouts.jsonl"
        output_dir.mkdir(parents=True, exist_ok=True)
        self._wandb = None
        if wandb_config is not None:
            self._start_wandb(output_dir, wandb_config, run_config or {}, resume)

    def _start_wandb(self, output_dir: Path, cfg: Any, run_config: dict, resume: bool) -> None:
        mode = cfg.resolved_mode()
        if mode == "disabled":
            return
        if mode != "online":  # offline means offline: no error reports to sentry either
            os.environ.setdefault("WANDB_ERROR_REPORTING", "false")
        id_file = output_dir / WANDB_RUN_FILE
        run_id = None
        if resume and id_file.is_file():
            run_id = json.loads(id_file.read_text()).get("id")
        try:
            import wandb

            os.environ.setdefault("WANDB_SILENT", "true")

            def start(mode: str) -> Any:
                return wandb.init(
                    project=cfg.resolved_project(), entity=cfg.resolved_entity(), name=cfg.run_name, mode=mode,
                    dir=str(output_dir), config=run_config, reinit="finish_previous", id=run_id,
                    resume="allow" if run_id else None,
                    settings=wandb.Settings(init_timeout=float(os.environ.get("WANDB_INIT_TIMEOUT", 60)), console="off"),
                )

            try:
                self._wandb = start(mode)
            except Exception as exc:  # noqa: BLE001 - e.g. a key but no network: keep the run, offline
                if mode != "online":
                    raise
                logger.warning("W&B unreachable (%s: %s); logging offline in %s (upload later with `wandb sync`)",
                               type(exc).__name__, exc, output_dir / "wandb")
                self._wandb = start("offline")
            id_file.write_text(json.dumps({"id": self._wandb.id}) + "\n")
            if self._wandb.settings.mode == "offline":  # say once where it goes and how to upload it
                logger.info("W&B offline: run written to %s; upload with `wandb sync %s` (after `wandb login`)",
                            self._wandb.dir, Path(self._wandb.dir).parent)
        except Exception as exc:  # noqa: BLE001 - logging must never stop training
            logger.warning("W&B disabled for this run (%s: %s); metrics.jsonl still written", type(exc).__name__, exc)
            self._wandb = None

    @property
    def wandb_run_name(self) -> str | None:
        """The W&B run's name (W&B picks one unless `training.wandb.run_name`); None without W&B."""
        return None if self._wandb is None else self._wandb.name

    def truncate_after(self, step: int) -> None:
        """On resume, drop lines of metrics.jsonl and rollouts.jsonl logged after the checkpoint's
        step, and (with a warning) any line that is not a JSON object with an integer step."""
        for path in (self.path, self.rollouts_path):
            if path.is_file():
                kept = [row for row in read_metrics(path) if row["step"] <= step]
                path.write_text("".join(json.dumps(row) + "\n" for row in kept))

    def log(self, metrics: dict[str, Any]) -> None:
        with self.path.open("a") as f:
            f.write(json.dumps(metrics) + "\n")
        if self._wandb is not None:
            try:
                self._wandb.log({k: v for k, v in metrics.items() if k != "step"}, step=int(metrics["step"]))
            except Exception as exc:  # noqa: BLE001
                logger.warning("W&B log failed (%s); continuing without W&B", exc)
                self._wandb = None

    def log_rollouts(self, records: list[dict[str, Any]]) -> None:
        """Sampled episodes (`grpo.rollout_log.rollout_records`) to rollouts.jsonl and, with W&B on,
        a `rollouts` table (one row per episode, the conversation as text)."""
        if not records:
            return
        with self.rollouts_path.open("a") as f:
            f.writelines(json.dumps(record) + "\n" for record in records)
        if self._wandb is not None:
            try:
                import wandb

                columns = ["step", "task_id", "question", "gold_sql", "final_sql", "solved", "reward", "advantage",
                           "conversation"]
                rows = [[r["step"], r["task_id"], r["question"], r["gold_sql"], r["final_sql"], r["solved"], r["reward"],
                         r["advantage"], "\n\n".join(f"[{m['role']}] {m['content']}" for m in r["messages"])]
                        for r in records]
                self._wandb.log({"rollouts": wandb.Table(columns=columns, data=rows)}, step=int(records[0]["step"]))
            except Exception as exc:  # noqa: BLE001 - logging must never stop training
                logger.warning("W&B rollout table failed (%s); rollouts.jsonl still written", exc)

    def finish(self) -> None:
        if self._wandb is not None:
            try:
                self._wandb.finish()
            except Exception:  # noqa: BLE001
                pass


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """The rows of a metrics.jsonl, skipping (with a warning) lines that are not a JSON object with
    an integer "step": a partial last line left by a kill mid-write, or a damaged one."""
    rows: list[dict[str, Any]] = []
    bad: list[int] = []
    for number, line in enumerate(path.read_text(errors="replace").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError:
            row = None
        if isinstance(row, dict) and isinstance(row.get("step"), int):
            rows.append(row)
        else:
            bad.append(number)
    if bad:
        logger.warning("%s: ignoring %d unreadable line(s) (line %s; a run killed mid-write leaves a partial "
                       "last line)", path, len(bad), ", ".join(map(str, bad[:5])))
    return rows


class NullRunLogger:
    """Stands in for `RunLogger` on ranks other than 0 of a distributed run (one writer per run)."""

    def log(self, metrics: dict[str, Any]) -> None:
        pass

    def log_rollouts(self, records: list[dict[str, Any]]) -> None:
        pass

    def truncate_after(self, step: int) -> None:
        pass

    def finish(self) -> None:
        pass
