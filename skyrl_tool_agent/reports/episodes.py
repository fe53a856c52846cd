"""One episode as report.html shows it (evaluated samples and training rollouts alike), as plain data
the autoescaped templates turn into HTML, with the `data-*` attributes the page's script reads.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from skyrl_tool_agent.env.chat_format import TOOL_CALL_CLOSE, TOOL_CALL_OPEN
from skyrl_tool_agent.reports.sql_preview import ResultPreviewer

#: Longest message text shown per turn (tool results of big queries are cut, with a note).
MAX_MESSAGE_CHARS = 6000
_TOOL_CALL = re.compile(rf"{re.escape(TOOL_CALL_OPEN)}\s*(.*?)\s*{re.escape(TOOL_CALL_CLOSE)}", re.DOTALL)


def clip(text: str) -> str:
    """`text`, cut to MAX_MESSAGE_CHARS with a note of how much was left out."""
    if len(text) <= MAX_MESSAGE_CHARS:
        return text
    return text[:MAX_MESSAGE_CHARS] + f"\n… ({len(text) - MAX_MESSAGE_CHARS} more characters)"


def tool_names(text: str) -> list[str]:
    """Names of the tools an assistant turn calls (Hermes `<tool_call>` JSON), for the turn label."""
    names = []
    for block in _TOOL_CALL.findall(text):
        try:
            names.append(str(json.loads(block).get("name", "?")))
        except (json.JSONDecodeError, AttributeError):
            names.append("(malformed)")
    return names


def shared_system_prompt(conversations: Iterable[Sequence[Mapping[str, Any]]]) -> str:
    """The first conversation's system message (shown once per view, not per episode)."""
    for messages in conversations:
        if messages and messages[0].get("role") == "system":
            return str(messages[0].get("content", ""))
    return ""


def turns(messages: Sequence[Mapping[str, Any]], system_prompt: str) -> list[dict[str, str]]:
    """(css class, label, text) per message; the shared system prompt is left out."""
    out = []
    for index, message in enumerate(messages):
        role, content = str(message.get("role", "")), str(message.get("content", ""))
        if role == "system" and content == system_prompt:
            continue
        if role == "assistant":
            calls = tool_names(content)
            who, cls = "assistant" + (f" → {', '.join(calls)}" if calls else ""), "assistant"
        elif role == "user" and index > 1:  # after the task message, user turns are tool results
            who, cls = "tool results", "tool"
        else:
            who, cls = role, role if role in ("system", "user") else "other"
        out.append({"cls": cls, "who": who, "text": clip(content)})
    return out


def reward_terms(record: Mapping[str, Any]) -> dict[str, Any]:
    """The reward's named terms, whatever keys the record carries (`reward_terms` or `components`)."""
    terms = record.get("reward_terms")
    if terms is None:
        terms = record.get("components")
    return dict(terms) if isinstance(terms, Mapping) else {}


def _number(value: Any) -> str:
    """A `data-*` value the script can sort on (empty when not a number)."""
    return repr(float(value)) if isinstance(value, (int, float)) and not isinstance(value, bool) else ""


def episode(ident: str, record: Mapping[str, Any], sample: Mapping[str, Any], *, system_prompt: str,
            previewer: ResultPreviewer, facts: Sequence[tuple[str, str]], tags: Sequence[str] = (),
            data: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """What the page shows of one episode: `record` the task, `sample` the episode (the same mapping
    for a rollout); `facts`: (label, text) rows under the question; `data`: extra attributes."""
    solved = bool(sample.get("solved"))
    db_id = str(record.get("db_id", ""))
    attributes = {"failed": "0" if solved else "1", "db": db_id, "difficulty": str(record.get("difficulty", "")),
                  "reward": _number(sample.get("reward")), "turns": _number(sample.get("turns"))}
    attributes.update({k: _number(v) if not isinstance(v, str) else v for k, v in (data or {}).items()})
    return {
        "id": ident,
        "solved": solved,
        "task_id": str(record.get("task_id", "")),
        "db_id": db_id,
        "difficulty": str(record.get("difficulty", "")),
        "question": str(record.get("question", "")),
        "reward": sample.get("reward"),
        "tags": list(tags),
        "facts": list(facts),
        "error": sample.get("error"),
        "terms": reward_terms(sample),
        "sql": (previewer.sql_panel(db_id, sample.get("final_sql"), str(record.get("gold_sql", "")))
                if "ground_truth" not in record else  # a family other than SQL (eval.vocabulary): no SQL to run
                {"plain": True, "final": sample.get("final_sql"), "gold": str(record["ground_truth"]),
                 "answer_label": "final answer", "truth_label": "ground truth"}),
        "turns": turns(sample.get("messages") or [], system_prompt),
        "data": attributes,
    }
