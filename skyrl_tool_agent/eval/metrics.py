"""Episode metrics shared by training logs, the warm start and `evaluate.py`."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from functools import lru_cache
from math import prod
from statistics import mean
from typing import Any, TypeVar

from skyrl_tool_agent.rewards.partial import exact_match
from skyrl_tool_agent.rollout.trajectory import Trajectory


#: The figures a training run reports for each evaluation (metrics.jsonl `eval/<key>`, the
#: before/after table, the model card).
HEADLINE_KEYS: tuple[str, ...] = ("execution_accuracy", "reward_mean", "format_ok_rate")


#: What every rate is over: the episodes scored and those lost to infrastructure (never scored).
COVERAGE_KEYS: tuple[str, ...] = ("scored", "infra_errors")


def eval_metrics(summary: Mapping[str, Any]) -> dict[str, float | None]:
    """An evaluation's headline figures as metrics.jsonl keys (`eval/...`): rates, `scored`,
    `infra_errors`, `avg@k`/`pass@k` when sampled, `errors/<category>` with the anatomy."""
    out = {f"eval/{key}": summary.get(key) for key in (*HEADLINE_KEYS, *COVERAGE_KEYS)}
    for category, rate in ((summary.get("error_anatomy") or {}).get("rates") or {}).items():
        out[f"eval/errors/{category}"] = rate
    sampled = summary.get("sampled")
    if sampled:
        out[f"eval/avg@{sampled['k']}"] = sampled["avg@k"]
        out[f"eval/pass@{sampled['k']}"] = sampled["pass@k"]
    return out


def sampled_record(trajectories: Sequence[Trajectory], k: int, temperature: float) -> dict[str, Any]:
    """`k` sampled episodes per task (task, sample order) as avg@k (mean fraction solved) and pass@k
    (fraction solved at least once), with `per_task` fractions over scored samples (None: none)."""
    if len(trajectories) % k:
        raise ValueError(f"{len(trajectories)} episodes are not {k} per task")
    per_task: list[float | None] = []
    any_solved: list[int] = []
    for i in range(0, len(trajectories), k):
        outcomes = [o for o in (solved_outcome(t) for t in trajectories[i:i + k]) if o is not None]
        per_task.append(mean(outcomes) if outcomes else None)
        if outcomes:
            any_solved.append(int(any(outcomes)))
    scored = [f for f in per_task if f is not None]
    return {"k": k, "temperature": temperature, "avg@k": mean(scored) if scored else None,
            "pass@k": mean(any_solved) if any_solved else None, "per_task": per_task}


def format_rate(value: float | None, summary: Mapping[str, Any] | None = None, digits: int = 3) -> str:
    """`0.250`, or `unscored` for None; with `summary`, the coverage beside it:
    `0.250 (4 scored, 0 infra errors)`."""
    text = "unscored" if value is None else f"{value:.{digits}f}"
    if summary is not None and "scored" in summary:
        text += f" ({summary['scored']:.0f} scored, {summary.get('infra_errors', 0):.0f} infra errors)"
    return text


def evaluation_record(trajectories: Sequence[Trajectory]) -> dict[str, Any]:
    """`summarize` plus `solved`: 1/0 per episode in order (None: never scored), for paired
    intervals between two evaluations of the same tasks."""
    return {**summarize(trajectories), "solved": [solved_outcome(tr) for tr in trajectories]}


def solved_outcome(trajectory: Trajectory) -> int | None:
    """1 solved, 0 not, None never scored (infrastructure error): unscored is never "wrong"."""
    return None if trajectory.result.done_reason == "error" else int(trajectory.result.solved)


def summarize(trajectories: Sequence[Trajectory]) -> dict[str, float | None]:
    """Execution accuracy, reward, format/validity rates, turns and tool use over episodes
    (`valid_sql_rate` with the `syntax` term). Infrastructure failures (`done_reason == "error"`)
    were never scored: they are left out of every rate (all None when nothing was scored, never a
    misleading 0.0) and counted: `n` all episodes, `scored` the rest, `infra_errors`/`_rate` them.
    """
    everything = [t.result for t in trajectories]
    if not everything:
        return {"n": 0.0}
    results = [r for r in everything if r.done_reason != "error"]
    infra = len(everything) - len(results)

    def rate(values: Iterable[float]) -> float | None:
        values = list(values)
        return mean(values) if values else (None if not results else 0.0)

    out = {
        "n": float(len(everything)),
        "scored": float(len(results)),
        "execution_accuracy": rate(float(r.solved) for r in results),
        "reward_mean": rate(r.reward for r in results),
        "format_ok_rate": rate(float(r.format_errors == 0 and r.final_sql is not None) for r in results),
        "answered_rate": rate(float(r.final_sql is not None) for r in results),
        "mean_turns": rate(r.turns for r in results),
        "mean_tool_calls": rate(r.tool_calls for r in results),
        "tool_error_rate": (sum(r.tool_errors for r in results) / max(1, sum(r.tool_calls for r in results))
                            if results else None),
        "infra_errors": float(infra),
        "infra_error_rate": infra / len(everything),
    }
    if any("syntax" in r.components for r in results):  # the syntax term's verdict, when the reward has it
        out["valid_sql_rate"] = rate(float(r.components.get("syntax", 0.0) >= 1.0) for r in results)
    return out


def reward_term_means(trajectories: Sequence[Trajectory]) -> dict[str, float]:
    """The mean of each reward term (`EpisodeResult.components`) over the scored episodes, by
    name in the reward's order (train metrics `reward/<name>`, evaluation `reward_terms`)."""
    values: dict[str, list[float]] = {}
    for t in trajectories:
        if t.result.done_reason != "error":
            for name, value in t.result.components.items():
                values.setdefault(name, []).append(value)
    return {name: mean(v) for name, v in values.items()}


T = TypeVar("T")


def group_by(items: Iterable[T], key: Callable[[T], Any]) -> dict[Any, list[T]]:
    groups: dict[Any, list[T]] = defaultdict(list)
    for item in items:
        groups[key(item)].append(item)
    return dict(groups)


# ------------------------------------------------------------------ evaluation (evaluate.py)
# Cached: the same (prediction, gold) pair is scored overall, per difficulty and per database.
_exact = lru_cache(maxsize=65536)(exact_match)


def is_exact_match(pred_sql: str | None, gold_sql: str) -> bool:
    """sqlglot-normalised SQL equality (`rewards.exact_match`); no answer is never a match."""
    return pred_sql is not None and _exact(pred_sql, gold_sql)


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from `n` samples of which `c` are correct (Chen et al. 2021, eq. 1):
    1 - C(n-c, k) / C(n, k), computed as a stable product."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"need 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def pass_at_k_levels(num_samples: int) -> list[int]:
    """The k reported for `num_samples` samples per question: 1, 2, 5, 10, 20, 50, 100... and n itself."""
    ks = [k for base in (1, 10, 100, 1000) for k in (base, 2 * base, 5 * base) if k < num_samples]
    return sorted({*ks, num_samples})


def evaluation_metrics(
    trajectories: Sequence[Trajectory], gold_sql: Mapping[str, str], num_samples: int = 1
) -> dict[str, Any]:
    """`summarize` plus exact match and each reward term's mean, `n` counting questions, and pass@k
    when `num_samples` > 1; sample-level rates average over all episodes (pass@1 estimates)."""
    if not trajectories:
        return {"n": 0, "episodes": 0}
    out: dict[str, Any] = summarize(trajectories)
    out["reward_terms"] = reward_term_means(trajectories)
    out["episodes"] = len(trajectories)
    groups = group_by(trajectories, lambda t: t.task_id)
    out["n"] = len(groups)
    scored = [t for t in trajectories if t.result.done_reason != "error"]
    out["exact_match"] = (mean(float(is_exact_match(t.result.final_sql, gold_sql[t.task_id])) for t in scored)
                          if scored else None)
    if num_samples > 1:
        counts = [(len(g), sum(t.result.solved for t in g))
                  for g in ([t for t in g if t.result.done_reason != "error"] for g in groups.values()) if g]
        out["pass_at_k"] = {
            str(k): mean(v) if (v := [pass_at_k(n, c, k) for n, c in counts if n >= k]) else None
            for k in pass_at_k_levels(num_samples)
        }
    return out


def evaluation_breakdown(
    trajectories: Sequence[Trajectory],
    gold_sql: Mapping[str, str],
    key: Callable[[Trajectory], str],
    num_samples: int = 1,
) -> dict[str, dict[str, Any]]:
    """`evaluation_metrics` per group (e.g. per difficulty or per database), groups sorted by name."""
    groups = group_by(trajectories, key)
    return {name: evaluation_metrics(groups[name], gold_sql, num_samples) for name in sorted(groups)}
