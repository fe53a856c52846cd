"""Tool-call parsing: the Hermes and SkyRL-SQL formats, model-facing errors, and a fuzz test."""

from __future__ import annotations

import json
import random
import time
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from skyrl_tool_agent.env.parsing import (
    MAX_TURN_CHARS,
    ParsedTurn,
    ToolCall,
    format_tool_response,
    parse_turn,
)

TOOLS: dict[str, dict[str, Any]] = {
    "execute_sql": {
        "type": "object",
        "properties": {"db_id": {"type": "string"}, "sql": {"type": "string"}},
        "required": ["db_id", "sql"],
    },
    "list_tables": {
        "type": "object",
        "properties": {"db_id": {"type": "string"}},
        "required": ["db_id"],
    },
    "sample_rows": {
        "type": "object",
        "properties": {
            "db_id": {"type": "string"},
            "table": {"type": "string"},
            "limit": {"anyOf": [{"type": "integer"}, {"type": "null"}]},
            "order": {"type": "string", "enum": ["asc", "desc"]},
        },
        "required": ["db_id", "table"],
    },
    "free_form": {"type": "object", "properties": {}, "additionalProperties": True},
}


def call(name: str, **arguments: Any) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


# --------------------------------------------------------------------------- valid turns


def test_single_call_in_qwen_format() -> None:
    turn = parse_turn(call("execute_sql", db_id="library", sql="SELECT count(*) FROM book"), TOOLS)
    assert turn == ParsedTurn(
        (ToolCall("execute_sql", {"db_id": "library", "sql": "SELECT count(*) FROM book"}),), None, ()
    )
    assert turn.format_ok


def test_several_calls_with_thinking_and_prose_and_no_newlines() -> None:
    text = (
        "<think>I should look at the schema first. <answer>not this</answer></think>\n"
        "Let me check the tables.\n"
        '<tool_call>{"name":"list_tables","arguments":{"db_id":"library"}}</tool_call>'
        + call("sample_rows", db_id="library", table="book", limit=3, order="desc")
        + "<|im_end|>"
    )
    turn = parse_turn(text, TOOLS)
    assert turn.errors == ()
    assert [c.name for c in turn.tool_calls] == ["list_tables", "sample_rows"]
    assert turn.tool_calls[1].arguments == {"db_id": "library", "table": "book", "limit": 3, "order": "desc"}


def test_final_answer() -> None:
    turn = parse_turn("The answer is:\n<answer>\n  SELECT name FROM author;\n</answer>\n", TOOLS)
    assert turn.answer == "SELECT name FROM author;" and turn.tool_calls == () and turn.format_ok
    fenced = parse_turn("<answer>\n```sql\nSELECT 1\n```\n</answer>", TOOLS)
    assert fenced.answer == "SELECT 1" and fenced.format_ok


def test_close_tag_inside_a_json_string_does_not_cut_the_call() -> None:
    sql = "SELECT '</tool_call>' AS tag"
    turn = parse_turn(call("execute_sql", db_id="d", sql=sql), TOOLS)
    assert turn.format_ok and turn.tool_calls[0].arguments["sql"] == sql


def test_json_in_a_code_fence_is_accepted() -> None:
    text = '<tool_call>\n```json\n{"name": "list_tables", "arguments": {"db_id": "x"}}\n```\n</tool_call>'
    assert parse_turn(text, TOOLS).tool_calls == (ToolCall("list_tables", {"db_id": "x"}),)


def test_without_tools_nothing_is_validated() -> None:
    turn = parse_turn(call("anything", x=[1, {"y": None}]))
    assert turn.format_ok and turn.tool_calls == (ToolCall("anything", {"x": [1, {"y": None}]}),)


def test_additional_properties_true_allows_extra_arguments() -> None:
    assert parse_turn(call("free_form", anything=1), TOOLS).format_ok


# ------------------------------------------------------------------------- malformed turns


def only_error(text: str, **kwargs: Any) -> str:
    turn = parse_turn(text, TOOLS, **kwargs)
    assert not turn.format_ok
    assert len(turn.errors) == 1, turn.errors
    return turn.errors[0]


def test_invalid_json_says_where_and_how_to_fix() -> None:
    error = only_error('<tool_call>\n{"name": "execute_sql" "arguments": {}}\n</tool_call>')
    assert error.startswith("tool_call 1: invalid JSON (Expecting ',' delimiter at char 23)")
    assert error.endswith('write {"name": ..., "arguments": {...}}')


def test_second_call_errors_are_numbered_and_valid_calls_kept() -> None:
    turn = parse_turn(call("list_tables", db_id="a") + "<tool_call>{oops}</tool_call>", TOOLS)
    assert turn.tool_calls == (ToolCall("list_tables", {"db_id": "a"}),)
    assert len(turn.errors) == 1 and turn.errors[0].startswith("tool_call 2: invalid JSON")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (call("drop_table", db_id="x"), "unknown tool 'drop_table'; valid tools: execute_sql, free_form, list_tables"),
        (call("execute_sql", db_id="x"), "missing required argument(s): sql"),
        (call("list_tables", db_id="x", verbose=True), "unexpected argument(s): verbose; allowed: db_id"),
        (call("list_tables", db_id=3), "argument 'db_id' of tool 'list_tables' must be string, got integer"),
        (call("sample_rows", db_id="x", table="t", limit="5"), "must be integer or null, got string"),
        (call("sample_rows", db_id="x", table="t", limit=True), "must be integer or null, got boolean"),
        (call("sample_rows", db_id="x", table="t", order="up"), 'must be one of "asc", "desc"'),
        ('<tool_call>{"name": "list_tables", "arguments": "{\\"db_id\\": 1}"}</tool_call>',
         '"arguments" must be a JSON object, got string'),
        ('<tool_call>["list_tables"]</tool_call>', "expected a JSON object, got array"),
        ('<tool_call>{"arguments": {}}</tool_call>', 'missing "name"'),
        ('<tool_call>{"name": "list_tables", "arguments": {}, "id": 1}</tool_call>', "unexpected key(s) id"),
        ("<tool_call>\n</tool_call>", "empty tool call"),
        ('<tool_call>{"name": "list_tables", "arguments": {"db_id": "x"}}', "<tool_call> is not closed"),
        ("<tool_call><tool_call>" + call("list_tables", db_id="x")[11:], "is not closed before the next"),
        ("I think the answer is 42.", "no tool call or final answer found"),
        ("", "no tool call or final answer found"),
        ("<answer>SELECT 1", "<answer> is not closed"),
        ("<answer>  </answer>", "empty final answer"),
        ("<answer>SELECT 1</answer> Hope this helps!", "text after </answer> (Hope this helps!)"),
        ("<answer>SELECT 1</answer><answer>SELECT 2</answer>", "more than one final answer (2)"),
        (call("list_tables", db_id="x") + "<answer>SELECT 1</answer>", "either tool calls or a final answer"),
        ("<think>never closed " + call("list_tables", db_id="x"), "<think> is not closed"),
        ('<tool_call>{"name": "list_tables", "arguments": {"db_id": "\\ud800"}}</tool_call>', "invalid unicode"),
        ("<tool_call>" + "[" * 100_000 + "</tool_call>", "invalid JSON"),
    ],
)
def test_malformed_turns_explain_the_problem(text: str, expected: str) -> None:
    assert expected in only_error(text)


def test_stray_closing_tag_and_missing_call() -> None:
    turn = parse_turn("</tool_call>", TOOLS)
    assert turn.errors == (
        "</tool_call> without a matching opening tag",
        "no tool call or final answer found: call a tool with <tool_call>...</tool_call> "
        "or finish with <answer>SQL</answer>",
    )


def test_too_many_calls_keeps_the_first_ones() -> None:
    text = "".join(call("list_tables", db_id=str(i)) for i in range(5))
    turn = parse_turn(text, TOOLS, max_calls=3)
    assert [c.arguments["db_id"] for c in turn.tool_calls] == ["0", "1", "2"]
    assert turn.errors == ("too many tool calls (5 > 3); make at most 3 per turn",)


def test_huge_and_odd_inputs_do_not_raise() -> None:
    assert "turn too long" in parse_turn("x" * (MAX_TURN_CHARS + 1)).errors[0]
    assert not parse_turn(None).format_ok  # type: ignore[arg-type]
    many = parse_turn("<tool_call>{}</tool_call>" * 50, TOOLS, max_calls=50)
    assert len(many.errors) == 10 and many.errors[-1] == "... and 41 more errors"
    snippet = parse_turn("<answer>x</answer>" + "\x00\ud800" * 100, TOOLS).errors[0]
    snippet.encode("utf-8")  # error messages are always valid UTF-8
    assert len(snippet) < 200


def test_unknown_style_is_a_programming_error() -> None:
    with pytest.raises(ValueError, match="unknown style"):
        parse_turn("x", style="json")  # type: ignore[arg-type]


# ----------------------------------------------------------------------------- SkyRL-SQL


def test_skyrl_sql_style() -> None:
    text = "<think>check counts</think>\n<sql>SELECT count(*) FROM book</sql>"
    turn = parse_turn(text, TOOLS, style="skyrl_sql", db_id="library")
    assert turn.tool_calls == (ToolCall("execute_sql", {"sql": "SELECT count(*) FROM book", "db_id": "library"}),)
    done = parse_turn("<think>ok</think><solution>SELECT 1</solution>", TOOLS, style="skyrl_sql", db_id="x")
    assert done.answer == "SELECT 1" and done.format_ok
    assert "no SQL call or final solution found" in only_error("just text", style="skyrl_sql", db_id="x")
    assert "empty SQL" in only_error("<sql> </sql>", style="skyrl_sql", db_id="x")
    assert "<sql> is not closed" in only_error("<sql>SELECT 1", style="skyrl_sql", db_id="x")
    # the Hermes tags mean nothing in this style, and vice versa
    assert not parse_turn(call("list_tables", db_id="x"), TOOLS, style="skyrl_sql").format_ok
    assert not parse_turn("<sql>SELECT 1</sql>", TOOLS).format_ok
    # validated against the schema like any call: execute_sql needs db_id
    assert "missing required argument(s): db_id" in only_error("<sql>SELECT 1</sql>", style="skyrl_sql")


# ------------------------------------------------------------------------- tool responses


def test_format_tool_response_matches_qwen_template() -> None:
    assert format_tool_response("3 rows") == "<tool_response>\n3 rows\n</tool_response>"
    both = format_tool_response(["a", "b"])
    assert both == "<tool_response>\na\n</tool_response>\n<tool_response>\nb\n</tool_response>"


# ----------------------------------------------------------------------------- properties

_json_scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20)
_json_values = st.recursive(
    _json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)


@settings(max_examples=200, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    name=st.text(min_size=1, max_size=20).filter(lambda s: s.strip() == s and s.strip() != ""),
    arguments=st.dictionaries(st.text(max_size=10), _json_values, max_size=5),
    compact=st.booleans(),
    ensure_ascii=st.booleans(),
    prose=st.text(max_size=30).filter(lambda s: "<" not in s),
)
def test_valid_call_round_trips(
    name: str, arguments: dict[str, Any], compact: bool, ensure_ascii: bool, prose: str
) -> None:
    payload = {"name": name, "arguments": arguments}
    try:
        body = json.dumps(payload, ensure_ascii=ensure_ascii, separators=(",", ":") if compact else None)
        body.encode("utf-8")
    except UnicodeEncodeError:  # lone surrogates: the parser rejects these on purpose
        return
    sep = "" if compact else "\n"
    turn = parse_turn(f"{prose}<tool_call>{sep}{body}{sep}</tool_call>")
    assert turn.errors == ()
    assert turn.tool_calls == (ToolCall(name, arguments),)


# ---------------------------------------------------------------------------------- fuzz

_SEED_TURNS = [
    call("execute_sql", db_id="library", sql="SELECT name FROM author WHERE id = 3"),
    call("list_tables", db_id="library") + call("sample_rows", db_id="library", table="book", limit=2),
    "<think>hmm</think>" + call("execute_sql", db_id="x", sql="SELECT '<answer>' FROM t"),
    "<answer>SELECT count(*) FROM book</answer>",
    "Final:\n<answer>\nSELECT a, b FROM t ORDER BY a DESC LIMIT 1;\n</answer>",
    '<tool_call>{"name":"list_tables","arguments":{"db_id":"a"}}</tool_call>',
    "<sql>SELECT 1</sql>",
    "<solution>SELECT 2</solution>",
]
_FRAGMENTS = [
    "<tool_call>", "</tool_call>", "<answer>", "</answer>", "<think>", "</think>", "<sql>", "</sql>",
    "<solution>", "</solution>", "{", "}", "[", "]", '"', ":", ",", "\\", "\\u", "\\ud800", '"name"',
    '"arguments"', "null", "true", "1e999", "-0", "NaN", "\x00", "\ud800", "\udfff", "😀", "\u202e", "\n",
    "```json", "```", "<|im_end|>", '{"name": "execute_sql", "arguments": {"sql": ',
]


def _mutate(rng: random.Random, text: str) -> str:
    for _ in range(rng.randint(1, 4)):
        op = rng.randrange(8)
        pos = rng.randint(0, len(text))
        if op == 0 and text:  # delete a span
            text = text[:pos] + text[pos + rng.randint(1, 8):]
        elif op == 1:  # insert a fragment
            text = text[:pos] + rng.choice(_FRAGMENTS) + text[pos:]
        elif op == 2 and len(text) > 1:  # swap two characters
            i, j = rng.randrange(len(text)), rng.randrange(len(text))
            chars = list(text)
            chars[i], chars[j] = chars[j], chars[i]
            text = "".join(chars)
        elif op == 3:  # truncate
            text = text[:pos]
        elif op == 4:  # duplicate a tag or a span
            text = text[:pos] + text[pos: pos + rng.randint(1, 40)] * rng.randint(2, 3) + text[pos:]
        elif op == 5:  # random unicode (any code point, surrogates included)
            text = text[:pos] + "".join(chr(rng.randrange(0x110000)) for _ in range(rng.randint(1, 5))) + text[pos:]
        elif op == 6:  # replace a character
            if text:
                i = rng.randrange(len(text))
                text = text[:i] + chr(rng.randrange(0x80)) + text[i + 1:]
        else:  # splice with another seed
            other = rng.choice(_SEED_TURNS)
            text = text[:pos] + other[rng.randint(0, len(other)):]
    return text


def test_fuzz_parse_turn_never_raises() -> None:
    rng = random.Random(20240917)
    n = 100_000
    seen_ok = seen_errors = 0
    start = time.monotonic()
    for i in range(n):
        if i % 10 == 0:  # pure noise from fragments
            text = "".join(rng.choice(_FRAGMENTS) for _ in range(rng.randint(0, 12)))
        else:
            text = _mutate(rng, rng.choice(_SEED_TURNS))
        style = "skyrl_sql" if i % 4 == 0 else "hermes"
        turn = parse_turn(text, TOOLS if i % 2 else None, style=style, db_id="x")
        assert isinstance(turn, ParsedTurn)
        assert turn.format_ok == (not turn.errors and (bool(turn.tool_calls) or turn.answer is not None))
        assert len(turn.errors) <= 10
        if turn.format_ok:
            seen_ok += 1
        else:
            seen_errors += 1
            assert all(isinstance(e, str) and e for e in turn.errors)
    elapsed = time.monotonic() - start
    assert seen_ok > 5_000 and seen_errors > 50_000  # both outcomes are exercised
    assert elapsed < 30, f"fuzzing {n} turns took {elapsed:.1f} s"


def test_fuzz_error_messages_are_utf8_safe_and_short() -> None:
    rng = random.Random(5)
    for _ in range(3_000):
        text = _mutate(rng, rng.choice(_SEED_TURNS)) + chr(0xD800 + rng.randrange(0x800))
        for error in parse_turn(text, TOOLS).errors:
            error.encode("utf-8")  # quoted model text never makes a message unencodable
            assert len(error) < 400
