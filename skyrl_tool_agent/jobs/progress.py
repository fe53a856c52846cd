"""What the commands and jobs show while they run: logging setup, progress lines and bars.
(Config flags are `skyrl_tool_agent.config.add_config_args` / `config_from_args`.)"""

from __future__ import annotations

import contextlib
import logging
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

logger = logging.getLogger(__name__)


#: Width rich renders to when the output is not a terminal (a log file): wide enough that a path
#: or a table row is one line (rich's default there is 80 columns, and it wraps hard).
LOG_COLUMNS = 240


def setup_logging(level: int = logging.INFO) -> None:
    """Rich log lines on a terminal; in a log file (stdout, where rich logs, not a terminal) plain
    one-line records (`[12:00:01] INFO message`, never wrapped), and rich's tables and lines
    printed LOG_COLUMNS wide."""
    import os

    if sys.stdout.isatty():
        from rich.logging import RichHandler

        handler: logging.Handler = RichHandler(show_path=False, rich_tracebacks=False)
        handler.setFormatter(logging.Formatter("%(message)s", datefmt="[%X]"))
    else:
        handler = logging.StreamHandler(sys.stdout)
        handler.setFormatter(logging.Formatter("[%(asctime)s] %(levelname)s %(message)s", datefmt="%H:%M:%S"))
        os.environ.setdefault("COLUMNS", str(LOG_COLUMNS))  # read by each rich Console made from here on
    logging.basicConfig(level=level, handlers=[handler])
    for noisy in ("httpx", "mcp", "urllib3", "transformers", "peft", "wandb", "asyncio"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    quiet_library_noise()


def quiet_library_noise() -> None:
    """Silence what libraries print on every run that says nothing to the user (explained here once):

    - peft asks transformers `is_gradient_checkpointing`, deprecated in transformers 5 (a FutureWarning
      per model load, about peft's code, not the user's);
    - transformers draws "Loading weights" / "Writing model shards" bars at every load and checkpoint;
      in a log file (not a terminal) they are carriage-return noise, so there they are off (on a
      terminal they stay, download bars included);
    - DeepSpeed, imported by transformers' save path where it is installed, warns "Setting accelerator
      to CPU" at every checkpoint on a machine without a GPU: true, and expected here.
    """
    import warnings

    warnings.filterwarnings("ignore", message=r"`is_gradient_checkpointing` is deprecated", category=FutureWarning)
    if not sys.stderr.isatty():
        if "transformers" in sys.modules:  # its switch was read from huggingface_hub's at its import
            from transformers.utils import logging as hf_logging

            hf_logging.disable_progress_bar()
        else:  # read when transformers is imported; importing it here (~1 CPU-s) would tax every
            # command that never loads a model (an oracle or endpoint `eval`)
            from huggingface_hub.utils import disable_progress_bars

            disable_progress_bars()
    logging.getLogger("DeepSpeed").setLevel(logging.ERROR)


#: Seconds between progress lines when the output is not a terminal (a log file, CI, nohup).
LOG_PROGRESS_EVERY_S = 30.0


def log_every(seconds: float = LOG_PROGRESS_EVERY_S) -> Callable[[], bool]:
    """A clock for throttled progress lines: each call says whether `seconds` have passed since
    the last call that said yes (the first yes comes `seconds` after creation)."""
    last = [time.monotonic()]

    def due() -> bool:
        now = time.monotonic()
        if now - last[0] < seconds:
            return False
        last[0] = now
        return True

    return due


#: Seconds between evaluation progress lines in a log file.
EVAL_PROGRESS_EVERY_S = 10.0


class ProgressLines:
    """Progress of `total` items as log lines, for output that is not a terminal (a rich bar is
    invisible there): `what done/total (pct), elapsed, ETA` every `every_s` seconds and at the end."""

    def __init__(self, what: str, total: int, every_s: float = EVAL_PROGRESS_EVERY_S) -> None:
        self.what, self.total, self.done = what, total, 0
        self.started = time.monotonic()
        self._due = log_every(every_s)

    def advance(self, n: int = 1, info: str = "") -> None:
        self.done += n
        if not (self._due() or self.done >= self.total):
            return
        elapsed = time.monotonic() - self.started
        eta = elapsed / self.done * (self.total - self.done) if self.done else float("nan")
        logger.info("%s %d/%d (%.0f%%), %.0f s elapsed, ETA %.0f s%s", self.what, self.done, self.total,
                    100 * self.done / max(1, self.total), elapsed, eta, f"  {info}" if info else "")


@contextlib.contextmanager
def evaluation_progress(what: str, total: int, accuracy_short: str) -> Iterator[Callable[[Any], None]]:
    """A rich bar over an evaluation's `total` episodes with the running solved rate; the yielded
    callback takes each finished trajectory (the collector's `on_episode`). In a log file the bar
    is invisible: `ProgressLines` instead."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  TextColumn("ETA"), TimeRemainingColumn(), TextColumn("{task.fields[info]}"),
                  refresh_per_second=4) as bar:
        job = bar.add_task(what, total=total, info="")
        solved = [0, 0]
        lines = None if bar.console.is_terminal else ProgressLines(what, total)

        def on_episode(traj: Any) -> None:
            solved[0] += traj.result.solved
            solved[1] += 1
            info = f"{accuracy_short} {solved[0] / solved[1]:.3f}"
            bar.update(job, advance=1, info=info)
            if lines is not None:
                lines.advance(info=info)

        yield on_episode


@contextlib.contextmanager
def training_progress(total_steps: int, time_budget_s: float | None = None, *,
                      eval_split: str = "dev", accuracy_short: str = "EX") -> Iterator[Any]:
    """A rich progress bar; the yielded callback takes ('step', metrics), ('grpo_budget', seconds),
    ('eval', (done, total)) or (phase text, fraction). With a time budget the bar fills by whichever
    ends training first, steps or minutes. In a log file (no bar) the same is logged instead."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    columns = [TextColumn("[bold]{task.description}"), BarColumn(), TextColumn("{task.fields[done]}"),
               TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(), TextColumn("{task.fields[info]}")]
    with Progress(*columns, refresh_per_second=2) as bar:
        build = bar.add_task("build", total=1.0, info="", done="", visible=False)
        evaluation = bar.add_task("evaluation", total=1.0, info="", done="", visible=False)
        eval_lines: list[ProgressLines] = []
        train = bar.add_task("GRPO", total=1.0, info="", done=f"0/{total_steps}")
        last = [time.monotonic()]
        started = time.monotonic()
        to_log = not bar.console.is_terminal
        log_due = log_every()
        budget = [time_budget_s]

        def update(kind: str, value: Any) -> None:
            from skyrl_tool_agent.eval.metrics import format_rate

            time_budget_s = budget[0]
            if kind == "grpo_budget":
                budget[0] = value if time_budget_s is None else min(time_budget_s, value)
            elif kind == "eval":  # (episodes done, total) of an evaluation
                done_n, total_n = value
                bar.update(evaluation, visible=done_n < total_n, completed=done_n / max(1, total_n),
                           done=f"{done_n}/{total_n}")
                if to_log:
                    if done_n == 1 or not eval_lines:
                        eval_lines[:] = [ProgressLines("evaluation", total_n)]
                    eval_lines[0].advance()
            elif kind == "step":
                m = value
                info = (f"reward {format_rate(m['reward/mean'])}  train {accuracy_short} {format_rate(m['train/execution_accuracy'], digits=2)}"
                        + (f" ({m['train/infra_errors']:.0f} infra errors)" if m.get("train/infra_errors") else ""))
                if "eval/execution_accuracy" in m:
                    info += f"  {eval_split} {accuracy_short} {format_rate(m['eval/execution_accuracy'])}"
                    if m.get("eval/infra_errors"):
                        info += f" ({m['eval/scored']:.0f} scored, {m['eval/infra_errors']:.0f} infra errors)"
                done = f"step {m['step']}/{total_steps}"
                fraction = m["step"] / total_steps
                if time_budget_s is not None and "time/elapsed_s" in m:
                    done += f", {m['time/elapsed_s'] / 60:.1f}/{time_budget_s / 60:.1f} min"
                    # a main job whose evaluations took the whole budget leaves GRPO 0 s (one step runs)
                    fraction = max(fraction, m["time/elapsed_s"] / time_budget_s if time_budget_s > 0 else 1.0)
                bar.update(train, completed=min(fraction, 1.0), done=done, info=info)
                if to_log:
                    logger.info("GRPO %s  %s  (%.0f s)", done, info, time.monotonic() - started)
            else:
                now = time.monotonic()
                if now - last[0] > 0.5 or value >= 1.0:
                    bar.update(build, visible=True, description=f"embedded model: {kind}", completed=value)
                    last[0] = now
                if to_log and (log_due() or value >= 1.0):
                    logger.info("embedded model: %s %.0f%%  (%.0f s)", kind, 100 * value, now - started)

        yield update
