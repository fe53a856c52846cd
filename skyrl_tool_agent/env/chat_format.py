"""Qwen2.5 chat and tool-calling text format, rendered without a tokenizer.

Rendering ourselves (not re-applying a chat template to the whole history every turn) lets the
collector append each observation's tokens to the exact ids the policy sampled: no drift.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
ENDOFTEXT = "<|endoftext|>"
TOOL_CALL_OPEN, TOOL_CALL_CLOSE = "<tool_call>", "</tool_call>"
TOOL_RESPONSE_OPEN, TOOL_RESPONSE_CLOSE = "<tool_response>", "</tool_response>"
ANSWER_OPEN, ANSWER_CLOSE = "<answer>", "</answer>"

DEFAULT_SYSTEM_PROMPT = (
    "You answer questions about a SQLite database by calling tools. Look at the schema, "
    "test your query with execute_sql, then give the final query as <answer>SQL</answer>."
)

_TOOLS_HEADER = (
    "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
)
_TOOLS_FOOTER = (
    "\n</tools>\n\nFor each function call, return a json object with function name and arguments "
    "within <tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
)


def tool_to_openai(name: str, description: str, input_schema: Mapping[str, Any]) -> dict[str, Any]:
    """An MCP tool as the OpenAI/Qwen function schema dict."""
    return {
        "type": "function",
        "function": {"name": name, "description": description, "parameters": dict(input_schema)},
    }


def _compact_schema(schema: Mapping[str, Any]) -> dict[str, Any]:
    """Drop JSON-schema noise (titles, pydantic metadata) that costs prompt tokens and says nothing."""
    props = {
        key: {k: v for k, v in prop.items() if k in ("type", "description", "enum", "items")}
        for key, prop in dict(schema.get("properties", {})).items()
    }
    out: dict[str, Any] = {"type": "object", "properties": props}
    if schema.get("required"):
        out["required"] = list(schema["required"])
    return out


def system_prompt_with_tools(tools: Sequence[Mapping[str, Any]], system_prompt: str = DEFAULT_SYSTEM_PROMPT) -> str:
    """Qwen2.5's system content for a tool-using conversation.

    `tools` are OpenAI-style function dicts (see `tool_to_openai`). The JSON is serialised like
    Jinja's `tojson` in Qwen's template (`json.dumps` with default separators, keys in given order).
    """
    lines = []
    for tool in tools:
        fn = dict(tool["function"])
        fn["parameters"] = _compact_schema(fn.get("parameters", {}))
        lines.append("\n" + json.dumps({"type": "function", "function": fn}, ensure_ascii=False))
    return system_prompt + _TOOLS_HEADER + "".join(lines) + _TOOLS_FOOTER


def render_conversation(messages: Sequence[Mapping[str, str]], add_generation_prompt: bool = True) -> str:
    """Render OpenAI-style messages as Qwen2.5 ChatML (the same text Qwen's template produces): one
    `<|im_start|>role\\ncontent<|im_end|>\\n` block each."""
    text = "".join(f"{IM_START}{m['role']}\n{m['content']}{IM_END}\n" for m in messages)
    return text + (f"{IM_START}assistant\n" if add_generation_prompt else "")


def render_observation(messages: Sequence[Mapping[str, str]]) -> str:
    """Text appended after a sampled assistant turn (which ended at `<|im_end|>`): the newline that
    closes that turn, the observation messages, and the next generation prompt."""
    return "\n" + render_conversation(messages, add_generation_prompt=True)


def format_tool_call(name: str, arguments: Mapping[str, Any]) -> str:
    """A Hermes/Qwen tool call block, as the oracle and the warm-start data write it."""
    payload = json.dumps({"name": name, "arguments": dict(arguments)}, ensure_ascii=False)
    return f"{TOOL_CALL_OPEN}\n{payload}\n{TOOL_CALL_CLOSE}"


def format_answer(sql: str) -> str:
    return f"{ANSWER_OPEN}{sql}{ANSWER_CLOSE}"
