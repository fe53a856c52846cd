"""Task families: what is specific to one kind of task, chosen by `env.task_family`.

The environment, collector and trainer are the same for every family; a `TaskFamily` holds the rest:

* the instructions of the system prompt (the env appends the tool block the MCP servers list);
* what goes between ``<answer>`` and ``</answer>`` (``answer_hint``, as error messages name it);
* what a task row carries: SQL rows name a database (``db_id``, read from
  ``<db_root>/<db_id>/<db_id>.sqlite``) and the gold query; other families only their ground
  truth (the task's ``gold_sql`` field, also spelled ``ground_truth`` in task files);
* how correctness is decided: SQL runs the answer and the gold query (`rewards.execution`);
  another family names its verifier, a reward term (``verdict_term``) whose value 1 means solved.

The family's MCP servers and reward terms are ordinary config (`env.mcp_servers`,
`env.reward.terms`); its verifier term must be among the terms. The shipped non-SQL example is
`skyrl_tool_agent.examples.inventory` (configs/examples/inventory.yaml).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from skyrl_tool_agent.config.env import TASK_FAMILIES
from skyrl_tool_agent.config.errors import UserInputError
from skyrl_tool_agent.config.user_code import importable_from, load_module
from skyrl_tool_agent.env.chat_format import DEFAULT_SYSTEM_PROMPT
from skyrl_tool_agent.rewards.terms import BUILTIN_TERMS

__all__ = ["SQL", "TaskFamily", "family_oracle", "family_system_prompt", "resolve_family"]


@dataclass(frozen=True)
class TaskFamily:
    """One kind of task (module docstring)."""

    name: str
    system_prompt: str  # the instructions; the env adds the tool list
    answer_hint: str = "ANSWER"  # what the final <answer> holds, in the env's error messages
    #: The reward term whose value 1 means solved (the family's verifier, a function of
    #: `rewards.terms.Episode`); None = the SQL execution comparison decides (SQL only).
    verdict_term: str | None = None
    #: Rows name a database (db_id) the env resolves under the database root; schema_in_prompt and
    #: bind_db_id apply. False: rows carry only a question and their ground truth.
    uses_databases: bool = False
    #: 'module:object' of the family's scripted oracle, an agent class built with no arguments
    #: (`eval --policy oracle`); None: the SQL oracle, which answers each task's gold field. A
    #: module beside the family's file imports without PYTHONPATH.
    oracle: str | None = None
    #: The tools the family itself names (its prompt, its oracle, schema_in_prompt), each with its
    #: arguments: what `env.tool_map` may map onto a server's tools of other names.
    tools: Mapping[str, tuple[str, ...]] | None = field(default=None, hash=False)
    #: The directory of the file the family was loaded from (set by `resolve_family`): its own
    #: modules (oracle, verdict) import from there.
    home: Path | None = field(default=None, compare=False)


#: Text-to-SQL over SQLite: the default, and the only family of the skyrl_sql turn format.
SQL = TaskFamily("sql", DEFAULT_SYSTEM_PROMPT, answer_hint="SQL", verdict_term=None, uses_databases=True,
                 tools={"execute_sql": ("sql", "db_id"), "get_schema": ("db_id",), "list_tables": ("db_id",),
                        "describe_table": ("table", "db_id")})

#: SQL's instructions when no offered tool runs a query (no execute_sql, mapped or not).
_SQL_PROMPT_WITHOUT_EXECUTE = ("You answer questions about a SQLite database by calling tools. Look at the schema, "
                               "then give the final query as <answer>SQL</answer>.")


def family_system_prompt(family: TaskFamily, offered: Mapping[str, str | None]) -> str:
    """The family's instructions naming the tools actually offered: each of its own tool names
    (`offered`: family name -> the offered tool that plays it, None when none does) becomes the
    offered tool's name; SQL without a query tool does not tell the policy to test its query."""
    prompt = family.system_prompt
    if family.uses_databases and prompt == DEFAULT_SYSTEM_PROMPT and not offered.get("execute_sql"):
        return _SQL_PROMPT_WITHOUT_EXECUTE
    for name, tool in offered.items():
        if tool and tool != name:
            prompt = re.sub(rf"\b{re.escape(name)}\b", tool, prompt)
    return prompt


def family_oracle(family: TaskFamily) -> object | None:
    """A new instance of `family.oracle` (None when the family has none). UserInputError when it cannot be imported."""
    if family.oracle is None:
        return None
    module_name, _, attr = family.oracle.partition(":")
    try:
        with importable_from(family.home):
            module = load_module(module_name, family.home)
        return getattr(module, attr)()
    except Exception as exc:  # noqa: BLE001 - the family's own module
        raise UserInputError(f"task family {family.name!r}: cannot build its oracle {family.oracle} "
                             f"({type(exc).__name__}: {exc})") from None


def resolve_family(value: str) -> TaskFamily:
    """The family `env.task_family` names: a name of `config.env.TASK_FAMILIES`, 'module:object' or
    'path/to/file.py:object' (the file loaded as reward terms' files are, once per process).
    Raises UserInputError (one line) when it cannot be imported or is not a `TaskFamily`."""
    target = TASK_FAMILIES.get(value, value)
    module_name, _, attr = target.rpartition(":")
    try:
        module = load_module(module_name)
    except Exception as exc:  # noqa: BLE001 - any failure in the user's module is a config error
        raise UserInputError(f"env.task_family {value!r}: cannot import {module_name} ({type(exc).__name__}: {exc})") from None
    family = getattr(module, attr, None)
    if not isinstance(family, TaskFamily):
        raise UserInputError(f"env.task_family {value!r}: {target} is not a TaskFamily "
                             "(skyrl_tool_agent.env.families.TaskFamily)")
    if family.verdict_term is None and family is not SQL:
        raise UserInputError(f"env.task_family {value!r}: a family other than sql needs its verdict_term (the reward "
                             "term that decides correctness)")
    if family.verdict_term == "execution":  # the built-in: SQL's execution comparison decides
        if not family.uses_databases:
            raise UserInputError(
                f"env.task_family {value!r}: verdict_term 'execution' runs the answer and the gold SQL on the task's "
                "database, but the family's tasks name none: set uses_databases=True in its TaskFamily (tasks with "
                "db_id, scored under training.data.db_root), or name a verifier term of its own")
        family = replace(family, verdict_term=None)
    elif family.verdict_term in BUILTIN_TERMS:
        raise UserInputError(f"env.task_family {value!r}: verdict_term {family.verdict_term!r} is a built-in term that "
                             "does not decide correctness: use 'execution' (SQL) or a verifier term of the family's own")
    if module_name.endswith(".py"):
        family = replace(family, home=Path(module_name).expanduser().resolve().parent)
    return family
