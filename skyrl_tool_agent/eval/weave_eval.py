"""The evaluation as a `weave.Evaluation`: dataset of tasks, the policy as a `weave.Model`, scorers.

With W&B credentials it is traced to Weave; without them the same Evaluation runs with Weave
disabled (nothing traced, no network, no login prompt). Episodes come from an `EpisodeSource` (the
collector, started for all tasks at once) that each `predict` awaits, so the Evaluation costs what
a plain collector run costs and its rows are the episodes the offline report shows.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Protocol

from skyrl_tool_agent.eval.weave_setup import WeaveMode, prepare_weave, weave_mode

# Callers decide the mode first (`prepare_weave`); this default covers a direct import.
prepare_weave(weave_mode())

import weave  # noqa: E402
from pydantic import PrivateAttr  # noqa: E402

from skyrl_tool_agent.data.tasks import Task  # noqa: E402
from skyrl_tool_agent.eval.metrics import is_exact_match  # noqa: E402
from skyrl_tool_agent.rollout.trajectory import Trajectory  # noqa: E402

logger = logging.getLogger(__name__)


class EpisodeSource(Protocol):
    """Where `predict` gets a task's finished episodes from (see `evaluate.EpisodeRunner`)."""

    async def episodes(self, task_id: str) -> list[Trajectory]: ...


@contextlib.contextmanager
def weave_session(project: str, mode: WeaveMode) -> Iterator[WeaveMode]:
    """Run the body with Weave `mode` (disabled: WEAVE_DISABLED=true meanwhile; online:
    `weave.init` once per process, else disabled with one warning); yields the mode in effect."""
    prepare_weave(mode)
    if mode == "online":
        try:
            if weave.get_client() is None:
                weave.init(project)
        except Exception as exc:  # noqa: BLE001 - tracing must never stop an evaluation
            logger.warning("Weave disabled for this evaluation (%s: %s)", type(exc).__name__, exc)
        else:
            yield "online"
            return
    previous = os.environ.get("WEAVE_DISABLED")
    os.environ["WEAVE_DISABLED"] = "true"
    try:
        yield "disabled"
    finally:
        if previous is None:
            os.environ.pop("WEAVE_DISABLED", None)
        else:
            os.environ["WEAVE_DISABLED"] = previous


class PolicyModel(weave.Model):
    """The evaluated policy as a Weave model. Its fields identify it in Weave (policy kind, model
    path, training step, sampling); predictions come from the shared `EpisodeSource`."""

    policy: str
    model_path: str | None = None
    step: int | None = None
    num_samples: int = 1
    temperature: float = 0.0
    _source: Any = PrivateAttr(default=None)

    def bind(self, source: EpisodeSource) -> PolicyModel:
        self._source = source
        return self

    @weave.op
    async def predict(self, task_id: str, db_id: str, question: str) -> dict[str, Any]:
        """The task's episodes (num_samples of them), as the offline report's records have them. A
        failed run is returned as {'error': ...} rather than raised: the runner re-raises it once,
        after the Evaluation."""
        try:
            trajectories = await self._source.episodes(task_id)
        except Exception as exc:  # noqa: BLE001 - see docstring
            return {"error": f"{type(exc).__name__}: {exc}", "samples": []}
        return {"samples": [t.to_record() for t in trajectories]}


def _samples(output: Mapping[str, Any] | None) -> list[Mapping[str, Any]]:
    return list((output or {}).get("samples") or [])


@weave.op
def execution_match(output: dict[str, Any]) -> dict[str, Any]:
    """Execution accuracy of the first sample (greedy: the answer) and the pass rate over samples."""
    samples = _samples(output)
    if not samples:
        return {"correct": False, "pass_rate": 0.0}
    return {"correct": bool(samples[0]["solved"]), "pass_rate": sum(s["solved"] for s in samples) / len(samples)}


@weave.op
def exact_match(output: dict[str, Any], gold_sql: str) -> dict[str, Any]:
    """sqlglot-normalised equality of the first sample's final SQL with the gold query."""
    samples = _samples(output)
    return {"correct": bool(samples) and is_exact_match(samples[0]["final_sql"], gold_sql)}


@weave.op
def turns(output: dict[str, Any]) -> dict[str, Any]:
    """Turns, tool calls and tool errors of the first sample."""
    samples = _samples(output)
    if not samples:
        return {"turns": 0, "tool_calls": 0, "tool_errors": 0}
    s = samples[0]
    return {"turns": s["turns"], "tool_calls": s["tool_calls"], "tool_errors": s["tool_errors"]}


@weave.op
def solved(output: dict[str, Any]) -> dict[str, Any]:
    """A family other than SQL: whether the first sample's answer was right (its verifier), and the pass rate."""
    return execution_match(output)


SCORERS = [execution_match, exact_match, turns]
#: The scorers of a task family other than SQL (no SQL words, `eval.vocabulary`).
FAMILY_SCORERS = [solved, turns]


def object_name(text: str) -> str:
    """`text` as a Weave object name (letters, digits, `-`, `_`, `.`)."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-") or "eval"


async def run_weave_evaluation(
    tasks: Sequence[Task], source: EpisodeSource, model: PolicyModel, *, name: str, sql: bool = True
) -> dict[str, Any]:
    """Run the `weave.Evaluation` named `name` of `model` over `tasks`; returns Weave's summary
    (per scorer: `correct` true_fraction, means of the numbers; `model_latency`)."""
    name = object_name(name)
    # The rows are the task records; their gold SQL is for the scorers only.
    dataset = weave.Dataset(name=f"{name}-tasks", rows=[t.model_dump(mode="json") for t in tasks])
    evaluation = weave.Evaluation(name=name, dataset=dataset, scorers=SCORERS if sql else FAMILY_SCORERS,
                                 evaluation_name=name)
    return await evaluation.evaluate(model.bind(source))
