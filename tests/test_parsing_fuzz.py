"""`parse_turn` runs in linear time: long, adversarial turns (fences, whitespace runs, tags, braces)
never take more than a bounded CPU time per turn, and the linear helpers give exactly what the
former regexes gave."""

from __future__ import annotations

import re
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from skyrl_tool_agent.env import parsing
from skyrl_tool_agent.env.parsing import MAX_TURN_CHARS, parse_turn

# The regexes the parser used before (references for short inputs only: they are super-linear).
OLD_FENCE_RE = re.compile(r"\A```[A-Za-z0-9_-]*[ \t]*\n?(.*?)\n?[ \t]*```\Z", re.DOTALL)
OLD_TRAILING_SPECIAL_RE = re.compile(r"(?:\s*(?:<\|im_end\|>|<\|endoftext\|>))+\s*\Z")

#: CPU seconds one turn may take. Linear parsing of the longest generated turn (~300k characters)
#: takes a few milliseconds; the old fence regex needed 3.3 s for 2,000 spaces. CPU time of this
#: thread, so a loaded machine does not make the bound flaky.
MAX_CPU_S_PER_TURN = 0.5

FRAGMENTS = [
    "`", "```", "```sql", "```json\n", " ", "\t", "\n", "x", "SELECT 1", "{", "}", '"', ":", "\\",
    "<answer>", "</answer>", "<tool_call>", "</tool_call>", "<think>", "</think>", "<sql>", "</sql>",
    "<solution>", "</solution>", "<|im_end|>", "<|endoftext|>", '{"name": "execute_sql", "arguments": {',
    '"sql": "', "é", "\ud800",
]


def old_strip_fence(body: str) -> str:
    match = OLD_FENCE_RE.match(body)
    return match.group(1).strip() if match else body


def cpu_time_of(fn, *args, **kwargs) -> float:
    start = time.thread_time()
    fn(*args, **kwargs)
    return time.thread_time() - start


short_texts = st.lists(st.sampled_from(FRAGMENTS), max_size=14).map("".join)
# Long turns: fragments repeated up to 20,000 times each (runs of spaces, backticks, tags, braces).
long_texts = st.lists(
    st.tuples(st.sampled_from(FRAGMENTS), st.integers(min_value=1, max_value=20_000)), min_size=1, max_size=6
).map(lambda parts: "".join(fragment * count for fragment, count in parts))


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(short_texts)
def test_linear_helpers_equal_the_former_regexes(text: str) -> None:
    assert parsing._strip_fence(text) == old_strip_fence(text)
    assert parsing._strip_trailing_specials(text) == OLD_TRAILING_SPECIAL_RE.sub("", text)
    for body in (text, f"```{text}```", f"```sql\n{text}\n```"):
        assert parsing._strip_fence(body) == old_strip_fence(body)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(long_texts, st.sampled_from(["<answer>```", "<tool_call>```", "<sql>```", "<solution>```", ""]),
       st.sampled_from(["hermes", "skyrl_sql"]))
def test_long_turns_parse_in_bounded_time(body: str, prefix: str, style: str) -> None:
    for text in (prefix + body, prefix + body + "x</answer>", prefix + body + "```</tool_call>"):
        elapsed = cpu_time_of(parse_turn, text, style=style)
        assert elapsed < MAX_CPU_S_PER_TURN, (len(text), elapsed)


@pytest.mark.parametrize("spaces", [2_000, 5_000, 200_000])
def test_reported_fence_cases_are_fast(spaces: int) -> None:
    """The issue's inputs: 3.3 s (2,000 spaces) and 52 s (5,000) with the old fence regex."""
    texts = [
        "<answer>```" + " " * spaces + "x</answer>",
        "<answer>```" + " " * spaces + "x" + " " * spaces + "```</answer>",
        '<tool_call>```json\n{"name": "list_tables", "arguments": {}}' + " " * spaces + "\n```</tool_call>",
        "<answer>SELECT 1</answer>" + " " * spaces + "x",  # trailing-token regex: quadratic in the old code
        "\n" * spaces,
        "<answer>SELECT 1</answer>" + " <|im_end|>" * (spaces // 11),
    ]
    for text in texts:
        assert cpu_time_of(parse_turn, text) < MAX_CPU_S_PER_TURN, text[:40]
    assert parse_turn("<answer>```" + " " * spaces + "x</answer>").answer == "```" + " " * spaces + "x"
    assert parse_turn("<answer>```sql" + " " * spaces + "SELECT 1\n```</answer>").answer == "SELECT 1"
    tokens = parse_turn("<answer>SELECT 1</answer>" + " <|im_end|>" * (spaces // 11))
    assert tokens.answer == "SELECT 1" and tokens.format_ok


def test_a_turn_of_max_length_is_linear() -> None:
    worst = "<answer>```" + " " * (MAX_TURN_CHARS - 30) + "x</answer>"
    assert len(worst) <= MAX_TURN_CHARS
    assert cpu_time_of(parse_turn, worst) < 2 * MAX_CPU_S_PER_TURN
