"""Shared helpers for the benchmark scripts: interleaved repetitions, medians, rich tables, JSON, RSS peaks.

Every benchmark measures A and B in the same process run, interleaved (the order alternates from one
repetition to the next, so a slow drift in machine load hits both sides alike), and reports medians
over repetitions. Results are written as JSON together with a description of the machine.

Import from a script in this directory (`python benchmarks/<script>.py` puts it on sys.path);
`REPO_ROOT` is also put on sys.path so the scripts run without an editable install.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import platform
import resource
import statistics
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))
RESULTS_DIR = REPO_ROOT / "benchmarks" / "results"

import psutil  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

# Piped output (CI logs, `| tee`) gets 120 columns instead of rich's default 80.
console = Console(width=None if sys.stdout.isatty() else 120)


# ----------------------------------------------------------------------------- statistics


@dataclass
class Samples:
    """Repeated measurements of one quantity (seconds, rates, ...)."""

    values: list[float] = field(default_factory=list)

    def add(self, value: float) -> None:
        self.values.append(float(value))

    @property
    def median(self) -> float:
        return statistics.median(self.values) if self.values else float("nan")

    def summary(self) -> dict[str, Any]:
        """median, min, max and the raw values (JSON-friendly)."""
        if not self.values:
            return {"median": None, "min": None, "max": None, "n": 0, "values": []}
        return {
            "median": self.median,
            "min": min(self.values),
            "max": max(self.values),
            "n": len(self.values),
            "values": list(self.values),
        }


def ratio(numerator: float, denominator: float) -> float:
    """numerator / denominator, NaN when the denominator is 0."""
    return numerator / denominator if denominator else float("nan")


def paired_ratios(a: Samples, b: Samples) -> Samples:
    """Per-repetition ratios a_i / b_i: A and B of one repetition ran back to back under the same load,
    so the median of these is steadier than median(a) / median(b)."""
    return Samples([ratio(x, y) for x, y in zip(a.values, b.values)])


def ratio_interval(ratios: Samples, *, resamples: int = 4000, seed: int = 0) -> dict[str, float]:
    """The geometric mean of paired ratios with its 95% bootstrap interval (repetitions resampled):
    for a noisy machine, where one repetition's ratio says little and a median hides the spread."""
    import numpy as np

    logs = np.log(np.asarray(ratios.values, dtype=float))
    rng = np.random.default_rng(seed)
    means = logs[rng.integers(0, len(logs), size=(resamples, len(logs)))].mean(axis=1)
    low, high = np.quantile(means, [0.025, 0.975])
    return {"ratio": float(np.exp(logs.mean())), "low": float(np.exp(low)), "high": float(np.exp(high)), "n": len(logs)}


def interleaved(
    variants: Mapping[str, Callable[[], float]],
    reps: int,
    *,
    warmup: int = 1,
    on_rep: Callable[[int, dict[str, float]], None] | None = None,
) -> dict[str, Samples]:
    """Run each variant `warmup` times untimed, then `reps` times, interleaved.

    A variant is a callable returning the quantity measured in that repetition (usually seconds).
    The order rotates every repetition (A B C, B C A, C A B, ...), so no variant always runs first.
    """
    names = list(variants)
    for _ in range(warmup):
        for name in names:
            variants[name]()
    out = {name: Samples() for name in names}
    for rep in range(reps):
        k = rep % len(names)
        order = names[k:] + names[:k]
        values: dict[str, float] = {}
        for name in order:
            values[name] = variants[name]()
            out[name].add(values[name])
        if on_rep is not None:
            on_rep(rep, values)
    return out


def timed(fn: Callable[[], Any]) -> float:
    """Wall-clock seconds of one call."""
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


# ----------------------------------------------------------------------------- memory


class RssPeak:
    """Peak resident set size of this process while the block runs, sampled with psutil.

    `baseline` is the RSS when the block is entered, `peak` the largest sample (every `interval_s`
    seconds, plus one at entry and exit), `delta = peak - baseline`. `ru_maxrss` is the kernel's
    lifetime peak of the process (it includes everything before the block).
    """

    def __init__(self, interval_s: float = 0.001) -> None:
        self.interval_s = interval_s
        self._proc = psutil.Process()
        self.baseline = 0
        self.peak = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _sample(self) -> None:
        rss = self._proc.memory_info().rss
        if rss > self.peak:
            self.peak = rss

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._sample()

    def __enter__(self) -> RssPeak:
        self.baseline = self._proc.memory_info().rss
        self.peak = self.baseline
        self._thread = threading.Thread(target=self._run, name="rss-peak", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._sample()

    @property
    def delta(self) -> int:
        return self.peak - self.baseline

    @staticmethod
    def ru_maxrss_bytes() -> int:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB

    def as_dict(self) -> dict[str, float]:
        mib = 1024 * 1024
        return {
            "baseline_mib": self.baseline / mib,
            "peak_mib": self.peak / mib,
            "delta_mib": self.delta / mib,
            "ru_maxrss_mib": self.ru_maxrss_bytes() / mib,
        }


# ----------------------------------------------------------------------------- machine and output


def machine_info() -> dict[str, Any]:
    """CPU, cores, memory, load and library versions: what the figures were measured on."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    versions: dict[str, str] = {}
    for module, dist in (("torch", "torch"), ("transformers", "transformers"), ("peft", "peft"), ("trl", "trl"),
                         ("mcp", "mcp"), ("skyrl_gym", "skyrl-gym"), ("sqlglot", "sqlglot")):
        if module in sys.modules:  # only what this benchmark loaded
            try:
                versions[dist] = importlib.metadata.version(dist)
            except importlib.metadata.PackageNotFoundError:
                versions[dist] = "?"
    load1, load5, load15 = os.getloadavg()
    return {
        "cpu": cpu,
        "logical_cores": os.cpu_count(),
        "usable_cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "load_average": [round(load1, 2), round(load5, 2), round(load15, 2)],
        "versions": versions,
    }


def load_note(info: Mapping[str, Any]) -> str:
    """'under load' when the 1-minute load average exceeds half the cores (other work was running)."""
    cores = info.get("usable_cores") or 1
    load1 = info["load_average"][0]
    return f"load average {load1:g} on {cores} cores" + (" (measured under load)" if load1 > cores / 2 else "")


def add_common_args(parser: argparse.ArgumentParser, name: str, *, reps: int, warmup: int = 1) -> None:
    """--reps, --warmup and --json-out (default benchmarks/results/<name>.json; '-' = do not write)."""
    parser.add_argument("--reps", type=int, default=reps, help=f"timed repetitions per variant (default {reps})")
    parser.add_argument("--warmup", type=int, default=warmup, help=f"untimed repetitions first (default {warmup})")
    parser.add_argument(
        "--json-out",
        default=str(RESULTS_DIR / f"{name}.json"),
        help="where the JSON results go ('-' = do not write)",
    )


def write_json(path: str | Path | None, benchmark: str, settings: Mapping[str, Any], results: Mapping[str, Any],
               machine: Mapping[str, Any] | None = None) -> Path | None:
    """Write {benchmark, timestamp, machine, settings, results} to `path` (None or '-' = skip)."""
    if path is None or str(path) == "-":
        return None
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "benchmark": benchmark,
        "timestamp": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": dict(machine or machine_info()),
        "settings": dict(settings),
        "results": dict(results),
    }
    path.write_text(json.dumps(payload, indent=1, default=str) + "\n", encoding="utf-8")
    return path


def print_table(title: str, columns: Sequence[str], rows: Sequence[Sequence[Any]], caption: str | None = None) -> None:
    """A rich table; numeric cells right-aligned."""
    table = Table(title=title, caption=caption)
    for i, col in enumerate(columns):
        table.add_column(col, justify="left" if i == 0 else "right")
    for row in rows:
        table.add_row(*(fmt(v) for v in row))
    console.print(table)


def fmt(value: Any) -> str:
    """Numbers with 3 significant digits (thousands unrounded), everything else via str()."""
    if isinstance(value, float):
        if value != value:  # NaN
            return "-"
        if abs(value) >= 1000:
            return f"{value:,.0f}"
        return f"{value:.3g}"
    return str(value)
