"""The episode reward: named, weighted terms (`terms`) combined by one formula.

Modelled on verifiers' ``Rubric`` (reward functions with weights, each logged as its own metric).
With terms i of weight w_i and value v_i::

    total = clamp( sum_i  w_i * v_i * counts_i  /  N,  0, 1 )
    counts_i = 0 if term i is only_when_wrong and the answer is correct, else 1
    N = sum of w_i over the terms a perfect episode earns: w_i > 0 and not only_when_wrong

so a perfect episode (every earning term at 1, no penalty) scores exactly 1.0. An episode without
an answer scores 0.0 whatever its terms say (they are still reported). Negative weights are
penalties: a perfect episode does not incur them and they are not in N, so a weight of -0.05 on a
count costs 0.05 / N per unit. Weight 0 = reported, not counted. With the default terms (execution
1, format 0.1, syntax 0.05, partial 0.2; N = 1.15) a wrong answer scores at most
(0.1 + 0.05 + 0.2) / 1.15 ~= 0.30 (close > far > unparseable > malformed) and a correct answer in a
malformed episode (1 + 0.05) / 1.15 ~= 0.91.

Rules (`Rubric` refuses anything else, one line, when the run builds its reward): names unique and
not `mean`/`std`, weights finite, built-in weights >= 0, N > 0, and the only_when_wrong terms'
positive weights sum to at most the weight of the term that decides correctness, so a near miss
never outscores a correct answer. Correctness is decided once per episode, before the terms run.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from skyrl_tool_agent.config.env import RewardTermConfig
from skyrl_tool_agent.rewards.execution import compare_execution
from skyrl_tool_agent.rewards.gold_cache import GoldResultCache
from skyrl_tool_agent.rewards.limits import DEFAULT_TIMEOUT_S
from skyrl_tool_agent.rewards.terms import (
    BUILTIN_TERMS,
    DEFAULT_TERMS,
    Episode,
    TermFn,
    is_only_when_wrong,
    resolve_term,
)

__all__ = ["RESERVED_NAMES", "RewardBreakdown", "Rubric", "Term", "score_answer"]

#: Names a term cannot take: the train metrics' `reward/mean` and `reward/std`.
RESERVED_NAMES = frozenset({"mean", "std"})


@dataclass(frozen=True)
class Term:
    """One weighted term of the reward."""

    name: str
    weight: float
    fn: TermFn = field(repr=False)

    @property
    def only_when_wrong(self) -> bool:
        return is_only_when_wrong(self.fn)


@dataclass(frozen=True)
class RewardBreakdown:
    """The reward of one episode: its total and each term's value."""

    total: float
    terms: dict[str, float]
    solved: bool = False  # the answer returns the gold result (whatever the terms)
    pred_error: str | None = None  # why the answer failed to run, if it did


class Rubric:
    """Weighted reward terms and the one formula that combines them (module docstring)."""

    def __init__(self, terms: Sequence[Term], *, verdict_term: str | None = None) -> None:
        self.terms: tuple[Term, ...] = tuple(terms)
        #: The term whose value 1 means solved (a non-SQL task family's verifier); None = SQL's
        #: execution comparison decides.
        self.verdict_term = verdict_term
        self._check()

    @classmethod
    def from_specs(cls, specs: Iterable[RewardTermConfig], *, verdict_term: str | None = None) -> Rubric:
        """Terms from config entries (`env.reward.terms`): a built-in by name, or a user's `function` (imported here).
        Raises ValueError (one line): a term that cannot be resolved is named by its place in the
        list, ``term 1 (name): ...``; a broken rule as the rule says it."""
        terms = []
        for index, spec in enumerate(specs):
            try:
                terms.append(Term(spec.name, spec.weight, resolve_term(spec.name, spec.function)))
            except ValueError as exc:
                raise ValueError(f"term {index} ({spec.name}): {exc}") from None
        return cls(terms, verdict_term=verdict_term)

    @classmethod
    def default(cls) -> Rubric:
        return cls([Term(name, weight, BUILTIN_TERMS[name]) for name, weight in DEFAULT_TERMS])

    @property
    def normaliser(self) -> float:
        """N: the weighted sum of a perfect episode; totals are divided by it (perfect -> 1.0)."""
        return sum(t.weight for t in self.terms if t.weight > 0 and not t.only_when_wrong)

    def _check(self) -> None:
        """The rules (module docstring); raises ValueError (one line) at the first one broken."""
        names = [t.name for t in self.terms]
        if not names:
            raise ValueError("the reward needs at least one term")
        for term in self.terms:
            if names.count(term.name) > 1:
                raise ValueError(f"term '{term.name}' is listed twice")
            if term.name in RESERVED_NAMES:
                raise ValueError(f"term name '{term.name}' is reserved (reward/{term.name} is a train metric)")
            weight = term.weight
            if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(weight):
                raise ValueError(f"term '{term.name}': weight must be a finite number, got {weight!r}")
            if weight < 0 and term.fn is BUILTIN_TERMS.get(term.name):
                raise ValueError(f"term '{term.name}': a built-in term's weight must be >= 0, got {weight:g} "
                                 "(penalties are terms of your own)")
        if self.normaliser <= 0:
            raise ValueError("the terms a perfect episode earns (weight > 0, not only_when_wrong) weigh 0 in all: a "
                             "perfect episode would score 0/0")
        deciding = self.verdict_term or "execution"
        if self.verdict_term is not None and self.verdict_term not in names:
            raise ValueError(f"the task family decides correctness by its term '{self.verdict_term}': the reward's "
                             f"terms ({', '.join(names)}) must list it")
        gated = [t for t in self.terms if t.only_when_wrong and t.weight > 0]
        weight = sum(t.weight for t in self.terms if t.name == deciding)
        if sum(t.weight for t in gated) > weight:
            listed = " + ".join(f"{t.name} {t.weight:g}" for t in gated)
            raise ValueError(f"only_when_wrong terms ({listed}) must not outweigh {deciding} ({weight:g}): a near "
                             "miss would then outscore a correct answer")

    def combine(self, values: Mapping[str, float], *, answered: bool, correct: bool) -> float:
        """The reward from each term's value: the formula of the module docstring, the one place it is written."""
        if not answered:
            return 0.0
        raw = sum(t.weight * values[t.name] for t in self.terms if not (t.only_when_wrong and correct))
        return min(1.0, max(0.0, raw / self.normaliser))

    def score(self, episode: Episode, *, cache: GoldResultCache | None = None, timeout_s: float = DEFAULT_TIMEOUT_S,
              keep_distinct: bool = True) -> RewardBreakdown:
        """Run the answer against the gold query once (``execution.compare_execution``), then every
        term on the result; with a `verdict_term` (another task family) that term decides and no
        SQL runs. Raises ``execution.GoldQueryError`` / ``DatabaseUnavailableError``: infrastructure
        faults are never scored.
        """
        if episode.answered and self.verdict_term is not None:
            verdict = next(t for t in self.terms if t.name == self.verdict_term)
            episode = replace(episode, verdict=_term_value(verdict, episode))
        elif episode.answered:
            if episode.db_path is None:
                raise ValueError("the SQL execution comparison needs the episode's db_path")
            comparison = compare_execution(episode.answer or "", episode.ground_truth, episode.db_path,
                                           timeout_s=timeout_s, cache=cache, keep_distinct=keep_distinct)
            episode = replace(episode, comparison=comparison)
        values = {term.name: episode.verdict if term.name == self.verdict_term and episode.verdict is not None
                  else _term_value(term, episode) for term in self.terms}
        comparison = episode.comparison
        return RewardBreakdown(
            total=self.combine(values, answered=episode.answered, correct=episode.correct),
            terms=values,
            solved=episode.correct,
            pred_error=comparison.pred_error if comparison is not None else None,
        )

    def describe(self) -> str:
        """The reward in words, e.g. for a model card: '(1 x execution + ...) / 1.15'."""
        parts = [f"{t.weight:g} x {t.name}" + (" (only when the answer is wrong)" if t.only_when_wrong else "")
                 for t in self.terms]
        return f"({' + '.join(parts)}) / {self.normaliser:g}, clamped to [0, 1]"


def _term_value(term: Term, episode: Episode) -> float:
    value = term.fn(episode)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"term '{term.name}' returned {value!r}, not a finite number")
    return float(value)


def score_answer(
    answer_sql: str | None,
    gold_sql: str,
    db_path: str | Path,
    *,
    format_ok: bool,
    rubric: Rubric | None = None,
    cache: GoldResultCache | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> RewardBreakdown:
    """Score a final answer alone (no turn counts or conversation) with `rubric` (default terms):
    `Rubric.score` on an `Episode` of just the answer."""
    episode = Episode(answer=answer_sql, ground_truth=gold_sql, db_path=Path(db_path), format_ok=format_ok)
    return (rubric or Rubric.default()).score(episode, cache=cache, timeout_s=timeout_s)
