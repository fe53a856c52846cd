"""SkyRL-SQL's text conventions, for `tool_call_format: skyrl_sql`.

Copied from skyrl-gym 0.4.0 (`skyrl_gym/tools/sql.py`, `SQLCodeExecutorToolGroup.sql`, which the
text2sql env `skyrl_gym/envs/sql/env.py` returns as its observation) so that SkyRL-SQL prompts, its
`use_conversation_multi_turn=false` concatenation and its reward parser
(`skyrl_gym.envs.sql.utils.verify_format_and_extract`: every `</observation>` must be followed by
`<think>`) work on our episodes unchanged:

    "\\n\\n<observation>{result}\\n<reminder>You have {turns_left} turns left to complete the task.</reminder></observation>\\n\\n"

where `turns_left` is max_turns minus the turns taken so far (this one included). Only the result
text differs: it is what our MCP tool server returns, not a pandas frame.
"""

from __future__ import annotations

from collections.abc import Sequence

#: skyrl-gym's observation for a turn with no `<sql>` call, word for word.
INVALID_ACTION = (
    "Your previous action is invalid. Follow the format of outputting thinking process and sql tool, and try again."
)

#: The system prompt when a task's prompt brings none (SkyRL-SQL's own data does: it is kept).
SYSTEM_PROMPT = (
    "You answer questions about a SQLite database with SQL. Think inside <think>...</think> every "
    "time you get new information. Run a query with <sql>your sql</sql>; its result is shown inside "
    "<observation>...</observation>. When no further exploration is needed, give the final query "
    "inside <solution>...</solution>."
)


def observation(errors: Sequence[str], results: Sequence[str], turns_left: int) -> str:
    """One turn's observation: skyrl-gym's invalid-action sentence when the turn had format errors,
    then each tool result, then the turn reminder.

    The parser's own messages are left out on purpose: they quote the tags (``<solution>SQL</solution>``),
    and skyrl-gym's reward parser rejects a history holding a second ``<solution>``."""
    parts = [INVALID_ACTION] if errors else []
    parts.extend(results)
    body = "\n".join(parts)
    reminder = f"<reminder>You have {turns_left} turns left to complete the task.</reminder>"
    return f"\n\n<observation>{body}\n{reminder}</observation>\n\n"
