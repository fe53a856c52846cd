"""Episode reward: execution match plus small format/syntax terms and partial credit for misses.

Components (each in [0, 1]):

* ``execution`` -- 1 if the final answer returns the gold result (``execution.execution_match``);
* ``format`` -- 1 if the episode was well-formed: every turn parsed without error and there is
  exactly one final answer (the caller knows the turns; it passes ``format_ok``). Always 0 without
  an answer;
* ``syntax`` -- 1 if the answer is a valid query: sqlglot parses it as one query, or SQLite ran
  it (SQLite is the final authority where sqlglot's grammar falls short);
* ``partial`` -- structural similarity to the gold query (``partial.partial_credit``). Always
  reported; it only *counts* when ``execution`` is 0, so a correct answer never earns less than
  a near miss.

Total, with weights w (``RewardWeights``)::

    total = (w.execution * execution + w.format * format + w.syntax * syntax
             + w.partial * partial * (1 - execution)) / (w.execution + w.format + w.syntax)

so a perfect episode scores exactly 1.0, no answer scores 0.0, and with the default weights a
wrong answer scores at most (0.1 + 0.05 + 0.2) / 1.15 ~= 0.30 (close > far > unparseable >
malformed), while a correct answer in a malformed episode scores (1 + 0.05) / 1.15 ~= 0.91.
``RewardWeights`` requires ``partial <= execution`` so that a correct answer always beats a
wrong one at equal format.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

from skyrl_tool_agent.config.env import check_reward_weights
from skyrl_tool_agent.rewards.execution import compare_execution
from skyrl_tool_agent.rewards.gold_cache import GoldResultCache
from skyrl_tool_agent.rewards.partial import partial_credit, sql_is_valid

__all__ = ["RewardBreakdown", "RewardWeights", "score_answer"]


@dataclass(frozen=True)
class RewardWeights:
    """Weights of the reward components (see the module docstring for how they combine)."""

    execution: float = 1.0
    format: float = 0.1
    syntax: float = 0.05
    partial: float = 0.2

    def __post_init__(self) -> None:
        check_reward_weights(self.execution, self.format, self.syntax, self.partial)

    @property
    def normaliser(self) -> float:
        """The weighted sum of a perfect episode; totals are divided by it (perfect -> 1.0)."""
        return self.execution + self.format + self.syntax


@dataclass(frozen=True)
class RewardBreakdown:
    """The reward of one episode and its components (all in [0, 1])."""

    total: float
    execution: float
    format: float
    syntax: float
    partial: float  # structural overlap with gold; 1.0 when the answer executes correctly (not computed)
    pred_error: str | None = None  # why the answer failed to run, if it did

    def as_dict(self) -> dict[str, float]:
        """The numeric fields, for logging/metrics."""
        return {k: v for k, v in asdict(self).items() if k != "pred_error"}


def score_answer(
    answer_sql: str | None,
    gold_sql: str,
    db_path: str | Path,
    *,
    format_ok: bool,
    weights: RewardWeights | None = None,
    cache: GoldResultCache | None = None,
    timeout_s: float = 5.0,
    keep_distinct: bool = True,
) -> RewardBreakdown:
    """Score an episode's final answer against the gold query on ``db_path``.

    ``answer_sql`` None (or blank) means the episode ended without an answer: every component is
    0. ``keep_distinct`` False deletes DISTINCT from both queries before comparing (the official
    Spider default; ``execution.compare_execution``). Raises ``execution.GoldQueryError`` if the
    gold query itself fails, and its subclass ``execution.DatabaseUnavailableError`` if the database
    cannot be read: infrastructure faults are never scored. Both queries run under ``limits`` (the
    tool server's limits, a process-wide SQLite heap cap and a wall-clock bound): this runs in the
    trainer's own process.
    """
    weights = weights or RewardWeights()
    if answer_sql is None or not answer_sql.strip():
        return RewardBreakdown(0.0, 0.0, 0.0, 0.0, 0.0)
    outcome = compare_execution(answer_sql, gold_sql, db_path, timeout_s=timeout_s, cache=cache,
                                keep_distinct=keep_distinct)
    execution = 1.0 if outcome.match else 0.0
    form = 1.0 if format_ok else 0.0
    ran = outcome.pred_error_kind is None
    syntax = 1.0 if ran or sql_is_valid(answer_sql) else 0.0
    # A correct answer gets full partial credit without the two sqlglot parses (the term is
    # multiplied by 1 - execution anyway); this is the hot path of rollouts.
    partial = 1.0 if execution else partial_credit(answer_sql, gold_sql)
    total = (
        weights.execution * execution
        + weights.format * form
        + weights.syntax * syntax
        + weights.partial * partial * (1.0 - execution)
    ) / weights.normaliser
    return RewardBreakdown(
        total=min(1.0, max(0.0, total)),
        execution=execution,
        format=form,
        syntax=syntax,
        partial=partial,
        pred_error=outcome.pred_error,
    )
