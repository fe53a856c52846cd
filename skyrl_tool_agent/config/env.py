"""`EnvConfig` (configs/env_config.yaml): MCP tool servers, timeouts, turn format, reward terms,
rollout concurrency.

Server commands may use placeholders, filled when the servers are started (`resolved_servers`):

* ``${db_root}`` in `command`, `args`, `env` values or `cwd` becomes the absolute database root
  (training.data.db_root, or the dataset's default).
* ``${sql_timeout_s}`` becomes `env.sql_timeout_s`, so one knob bounds a query in the tool server
  and in the env's own scoring runs. An unknown ``${...}`` is a config error; there is no escape.
* A `command` that is literally ``python`` becomes `sys.executable`, so servers run in the same
  interpreter/virtualenv as the trainer.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator, model_validator

from skyrl_tool_agent.config.base import Section, knob

#: The task families known by name (`env.task_family`), each the `module:object` it stands for:
#: skyrl_tool_agent.env.families is the interface; the inventory example is README's "Beyond SQL".
TASK_FAMILIES: dict[str, str] = {
    "sql": "skyrl_tool_agent.env.families:SQL",
    "inventory": "skyrl_tool_agent.examples.inventory:FAMILY",
}
_FAMILY_PATH = re.compile(r"^([A-Za-z_][\w.]*|.+\.py):[A-Za-z_]\w*$")  # module:object or path/to/file.py:object

#: Placeholder names `${...}` understood in MCP server specs.
PLACEHOLDERS: tuple[str, ...] = ("db_root", "sql_timeout_s")
_PLACEHOLDER = re.compile(r"\$\{([^}]*)\}")


def substitute(text: str, values: dict[str, str]) -> str:
    """Replace each `${name}` in `text` by `values[name]` (names must be known; see module doc)."""
    return _PLACEHOLDER.sub(lambda m: values[m.group(1)], text)


class MCPServerConfig(Section):
    """One MCP server, started as a stdio subprocess."""

    name: str = knob(..., "Server name (unique; tools are routed by it).", pattern=r"^[A-Za-z0-9_.-]+$")
    command: str = knob(..., "Executable; 'python' = the trainer's interpreter.", min_length=1)
    args: list[str] = knob(default_factory=list, description="Arguments; ${db_root} and ${sql_timeout_s} are filled in.")
    env: dict[str, str] = knob(
        default_factory=dict, description="Extra environment variables for the server process."
    )
    cwd: str | None = knob(None, "Working directory of the server; null = the trainer's.")
    tool_prefix: str = knob(
        "",
        "Prefix added to this server's tool names (e.g. 'b_' makes execute_sql b_execute_sql). Two "
        "servers listing the same tool name are refused unless one has a prefix. The policy, "
        "offered_tools and tool calls use the prefixed name; the server still sees its own.",
        pattern=r"^[A-Za-z0-9_.-]*$",
    )

    error_pattern: str | None = knob(
        None,
        "Regular expression (Python re.search) that marks a result as a tool error when the server "
        "reports errors as plain text with is_error false (e.g. '^(Database )?[Ee]rror:'). Matching "
        "results count like is_error results: the tool-error column, tool_errors of reward terms, "
        "shaping. null = only is_error.",
    )
    writable_paths: list[str] = knob(
        default_factory=list,
        description="Files or directories this server may write (its database, its state). No "
        "episode sees another's writes, nor does the reward: the server runs as a warm pool of "
        "env.isolation_pool_size processes, each on its own copy of these paths, and every call "
        "runs on a copy holding its episode's state (the original's bytes at the episode's first "
        "call; SQLite's backup API swaps databases in place). Every argument, env value or cwd that "
        "names one of these paths (as written here, ./path or absolute: compared after "
        "normalisation) is pointed at the copy; the originals are never handed to the server. A "
        "relative path is taken against the server's cwd, else the working directory. A server that "
        "also keeps state in memory needs stateful: true.",
    )
    stateful: bool = knob(
        False,
        "The server keeps state in memory between calls: each episode gets a server process of its "
        "own, started at its first call to it (on its own copy of writable_paths), so nothing an "
        "episode does is seen by the next. Costs a process start per episode; without it a server "
        "with writable_paths shares warm processes (its files swapped per episode).",
    )

    @field_validator("error_pattern")
    @classmethod
    def _compiles(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                re.compile(value)
            except re.error as exc:
                raise ValueError(f"error_pattern {value!r} is not a regular expression: {exc}") from None
        return value

    @property
    def isolated(self) -> bool:
        """Each episode runs its own server process (stateful, or with writable paths)."""
        return self.stateful or bool(self.writable_paths)

    @field_validator("command", "cwd", "args", "writable_paths", "env")
    @classmethod
    def _known_placeholders(cls, value: str | list[str] | dict[str, str] | None) -> object:
        texts = [value] if isinstance(value, str) else value.values() if isinstance(value, dict) else value or []
        for name in (name for text in texts for name in _PLACEHOLDER.findall(text)):
            if name not in PLACEHOLDERS:
                known = ", ".join("${" + p + "}" for p in PLACEHOLDERS)
                raise ValueError(f"unknown placeholder '${{{name}}}' (known: {known})")
        return value

    def resolved(self, db_root: str | Path, *, sql_timeout_s: float) -> MCPServerConfig:
        """A copy with placeholders filled and `python` pinned to `sys.executable`."""
        values = {"db_root": str(Path(db_root).expanduser().resolve()), "sql_timeout_s": f"{sql_timeout_s:g}"}
        command = sys.executable if self.command == "python" else substitute(self.command, values)
        # a copy, not a new instance field by field: a knob added later cannot be dropped here
        return self.model_copy(update={
            "command": command,
            "args": [substitute(a, values) for a in self.args],
            "env": {k: substitute(v, values) for k, v in self.env.items()},
            "cwd": None if self.cwd is None else substitute(self.cwd, values),
            "writable_paths": [substitute(w, values) for w in self.writable_paths],
        })


def _default_servers() -> list[MCPServerConfig]:
    return [
        MCPServerConfig(
            name="sqlite",
            command="python",
            args=["-m", "mcp_tools.sqlite_server", "--db-root", "${db_root}", "--timeout-s", "${sql_timeout_s}"],
        )
    ]


#: The default reward: (name, weight) of each built-in term, in order (`rewards.terms` has the terms,
#: `rewards.rubric` the formula and the rules that any terms must follow).
DEFAULT_TERMS: tuple[tuple[str, float], ...] = (("execution", 1.0), ("format", 0.1), ("syntax", 0.05), ("partial", 0.2))

#: The fixed reward weights that `reward.terms` replaced (a stale config gets the new spelling).
_OLD_WEIGHT_KEYS = ("execution_weight", "format_weight", "syntax_weight", "partial_weight")


class RewardTermConfig(Section):
    """One term of the episode reward: a built-in by name, or your own function."""

    name: str = knob(
        ...,
        "Term name (built-in: execution, format, syntax, partial, literals), logged as reward/<name>. "
        "execution = the answer returns the gold query's result; format = every turn parsed and there "
        "is one final answer; syntax = the answer is valid SQL; partial = structural overlap with the "
        "gold query; literals = the answer's constants against the gold query's; partial and literals "
        "count only when the answer is wrong (skyrl_tool_agent.rewards.terms). Any other "
        "name is a term of your own and needs `function`.",
        pattern=r"^[A-Za-z_][A-Za-z0-9_]*$",
    )
    weight: float = knob(
        ...,
        "Weight; negative = a penalty (terms of your own only), 0 = logged, not counted. The reward "
        "divides the weighted sum by the weights a perfect episode earns (skyrl_tool_agent.rewards.rubric).",
        allow_inf_nan=False,
    )
    function: str | None = knob(
        None,
        "Your term's 'module:function' or 'path/to/file.py:function'; null = a built-in. A file path "
        "is relative to the working directory. The function takes the finished episode "
        "(skyrl_tool_agent.rewards.terms.Episode) and returns a number; decorated with "
        "@reward_term(only_when_wrong=True) it counts only when the answer is wrong. Imported when "
        "the run is built (before any MCP server starts), not when the config loads.",
    )


class RewardConfig(Section):
    """The episode reward: weighted terms, normalised so a perfect episode scores 1 and one without
    an answer 0 (`rewards.rubric`, whose rules are checked when the run is built)."""

    terms: list[RewardTermConfig] = knob(
        default_factory=lambda: [RewardTermConfig(name=name, weight=weight) for name, weight in DEFAULT_TERMS],
        description="The reward's terms, each logged as reward/<name>. README (Rewards) shows how to "
        "add one of your own.",
        min_length=1,
    )
    keep_distinct: bool = knob(
        True,
        "Training reward's execution match: compare the queries with DISTINCT as written, so a "
        "missing DISTINCT that changes the rows is wrong. False = the official Spider test-suite "
        "default (its --keep_distinct off): every DISTINCT, COUNT(DISTINCT x) included, is deleted "
        "from both queries before they run.",
    )
    eval_keep_distinct: bool = knob(
        False,
        "The same choice for evaluation reports (eval steps, the final dev evaluation, the evaluate "
        "command). The default is the official test-suite behaviour, so reported accuracy compares "
        "with published Spider numbers.",
    )
    gold_cache_size: int = knob(4096, "Gold-query results cached (LRU entries).", ge=0)

    @model_validator(mode="before")
    @classmethod
    def _old_weights(cls, data: object) -> object:
        old = [key for key in _OLD_WEIGHT_KEYS if isinstance(data, dict) and key in data]
        if old:
            listed = ", ".join(f"{{name: {name}, weight: {weight:g}}}" for name, weight in DEFAULT_TERMS)
            raise ValueError(f"{old[0]} is now a term of reward.terms, a list of {{name, weight}}: the default is "
                             f"terms: [{listed}]")
        return data


class CollectorConfig(Section):
    """The async trajectory collector."""

    concurrency: int = knob(
        64, "Episodes in flight at once; also the most episodes one generation batch holds. On CUDA "
        "the rollout engine keeps a KV-cache slot per episode in flight: tasks_per_step x group_size "
        "puts a whole step's episodes in flight at once.", h100=256, ge=1)
    max_episode_retries: int = knob(
        1, "Retries of an episode failed by infrastructure. That is a server crash or timeout, not a "
        "wrong answer.",
        ge=0,
    )
    lockstep: bool = knob(
        True, "Each generation batch waits for every episode in flight and is ordered by episode, so "
        "what is sampled does not depend on tool latency (exactly reproducible runs and resumes). "
        "false = continuous batching: a turn joins the rollout engine as soon as its tool call "
        "returns and resolves as soon as its own tokens are done (faster where turns and tool "
        "calls vary in length; a resumed run samples the same up to float rounding).",
        h100=False,
    )


class ToolMapping(Section):
    """Which server tool plays one of the task family's tools, and how its arguments are named."""

    tool: str = knob(..., "The server's tool name (as offered: with its server's tool_prefix).", min_length=1)
    args: dict[str, str] = knob(
        default_factory=dict,
        description="The family's argument name -> the server tool's (e.g. {sql: query}); an argument "
        "not listed keeps its name, and db_id is dropped when the tool takes none.",
    )


class EnvConfig(Section):
    """The tool environment: MCP servers, timeouts, turn format, rewards, collector."""

    task_family: str = knob(
        "sql",
        "The kind of task: its system prompt, what a task row carries and which reward term decides "
        "correctness (skyrl_tool_agent.env.families.TaskFamily). sql = text-to-SQL over SQLite; "
        "inventory = the shipped non-SQL example (configs/examples/inventory.yaml sets its servers "
        "and terms); or your own family's 'module:object'. A family other than sql brings its own "
        "mcp_servers and reward.terms: set them too (README, Beyond SQL).",
    )
    mcp_servers: list[MCPServerConfig] = knob(
        default_factory=_default_servers,
        description="MCP servers to start (see module doc for ${db_root} and 'python').",
        min_length=1,
    )
    call_timeout_s: float = knob(10.0, "Client-side limit for one tool call, in seconds.", gt=0)
    sql_timeout_s: float = knob(
        5.0, "Limit for one SQL query, in seconds: the env's scoring runs, and the tool server's via "
        "${sql_timeout_s} in its args.", gt=0)
    sessions_per_server: int = knob(
        1, "MCP client sessions (server processes) per server spec.", h100=4, ge=1
    )
    isolation_pool_size: int | None = knob(
        None,
        "Most processes of one server with writable_paths (not stateful) at once: its warm pool. A "
        "call holds a process only while it runs, so episodes in flight may outnumber them (an "
        "episode whose copy another took is saved and restored: two copies of its files). Started "
        "as calls need them, the first when the run starts (it lists the tools). null = the CPU "
        "cores.",
        ge=1,
    )
    tool_call_format: Literal["hermes", "skyrl_sql"] = knob(
        "hermes",
        "Turn format and final-answer tags. hermes = Qwen2.5 function calling, "
        "<tool_call>{json}</tool_call>, final answer "
        "<answer>SQL</answer>; skyrl_sql = SkyRL-SQL tags, <sql>...</sql> runs a query and "
        "<solution>...</solution> is the final answer (skyrl_tool_agent.env.parsing is the "
        "reference).",
    )
    offered_tools: list[str] | None = knob(
        default_factory=lambda: ["execute_sql"],
        description="Tools offered to the policy, by the names the servers list; null = every tool. "
        "Calls to a tool not offered are rejected like unknown tools. The CPU default offers only "
        "execute_sql with the schema in the prompt (SkyRL-SQL's setup): short episodes a tiny model "
        "can learn in minutes.",
        h100=None,
    )
    schema_in_prompt: bool = knob(
        True,
        "Put the database schema (the get_schema tool's text, fetched through MCP when an episode "
        "starts) in the first user message, as Spider-style text-to-SQL prompts do. Off: the "
        "policy explores the schema with the tools.",
        h100=False,
    )
    bind_db_id: bool = knob(
        True,
        "The env fills every tool's db_id argument with the episode's database and hides db_id "
        "from the tool schemas the policy sees: nothing to copy, and no episode can read another "
        "task's database. Off: the policy passes db_id itself.",
    )
    tool_map: dict[str, ToolMapping] = knob(
        default_factory=dict,
        description="The task family's tools played by a server's tools of other names: for sql, "
        "execute_sql (argument sql) and get_schema (argument db_id), e.g. {execute_sql: {tool: "
        "read_query, args: {sql: query}}}. The prompt, the oracle, schema_in_prompt and SkyRL-SQL's "
        "<sql> tag then use the server's tool. Empty = the family's own names.",
    )
    shaping_rewards: bool = knob(
        False,
        "Per-turn shaping: a turn that is malformed or whose tool calls all fail gets -shaping_penalty "
        "as its step reward (the final reward is unchanged). Off: intermediate turns get 0. Training "
        "reads step rewards only with grpo.turn_credit_discount set.",
    )
    shaping_penalty: float = knob(0.05, "Size of the per-turn shaping penalty (with shaping_rewards).", ge=0)
    reward: RewardConfig = Field(default_factory=RewardConfig, description="The episode reward.")
    collector: CollectorConfig = Field(default_factory=CollectorConfig, description="Rollout collector.")

    @field_validator("task_family")
    @classmethod
    def _known_family(cls, value: str) -> str:
        if value not in TASK_FAMILIES and not _FAMILY_PATH.match(value):
            raise ValueError(f"unknown task family {value!r}: give one of {', '.join(TASK_FAMILIES)} or your "
                             "family's 'module:object'")
        return value

    @model_validator(mode="after")
    def _unique_names(self) -> EnvConfig:
        names = [s.name for s in self.mcp_servers]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(f"mcp_servers: duplicate server names {duplicates}")
        return self

    @classmethod
    def exploring(cls, **overrides: object) -> EnvConfig:
        """The exploring episode (the H100 profile's shape): every tool offered, no schema in the
        prompt, db_id passed by the policy — list tables, describe, execute, answer."""
        return cls(**{"offered_tools": None, "schema_in_prompt": False, "bind_db_id": False, **overrides})

    def resolved_servers(self, db_root: str | Path) -> list[MCPServerConfig]:
        """The servers with placeholders filled for this database root (see module doc)."""
        return [server.resolved(db_root, sql_timeout_s=self.sql_timeout_s) for server in self.mcp_servers]


#: skyrl-gym's text2sql env layout: a row's `data` -> the database directory under `db_path`
#: (skyrl_gym/envs/sql/env.py, SQLEnv.__init__; the OmniSQL data.zip unpacks this way).
SKYRL_SQL_DATA_DIRS: dict[str, str] = {
    "synsql": "SynSQL-2.5M/databases",
    "spider": "spider/database",
    "bird": "bird/train/train_databases",
}


class SkyRLEnvConfig(EnvConfig):
    """What `skyrl_gym.make("mcp_tool_env", env_config=...)` accepts: every `EnvConfig` knob plus
    where the databases are (docs/skyrl_train.md; our own trainer takes training.data.db_root)."""

    db_root: str | None = knob(
        None,
        "Database root, Spider layout <db_root>/<db_id>/<db_id>.sqlite. A dataset row's own db_root "
        "wins over it. A relative path is resolved against the working directory of the process "
        "that builds the env, when it builds it (under SkyRL-train a Ray worker's, so give an "
        "absolute path). null = db_path, else the built-in databases.",
    )
    db_path: str | None = knob(
        None,
        "skyrl-gym's spelling (its text2sql env's db_path): the OmniSQL data directory. A row's "
        "`data` picks the database directory under it: spider -> spider/database, synsql -> "
        "SynSQL-2.5M/databases, bird -> bird/train/train_databases; a row without `data` uses "
        "db_path itself as the root. Relative paths as for db_root.",
    )

    @model_validator(mode="after")
    def _one_root(self) -> SkyRLEnvConfig:
        if self.db_root is not None and self.db_path is not None:
            raise ValueError("give db_root or db_path, not both")
        return self

    def env_config(self) -> EnvConfig:
        """The `EnvConfig` part (without the database location)."""
        return EnvConfig.model_validate(self.model_dump(exclude={"db_root", "db_path"}))
