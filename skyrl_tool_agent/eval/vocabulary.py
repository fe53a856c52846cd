"""The words an evaluation's outputs use, by task family: SQL words only for SQL.

Another family reports `accuracy` against each task's ground truth, with no SQL-only metric.
results.json names its `family` and `headline`; readers take their words from `vocabulary_of`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["SQL_WORDS", "Vocabulary", "localise", "vocabulary", "vocabulary_of"]

#: Metrics only SQL has (exact match of the query text, the syntax term's verdict).
SQL_ONLY = ("exact_match", "valid_sql_rate")


@dataclass(frozen=True)
class Vocabulary:
    family: str
    accuracy: str  # the headline key of results.json (and of each by_difficulty / by_db entry)
    accuracy_label: str  # "execution accuracy"
    short: str  # the table's column ("EX")
    truth_key: str  # the per-question record's key for the reference ("gold_sql")

    @property
    def sql(self) -> bool:
        return self.family == "sql"


SQL_WORDS = Vocabulary("sql", "execution_accuracy", "execution accuracy", "EX", "gold_sql")


def vocabulary(family: str) -> Vocabulary:
    """The words of task family `family` (its `TaskFamily.name`)."""
    if family == "sql":
        return SQL_WORDS
    return Vocabulary(family, "accuracy", "accuracy", "acc", "ground_truth")


def vocabulary_of(results: Mapping[str, Any]) -> Vocabulary:
    """The words of an evaluation's results.json (SQL for one written before families were named)."""
    return vocabulary(str(results.get("family") or "sql"))


def localise(metrics: dict[str, Any], words: Vocabulary) -> dict[str, Any]:
    """`metrics` (`eval.metrics` keys, SQL words) in `words`: for a family other than SQL,
    execution_accuracy becomes `words.accuracy` and the SQL-only metrics go; in place, returned."""
    if words.sql:
        return metrics
    if "execution_accuracy" in metrics:
        metrics[words.accuracy] = metrics.pop("execution_accuracy")
    for key in SQL_ONLY:
        metrics.pop(key, None)
    return metrics
