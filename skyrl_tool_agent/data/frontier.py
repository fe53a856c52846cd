"""The frontier: pool tasks whose sampled outcomes are mixed at a model's start.

GRPO learns only from groups whose episodes differ in reward. At the shipped start most pool
questions are solved every time or never (about 55% of groups are dropped as uniform), so a
fresh draw of the pool spends most of its rollouts on nothing. `build-model --frontier` samples
`samples` episodes per pool task at the training temperature with the start model, once, and
records the per-task success counts in `frontier.json` beside the model, with the command that
measured them and the sha256 of the weights they were measured on. `train_pool: frontier` then
trains on the tasks with 0 < successes < samples, revisited epoch after epoch, and the adaptive
curriculum fades the ones that become always or never solved.

This module is the file format and its checks (pure JSON); the measurement is
`warmstart.frontier`.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from skyrl_tool_agent.config import UserInputError

FRONTIER_FILE = "frontier.json"
FORMAT = 1


@dataclass
class Frontier:
    """Per-task success counts of `samples` sampled episodes at `temperature`, measured on the
    weights whose sha256 is `model_sha256`."""

    samples: int
    temperature: float
    model_sha256: str
    counts: dict[str, int]
    command: str = ""
    seconds: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    def mixed(self, limit: int | None = None) -> set[str]:
        """Task ids with mixed outcomes (some episodes solved, some not): every group a signal.
        `limit`: the `limit` of them whose pass rate is nearest 1/2 (the largest reward spread in
        a group, so the largest GRPO advantages; ties broken by task id), so that a short run
        revisits each of them."""
        mixed = sorted((tid for tid, c in self.counts.items() if 0 < c < self.samples),
                       key=lambda tid: (abs(self.counts[tid] / self.samples - 0.5), tid))
        return set(mixed if limit is None else mixed[:limit])

    def summary(self) -> dict[str, float]:
        n = len(self.counts)
        return {"tasks": n, "mixed": len(self.mixed()),
                "never": sum(c == 0 for c in self.counts.values()),
                "always": sum(c == self.samples for c in self.counts.values()),
                "pass@1": sum(self.counts.values()) / (n * self.samples) if n else 0.0}

    def write(self, path: Path) -> None:
        record = {"format": FORMAT, **asdict(self), "summary": self.summary()}
        path.write_text(json.dumps(record, indent=1) + "\n")


def read_frontier(path: Path, *, model_sha256: str | None = None) -> Frontier:
    """`frontier.json` at `path`, checked: its counts are integers within [0, samples], and when
    `model_sha256` is given, it was measured on those weights (a frontier of other weights says
    nothing about this start). Every problem is one `UserInputError` line naming the file."""
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        raise UserInputError(f"{path} does not exist: measure it with `skyrl-tool-agent build-model --frontier`") from None
    except (OSError, ValueError) as exc:
        raise UserInputError(f"{path} is not a readable frontier file: {exc}") from None
    try:
        if raw.get("format") != FORMAT:
            raise ValueError(f"format {raw.get('format')!r}, expected {FORMAT}")
        frontier = Frontier(samples=int(raw["samples"]), temperature=float(raw["temperature"]),
                            model_sha256=str(raw["model_sha256"]), counts=dict(raw["counts"]),
                            command=str(raw.get("command", "")), seconds=float(raw.get("seconds", 0.0)),
                            extra=dict(raw.get("extra") or {}))
        if frontier.samples < 2:
            raise ValueError(f"samples {frontier.samples}: a mixed outcome needs at least 2")
        for tid, c in frontier.counts.items():
            if not isinstance(c, int) or isinstance(c, bool) or not 0 <= c <= frontier.samples:
                raise ValueError(f"task {tid!r}: count {c!r} is not an integer in [0, {frontier.samples}]")
    except (AttributeError, KeyError, TypeError, ValueError) as exc:
        raise UserInputError(f"{path}: not a frontier file ({exc})") from None
    if model_sha256 is not None and frontier.model_sha256 != model_sha256:
        raise UserInputError(f"{path} was measured on other weights (sha256 {frontier.model_sha256[:12]}, this model "
                             f"{model_sha256[:12]}): measure it anew with `skyrl-tool-agent build-model --frontier`")
    return frontier
