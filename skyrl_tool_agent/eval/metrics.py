"""Episode metrics shared by training logs, the warm start and `evaluate.py`."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from statistics import mean

from skyrl_tool_agent.rollout.trajectory import Trajectory


def summarize(trajectories: Sequence[Trajectory]) -> dict[str, float]:
    """Execution accuracy, reward, format/validity rates, turns and tool use over episodes."""
    results = [t.result for t in trajectories]
    if not results:
        return {"n": 0.0}
    return {
        "n": float(len(results)),
        "execution_accuracy": mean(float(r.solved) for r in results),
        "reward_mean": mean(r.reward for r in results),
        "format_ok_rate": mean(float(r.format_errors == 0 and r.final_sql is not None) for r in results),
        "valid_sql_rate": mean(float(r.components.get("syntax", 0.0) >= 1.0) for r in results),
        "answered_rate": mean(float(r.final_sql is not None) for r in results),
        "mean_turns": mean(r.turns for r in results),
        "mean_tool_calls": mean(r.tool_calls for r in results),
        "tool_error_rate": sum(r.tool_errors for r in results) / max(1, sum(r.tool_calls for r in results)),
        "infra_error_rate": mean(float(r.done_reason == "error") for r in results),
    }


def group_by(trajectories: Iterable[Trajectory], key) -> dict[str, list[Trajectory]]:
    groups: dict[str, list[Trajectory]] = defaultdict(list)
    for t in trajectories:
        groups[key(t)].append(t)
    return dict(groups)
