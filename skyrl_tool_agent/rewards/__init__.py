"""Rewards for text-to-SQL episodes: execution match, format, syntax and partial credit.

`score_answer` combines them (see `scoring`); `execution_match` / `results_match` implement Spider
execution-accuracy semantics (see `execution`); `partial_credit`, `exact_match`, `sql_is_valid`
and `sql_components` are database-free structural measures (see `partial`).
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
from skyrl_tool_agent.rewards.partial import exact_match, partial_credit, sql_components, sql_is_valid
from skyrl_tool_agent.rewards.scoring import RewardBreakdown, RewardWeights, score_answer

__all__ = [
    "DatabaseUnavailableError",
    "ExecutionComparison",
    "GoldQueryError",
    "GoldResultCache",
    "RewardBreakdown",
    "RewardWeights",
    "compare_execution",
    "exact_match",
    "execution_match",
    "gold_order_matters",
    "partial_credit",
    "results_match",
    "score_answer",
    "sql_components",
    "sql_is_valid",
]
