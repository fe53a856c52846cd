"""Parse one assistant turn into tool calls or a final answer, and format tool responses.

Two turn styles (README, Turns): ``"hermes"`` (``<tool_call>{json}</tool_call>`` blocks, or
``<answer>...</answer>``) and ``"skyrl_sql"`` (``<sql>...</sql>`` becomes an ``execute_sql`` call,
``<solution>...</solution>`` the answer). A turn holds calls or an answer, not both; ``<think>``
blocks are ignored, free text around calls is allowed, only whitespace may follow the answer, a
trailing ``<|im_end|>`` is ignored, and markdown fences are tolerated (small models add them).

:func:`parse_turn` never raises on a ``str``: every problem is an entry of ``ParsedTurn.errors``
written for the model (what is wrong and how to write it instead). Valid calls are kept even when
a sibling call is invalid; the environment decides whether to run them.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from skyrl_tool_agent.env.chat_format import ANSWER_CLOSE, ANSWER_OPEN, TOOL_CALL_CLOSE, TOOL_CALL_OPEN
from skyrl_tool_agent.env.tool_args import json_type_name, snippet, validate_arguments

__all__ = [
    "MAX_TURN_CHARS",
    "ParsedTurn",
    "ToolCall",
    "format_tool_response",
    "parse_turn",
]

Style = Literal["hermes", "skyrl_sql"]

#: Turns longer than this are rejected without parsing (a runaway generation, not a tool call).
MAX_TURN_CHARS = 1_000_000
#: At most this many errors are reported per turn; the rest are summarised in one line.
MAX_ERRORS = 10

_CALL_HINT = 'write {"name": ..., "arguments": {...}}'
#: Decoded special tokens a turn may end with (left when special tokens are decoded).
_TRAILING_SPECIALS = ("<|im_end|>", "<|endoftext|>")
# Matched on the *reversed* text, anchored and possessive: linear time (a forward `re.sub` is
# quadratic on long whitespace).
_TRAILING_SPECIALS_REVERSED_RE = re.compile(
    r"\s*+(?:(?:" + "|".join(re.escape(t[::-1]) for t in _TRAILING_SPECIALS) + r")\s*+)++"
)
_FENCE = "```"
_FENCE_LANG_RE = re.compile(r"[A-Za-z0-9_-]*+")
_JSON_DECODER = json.JSONDecoder()


@dataclass(frozen=True)
class ToolCall:
    """One requested tool invocation: the tool's name and its (JSON object) arguments."""

    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class ParsedTurn:
    """What one assistant turn asked for.

    ``tool_calls`` are the calls that parsed and validated (in order); ``answer`` is the stripped
    SQL of the final answer, if any; ``errors`` are messages for the model, one per problem.
    """

    tool_calls: tuple[ToolCall, ...]
    answer: str | None
    errors: tuple[str, ...]

    @property
    def format_ok(self) -> bool:
        """True when the turn is well-formed: no errors, and at least one call or an answer."""
        return not self.errors and (bool(self.tool_calls) or self.answer is not None)


@dataclass(frozen=True)
class _StyleSpec:
    call_open: str
    call_close: str
    answer_open: str
    answer_close: str
    call_word: str  # how errors name one call, e.g. "tool_call 2"
    missing_hint: str  # the message when a turn has neither a call nor an answer; {answer} = the answer's kind


_STYLES: dict[str, _StyleSpec] = {
    "hermes": _StyleSpec(  # the tags the prompt teaches (`chat_format`), spelled there only
        TOOL_CALL_OPEN,
        TOOL_CALL_CLOSE,
        ANSWER_OPEN,
        ANSWER_CLOSE,
        "tool_call",
        f"no tool call or final answer found: call a tool with {TOOL_CALL_OPEN}...{TOOL_CALL_CLOSE} "
        f"or finish with {ANSWER_OPEN}{{answer}}{ANSWER_CLOSE}",
    ),
    "skyrl_sql": _StyleSpec(
        "<sql>",
        "</sql>",
        "<solution>",
        "</solution>",
        "sql",
        "no SQL call or final solution found: run SQL with <sql>...</sql> "
        "or finish with <solution>{answer}</solution>",
    ),
}
_STYLE_TAG_RE: dict[str, re.Pattern[str]] = {
    name: re.compile(
        "|".join(
            re.escape(t)
            for t in (s.call_open, s.call_close, s.answer_open, s.answer_close, "<think>", "</think>")
        )
    )
    for name, s in _STYLES.items()
}


def _strip_trailing_specials(text: str) -> str:
    """``text`` without trailing ``<|im_end|>`` / ``<|endoftext|>`` tokens and the whitespace
    around them (unchanged when it does not end with one); linear time."""
    if not text.rstrip().endswith(_TRAILING_SPECIALS):
        return text
    match = _TRAILING_SPECIALS_REVERSED_RE.match(text[::-1])
    return text[: len(text) - match.end()] if match else text


def _strip_fence(body: str) -> str:
    """Remove one surrounding markdown code fence (```json ... ```) and its info string, if
    present; no regex (one took cubic time on a fence followed by long whitespace)."""
    if len(body) < 2 * len(_FENCE) or not body.startswith(_FENCE) or not body.endswith(_FENCE):
        return body
    lang = _FENCE_LANG_RE.match(body, len(_FENCE))  # always matches; never reaches the closing backticks
    lang_end = lang.end() if lang else len(_FENCE)
    return body[lang_end : len(body) - len(_FENCE)].strip()


def _decode_call_json(text: str, start: int, close_tag: str) -> tuple[Any, int] | None:
    """(value, index after the close tag) when the JSON value at ``start`` is directly followed by
    the close tag, else None; the decoder finds the end, so arguments may contain the close tag."""
    try:
        value, end = _JSON_DECODER.raw_decode(text, start)
    except (ValueError, RecursionError):
        return None
    while end < len(text) and text[end].isspace():
        end += 1
    if text.startswith(close_tag, end):
        return value, end + len(close_tag)
    return None


def _call_from_json(body: str, where: str) -> tuple[ToolCall | None, str | None]:
    """Turn the text between the call tags into a ToolCall, or explain what is wrong."""
    body = _strip_fence(body.strip())
    if not body:
        return None, f"{where}: empty tool call; {_CALL_HINT}"
    try:
        value = json.loads(body)
    except json.JSONDecodeError as exc:
        return None, f"{where}: invalid JSON ({exc.msg} at char {exc.pos}); {_CALL_HINT}"
    except (ValueError, RecursionError):  # e.g. absurdly deep nesting
        return None, f"{where}: invalid JSON (too deeply nested); {_CALL_HINT}"
    return _call_from_value(value, where)


def _call_from_value(value: Any, where: str) -> tuple[ToolCall | None, str | None]:
    if not isinstance(value, dict):
        return None, f"{where}: expected a JSON object, got {json_type_name(value)}; {_CALL_HINT}"
    name = value.get("name")
    if not isinstance(name, str) or not name.strip():
        return None, f'{where}: missing "name" (a string); {_CALL_HINT}'
    extra = [k for k in value if k not in ("name", "arguments")]
    if extra:
        shown = ", ".join(snippet(k, 30) for k in extra[:5])
        return None, f"{where}: unexpected key(s) {shown}; {_CALL_HINT}"
    arguments = value.get("arguments", {})
    if not isinstance(arguments, dict):
        return None, (
            f'{where}: "arguments" must be a JSON object, got {json_type_name(arguments)}; '
            f"{_CALL_HINT}"
        )
    try:  # downstream JSON-RPC encodes UTF-8; a lone surrogate would break it there
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except (UnicodeEncodeError, ValueError, RecursionError):
        return None, f"{where}: arguments contain invalid unicode or nesting; {_CALL_HINT}"
    return ToolCall(name=name.strip(), arguments=arguments), None


def parse_turn(
    text: str,
    tools: Mapping[str, Mapping[str, Any]] | None = None,
    *,
    style: Style = "hermes",
    db_id: str | None = None,
    max_calls: int = 8,
    answer_hint: str = "SQL",
) -> ParsedTurn:
    """Parse one assistant turn (module docstring); never raises for a ``str``.

    `tools`: tool name -> its arguments' JSON schema (MCP ``inputSchema``), to validate calls
    (None: no validation). `db_id`: in the ``skyrl_sql`` style, each ``<sql>`` call's ``db_id``.
    `max_calls`: more is an error (the first are kept). `answer_hint`: what the answer holds, as
    error messages name it (``SQL``, ``NUMBER``, ...).
    """
    spec = _STYLES.get(style)
    if spec is None:
        raise ValueError(f"unknown style {style!r}; expected one of {sorted(_STYLES)}")
    if not isinstance(text, str):
        return ParsedTurn((), None, (f"turn must be text, got {type(text).__name__}",))
    if len(text) > MAX_TURN_CHARS:
        return ParsedTurn(
            (), None, (f"turn too long ({len(text)} characters > {MAX_TURN_CHARS}); be brief",)
        )
    text = _strip_trailing_specials(text)

    errors: list[str] = []
    calls: list[ToolCall] = []
    answers: list[str] = []
    n_calls = 0
    answer_end: int | None = None  # where the first </answer> ends
    opened = False  # saw an opening call/answer tag (closed or not)
    tag_re = _STYLE_TAG_RE[style]
    pos = 0
    while True:
        match = tag_re.search(text, pos)
        if match is None:
            break
        tag = match.group()
        if tag == "<think>":
            close = text.find("</think>", match.end())
            if close < 0:
                errors.append("<think> is not closed; close it with </think> before acting")
                opened = True  # the fix is to close the tag; "no tool call found" would mislead
                break
            pos = close + len("</think>")
        elif tag == "</think>":
            pos = match.end()  # the opening tag may live in the prompt (Qwen3-style templates)
        elif tag == spec.call_open:
            opened = True
            n_calls += 1
            where = f"{spec.call_word} {n_calls}"
            next_pos, call, problem = _scan_call(
                text, match.end(), spec, where, style, db_id, parse_body=n_calls <= max_calls
            )
            if problem is not None:
                errors.append(problem)
            elif call is not None:
                invalid = validate_arguments(call.name, call.arguments, tools, where) if tools is not None else []
                errors.extend(invalid)
                if not invalid:
                    calls.append(call)
            if next_pos < 0:
                break
            pos = next_pos
        elif tag == spec.answer_open:
            opened = True
            close = text.find(spec.answer_close, match.end())
            if close < 0:
                errors.append(
                    f"{spec.answer_open} is not closed; write {spec.answer_open}{answer_hint}{spec.answer_close}"
                )
                break
            answers.append(_strip_fence(text[match.end() : close].strip()))
            pos = close + len(spec.answer_close)
            if answer_end is None:
                answer_end = pos
        else:  # a stray closing tag
            errors.append(f"{tag} without a matching opening tag")
            pos = match.end()

    if n_calls > max_calls:
        errors.append(f"too many tool calls ({n_calls} > {max_calls}); make at most {max_calls} per turn")
    if len(answers) > 1:
        errors.append(f"more than one final answer ({len(answers)}); give exactly one")
    answer = answers[0] if answers else None
    if answer is not None and not answer:
        errors.append(f"empty final answer; write {spec.answer_open}{answer_hint}{spec.answer_close}")
    if answers and n_calls:
        errors.append(
            "a turn must contain either tool calls or a final answer, not both; "
            "call tools now and answer in a later turn"
        )
    if len(answers) == 1 and answer_end is not None and text[answer_end:].strip():
        errors.append(
            f"text after {spec.answer_close} ({snippet(text[answer_end:].strip(), 30)}); "
            f"end the turn with the answer"
        )
    if not opened:
        errors.append(spec.missing_hint.format(answer=answer_hint))
    if len(errors) > MAX_ERRORS:
        errors = errors[: MAX_ERRORS - 1] + [f"... and {len(errors) - MAX_ERRORS + 1} more errors"]
    return ParsedTurn(tuple(calls), answer, tuple(errors))


def _scan_call(
    text: str, start: int, spec: _StyleSpec, where: str, style: str, db_id: str | None, parse_body: bool
) -> tuple[int, ToolCall | None, str | None]:
    """Read the call whose opening tag ends at ``start``: (position after its closing tag or -1,
    the call or None, an error or None); with ``parse_body`` False it is only skipped over."""
    if style == "hermes":
        body_start = start
        while body_start < len(text) and text[body_start].isspace():
            body_start += 1
        if parse_body and text.startswith("{", body_start):
            decoded = _decode_call_json(text, body_start, spec.call_close)
            if decoded is not None:
                value, next_pos = decoded
                call, problem = _call_from_value(value, where)
                return next_pos, call, problem
    close = text.find(spec.call_close, start)
    if close < 0:
        body_hint = "{...}" if style == "hermes" else "SQL"
        return -1, None, f"{where}: {spec.call_open} is not closed; write {spec.call_open}{body_hint}{spec.call_close}"
    next_pos = close + len(spec.call_close)
    body = text[start:close]
    if spec.call_open in body:
        return next_pos, None, f"{where}: {spec.call_open} is not closed before the next {spec.call_open}"
    if not parse_body:
        return next_pos, None, None
    if style == "hermes":
        call, problem = _call_from_json(body, where)
        return next_pos, call, problem
    sql = _strip_fence(body.strip())
    if not sql:
        return next_pos, None, f"{where}: empty SQL; write {spec.call_open}SELECT ...{spec.call_close}"
    arguments: dict[str, Any] = {"sql": sql}
    if db_id is not None:
        arguments["db_id"] = db_id
    return next_pos, ToolCall("execute_sql", arguments), None


def format_tool_response(text: str | Sequence[str]) -> str:
    """Tool results as Qwen2.5's chat template renders ``tool`` messages: a block each, joined by newlines."""
    if isinstance(text, str):
        return f"<tool_response>\n{text}\n</tool_response>"
    return "\n".join(format_tool_response(t) for t in text)
