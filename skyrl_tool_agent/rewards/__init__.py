"""Rewards for text-to-SQL episodes: named, weighted terms of a finished episode.

`Rubric` combines the terms (see `rubric`; the built-in terms and your own: `terms`);
`execution_match` / `results_match` implement Spider execution-accuracy semantics (see
`execution`); `partial_credit`, `literal_match`, `exact_match`, `sql_is_valid` and `sql_components` are
database-free structural measures (see `partial`).
"""

from skyrl_tool_agent.rewards.execution import (
    DatabaseUnavailableError,
    ExecutionComparison,
    GoldQueryError,
    compare_execution,
    execution_match,
    gold_order_matters,
    results_match,
)
from skyrl_tool_agent.rewards.gold_cache import GoldResultCache
from skyrl_tool_agent.rewards.partial import exact_match, literal_match, partial_credit, sql_components, sql_is_valid
from skyrl_tool_agent.rewards.rubric import RewardBreakdown, Rubric, Term, score_answer
from skyrl_tool_agent.rewards.terms import Episode, reward_term

__all__ = [
    "DatabaseUnavailableError",
    "Episode",
    "ExecutionComparison",
    "GoldQueryError",
    "GoldResultCache",
    "RewardBreakdown",
    "Rubric",
    "Term",
    "compare_execution",
    "exact_match",
    "execution_match",
    "gold_order_matters",
    "literal_match",
    "partial_credit",
    "results_match",
    "reward_term",
    "score_answer",
    "sql_components",
    "sql_is_valid",
]
