"""A served model's chat-completions answer as this project reads it, and what it may not exceed.

The models are permissive where the API is (unknown fields ignored, optional ones null) and strict
on the types of what is used: a wrong type is a `ProtocolError`, and pydantic-core's nesting limit
makes an absurdly deep document a validation error, not a `RecursionError`.

Limits (`ReplyLimits.for_turn`): a turn's text (content, tool calls and reasoning together) holds at
most max(64 Ki, 16 x max_tokens) characters -- no tokenizer averages 16 characters a token, so a
model that honours `max_tokens` never comes near it -- and the body at most max(4 MiB, 8 bytes a
character of that), on the wire and once decompressed (room for JSON's \\uXXXX escapes).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr, ValidationError

#: Why a turn could not be had from the server; the episode is then unscored (never wrong).
SERVER_ERROR = "server_error"  # HTTP 5xx after the retries
TOO_LARGE = "too_large"  # a body or a turn's text over its cap
MALFORMED = "malformed"  # not JSON, not a chat completion, an unknown content coding

#: The smallest caps (see the module doc).
MIN_TURN_CHARS = 64 * 1024
CHARS_PER_TOKEN = 16
MIN_BODY_BYTES = 4 * 1024 * 1024
BYTES_PER_CHAR = 8


class ProtocolError(Exception):
    """An answer no turn can be made of; `reason` is one of the three above."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


@dataclass(frozen=True)
class ReplyLimits:
    body_bytes: int
    turn_chars: int

    @classmethod
    def for_turn(cls, max_tokens: int) -> ReplyLimits:
        chars = max(MIN_TURN_CHARS, CHARS_PER_TOKEN * max_tokens)
        return cls(body_bytes=max(MIN_BODY_BYTES, BYTES_PER_CHAR * chars), turn_chars=chars)


class _Read(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class FunctionCall(_Read):
    name: StrictStr | None = None
    arguments: StrictStr | dict[str, Any] | None = None  # a JSON string per the API; some servers send the object


class ToolCall(_Read):
    function: FunctionCall


class AssistantMessage(_Read):
    content: StrictStr | None = None
    tool_calls: list[ToolCall] | None = None
    reasoning_content: StrictStr | None = None  # vLLM, SGLang
    reasoning: StrictStr | None = None  # others


class Choice(_Read):
    message: AssistantMessage


_Count = Annotated[StrictInt, Field(ge=0)]


class Usage(_Read):
    prompt_tokens: _Count | None = None
    completion_tokens: _Count | None = None


class ChatCompletion(_Read):
    choices: list[Choice] = Field(min_length=1)
    usage: Usage | None = None
    model: StrictStr | None = None


class ModelCard(_Read):
    id: StrictStr


class ModelList(_Read):
    data: list[ModelCard]


def parse_completion(body: bytes) -> ChatCompletion:
    """`body` as a chat completion, or `ProtocolError(MALFORMED)` saying where it is not one."""
    try:
        return ChatCompletion.model_validate_json(body)
    except ValidationError as exc:
        raise ProtocolError(MALFORMED, validation_summary(exc, "a chat completion")) from None


def validation_summary(exc: ValidationError, what: str) -> str:
    """One line: the first problem (where, what), without the offending value (it may be huge)."""
    errors = exc.errors(include_url=False, include_input=False, include_context=False)
    first = errors[0]
    if first["type"] == "json_invalid":
        return f"not JSON ({first['msg'].removeprefix('Invalid JSON: ')})"
    where = ".".join(str(part) for part in first["loc"]) or "the document"
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return f"not {what}: {where}: {first['msg']}{more}"
