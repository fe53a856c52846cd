"""Reward terms: functions of a finished episode. The built-in ones, and loading your own.

A term is a function ``(episode: Episode) -> float``. The built-in terms (each in [0, 1]):

* ``execution`` -- 1 if the final answer returns the gold query's result (Spider semantics,
  ``execution.compare_execution``);
* ``format`` -- 1 if the episode was well-formed: every turn parsed without error and there is
  exactly one final answer;
* ``syntax`` -- 1 if the answer is a valid query: sqlglot parses it as one query, or SQLite ran
  it (SQLite is the final authority where sqlglot's grammar falls short);
* ``partial`` -- structural similarity to the gold query (``partial.partial_credit``); declared
  ``only_when_wrong``: it counts only when the answer is wrong, so a correct answer never earns
  less than a near miss. A correct answer reports 1.0 without computing it (the hot path);
* ``literals`` -- the F1 of the answer's literals against the gold query's
  (``partial.literal_match``): the constants the question states, written as stated. Declared
  ``only_when_wrong`` like ``partial``; not in the default reward.

Another task family's verifier is a term of its own, its ``verdict_term`` (1 = solved). Every
built-in term is 0 without an answer. Your own term is any function of an `Episode`
(`load_term_function`); ``@reward_term(only_when_wrong=True)`` gates it like ``partial``.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from skyrl_tool_agent.config.env import DEFAULT_TERMS
from skyrl_tool_agent.config.user_code import load_module
from skyrl_tool_agent.rewards.execution import ExecutionComparison
from skyrl_tool_agent.rewards.partial import literal_match, partial_credit, sql_is_valid

__all__ = ["BUILTIN_TERMS", "DEFAULT_TERMS", "Episode", "TermFn", "is_only_when_wrong", "load_term_function",
           "resolve_term", "reward_term"]

TermFnT = TypeVar("TermFnT", bound=Callable[..., Any])


def reward_term(*, only_when_wrong: bool = False) -> Callable[[TermFnT], TermFnT]:
    """Declare how a term counts: ``only_when_wrong`` terms are reported for every episode but
    count in the reward only when the answer is wrong (as ``partial``)."""

    def mark(fn: TermFnT) -> TermFnT:
        setattr(fn, "only_when_wrong", only_when_wrong)  # noqa: B010 - an attribute on a function
        return fn

    return mark


def is_only_when_wrong(fn: Callable[..., Any]) -> bool:
    return bool(getattr(fn, "only_when_wrong", False))


@dataclass(frozen=True)
class Episode:
    """A finished episode, as its reward terms see it.

    `comparison` is the answer's execution comparison with the gold query: run once per episode
    by the rubric and shared by every term (None without an answer). For other task families,
    `verdict` is their verifier term's value, likewise computed once (None for SQL)."""

    answer: str | None  # the final answer (SQL for the SQL family); None when the episode ended without one
    ground_truth: str  # the task's reference: the gold SQL, or another family's expected answer
    db_path: Path | None  # the task's database (SQL family); None for families without one
    format_ok: bool  # every turn parsed and there is exactly one final answer
    turns: int = 0
    tool_calls: int = 0
    tool_errors: int = 0  # tool calls whose result was an error
    format_errors: int = 0  # turns that did not parse
    messages: Sequence[Mapping[str, Any]] = ()  # the conversation, system prompt first
    comparison: ExecutionComparison | None = None
    verdict: float | None = None

    @property
    def gold_sql(self) -> str:
        """The SQL family's name for `ground_truth` (terms written for SQL read it)."""
        return self.ground_truth

    @property
    def answered(self) -> bool:
        """Whether there is a non-blank answer (a blank one scores like none)."""
        return self.answer is not None and bool(self.answer.strip())

    @property
    def correct(self) -> bool:
        """Whether the answer returns the gold result (SQL), or the family's verifier gave it 1."""
        if self.verdict is not None:
            return self.verdict >= 1.0
        return self.comparison is not None and self.comparison.match


TermFn = Callable[[Episode], float]


def _execution(episode: Episode) -> float:
    return 1.0 if episode.correct else 0.0


def _format(episode: Episode) -> float:
    return 1.0 if episode.answered and episode.format_ok else 0.0


def _syntax(episode: Episode) -> float:
    if not episode.answered:
        return 0.0
    ran = episode.comparison is not None and episode.comparison.pred_error_kind is None
    return 1.0 if ran or sql_is_valid(episode.answer or "") else 0.0


@reward_term(only_when_wrong=True)
def _partial(episode: Episode) -> float:
    if not episode.answered:
        return 0.0
    # A correct answer does not count this term: skip the two sqlglot parses.
    return 1.0 if episode.correct else partial_credit(episode.answer or "", episode.gold_sql)


@reward_term(only_when_wrong=True)
def _literals(episode: Episode) -> float:
    if not episode.answered:
        return 0.0
    return 1.0 if episode.correct else literal_match(episode.answer or "", episode.gold_sql)


#: The built-in terms by name (module docstring): the one list of their names and of which count
#: only when the answer is wrong (``partial``, by its decorator).
BUILTIN_TERMS: dict[str, TermFn] = {"execution": _execution, "format": _format, "syntax": _syntax, "partial": _partial,
                                   "literals": _literals}


def load_term_function(target: str) -> TermFn:
    """The function named by ``package.module:function`` or ``path/to/file.py:function``; ValueError
    (one line) if it cannot be found or does not take one argument. Runs the user's module, so it
    is called when the reward is built, never when a config loads."""
    where, sep, attr = target.rpartition(":")
    if not sep or not where or not attr.isidentifier():
        raise ValueError(f"function '{target}': expected 'module:function' or 'path/to/file.py:function'")
    if where.endswith(".py") and not (path := Path(where).expanduser().resolve()).is_file():
        raise ValueError(f"function '{target}': no file {path}")
    try:
        module = load_module(where)
    except Exception as exc:  # noqa: BLE001 - any failure in the user's module is a config error
        raise ValueError(f"function '{target}': cannot import {where} ({type(exc).__name__}: {exc})") from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise ValueError(f"function '{target}': {where} has no function '{attr}'")
    try:
        inspect.signature(fn).bind(None)
    except TypeError:
        raise ValueError(f"function '{target}': must take one argument, the episode "
                         "(skyrl_tool_agent.rewards.terms.Episode)") from None
    except ValueError:  # no signature (some builtins): let the call decide
        pass
    return fn


def resolve_term(name: str, function: str | None) -> TermFn:
    """The function of a configured term: the built-in `name` when `function` is None, else the
    user's `function` (`load_term_function`). Raises ValueError (one line) for an unknown name or a
    user term named like a built-in."""
    if function is None:
        if name not in BUILTIN_TERMS:
            raise ValueError(f"unknown reward term '{name}': the built-in terms are {', '.join(BUILTIN_TERMS)}; "
                             "a term of your own needs function: 'module:function'")
        return BUILTIN_TERMS[name]
    if name in BUILTIN_TERMS:
        raise ValueError(f"'{name}' is a built-in term: give your own term another name")
    return load_term_function(function)
