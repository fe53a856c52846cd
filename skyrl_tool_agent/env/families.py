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

import importlib
from dataclasses import dataclass
from pathlib import Path

from skyrl_tool_agent.config.env import TASK_FAMILIES
from skyrl_tool_agent.config.errors import UserInputError
from skyrl_tool_agent.config.user_code import load_module_file
from skyrl_tool_agent.env.chat_format import DEFAULT_SYSTEM_PROMPT

__all__ = ["SQL", "TaskFamily", "family_oracle", "resolve_family"]


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
    #: (`eval --policy oracle`); None: the SQL oracle, which answers each task's gold field.
    oracle: str | None = None


#: Text-to-SQL over SQLite: the default, and the only family of the skyrl_sql turn format.
SQL = TaskFamily("sql", DEFAULT_SYSTEM_PROMPT, answer_hint="SQL", verdict_term=None, uses_databases=True)


def family_oracle(family: TaskFamily) -> object | None:
    """A new instance of `family.oracle` (None when the family has none). UserInputError when it cannot be imported."""
    if family.oracle is None:
        return None
    module_name, _, attr = family.oracle.partition(":")
    try:
        return getattr(importlib.import_module(module_name), attr)()
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
        module = (load_module_file(Path(module_name).expanduser().resolve()) if module_name.endswith(".py")
                  else importlib.import_module(module_name))
    except Exception as exc:  # noqa: BLE001 - any failure in the user's module is a config error
        raise UserInputError(f"env.task_family {value!r}: cannot import {module_name} ({type(exc).__name__}: {exc})") from None
    family = getattr(module, attr, None)
    if not isinstance(family, TaskFamily):
        raise UserInputError(f"env.task_family {value!r}: {target} is not a TaskFamily "
                             "(skyrl_tool_agent.env.families.TaskFamily)")
    if family.verdict_term is None and family is not SQL:
        raise UserInputError(f"env.task_family {value!r}: a family other than sql needs its verdict_term (the reward "
                             "term that decides correctness)")
    return family
