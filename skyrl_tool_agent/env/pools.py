"""What episodes share: the MCP pool, the tool list, the gold-result cache and resolved settings.

SkyRL-train builds one env per trajectory, so runtimes are cached per process, keyed by the server
specs and database root, and closed at exit (`close_runtimes`).
"""

from __future__ import annotations

import atexit
import logging
import os
import shlex
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from skyrl_tool_agent.config.base import expand_path
from skyrl_tool_agent.config.env import SKYRL_SQL_DATA_DIRS, EnvConfig, SkyRLEnvConfig
from skyrl_tool_agent.config.errors import UserInputError
from skyrl_tool_agent.config.overrides import validation_message
from skyrl_tool_agent.env.families import TaskFamily, family_system_prompt, resolve_family
from skyrl_tool_agent.mcp.pool import BackgroundMCPPool, MCPConfigError, ToolSpec
from skyrl_tool_agent.mcp.servers import ServerSet
from skyrl_tool_agent.rewards.gold_cache import GoldResultCache
from skyrl_tool_agent.rewards.originals import OriginalData
from skyrl_tool_agent.rewards.rubric import Rubric

logger = logging.getLogger(__name__)


def default_db_root() -> Path:
    """The built-in databases, wherever the package is installed (a checkout's data/processed, else
    the cache, built there on first use): what an env without a `db_root` reads."""
    from skyrl_tool_agent.data.builtin.location import DB_DIR, builtin_data_dir

    return builtin_data_dir() / DB_DIR


@dataclass(frozen=True)
class EnvSettings:
    """The env-side knobs, resolved from `EnvConfig` (documented there)."""

    tool_call_format: str
    sql_timeout_s: float
    rubric: Rubric  # the reward's terms (env.reward.terms)
    shaping_penalty: float  # 0 = no per-turn shaping
    keep_distinct: bool = True  # the training reward's DISTINCT semantics (env.reward.keep_distinct)


class EnvDataError(UserInputError, ValueError):
    """A dataset row or env_config the env cannot run (a missing key, a database root that does not
    exist): raised when the env is built, before any MCP server starts; one line."""


class EpisodeSetupError(ValueError):
    """An episode cannot start (e.g. its database's schema cannot be read): that episode fails,
    the collection goes on."""


def build_rubric(config: EnvConfig, family: TaskFamily | None = None) -> Rubric:
    """The reward of `config` (for `family`, default env.task_family's), its own terms imported
    and the rules checked, before any MCP server starts; one `EnvDataError` line on a problem."""
    family = family or resolve_family(config.task_family)
    try:
        return Rubric.from_specs(config.reward.terms, verdict_term=family.verdict_term)
    except ValueError as exc:
        raise EnvDataError(f"env.reward.terms (task family {family.name!r}): {exc}") from None


def offered_tools(tools: Sequence[ToolSpec], names: Sequence[str] | None, *, bind_db_id: bool,
                  tool_map: Mapping[str, str] | None = None) -> list[ToolSpec]:
    """The tools the policy is offered (`EnvConfig.offered_tools`; a family tool name mapped by
    `env.tool_map` stands for the server's tool), db_id removed from their argument schemas when
    the env binds it. A name no server lists is an `EnvDataError` naming the key and the fix."""
    if names is not None:
        tool_map = tool_map or {}
        known = {t.name for t in tools}
        wanted = [tool_map.get(n, n) for n in names]
        unknown = [n for n, w in zip(names, wanted) if w not in known]
        if unknown:
            raise EnvDataError(
                f"env.offered_tools: no server lists {unknown}; the servers list {sorted(known)}: offer those names, "
                "set env.offered_tools=null (every tool), or map the family's tool onto a server's with "
                f"env.tool_map.{unknown[0]}.tool=NAME")
        tools = [t for t in tools if t.name in set(wanted)]
    if not bind_db_id:
        return list(tools)
    out = []
    for tool in tools:
        schema = tool.input_schema
        if "db_id" in (schema.get("properties") or {}):
            schema = {**schema, "properties": {k: v for k, v in schema["properties"].items() if k != "db_id"}}
            if "required" in schema:
                schema["required"] = [r for r in schema["required"] if r != "db_id"]
            tool = tool.model_copy(update={"input_schema": schema})
        out.append(tool)
    return out


def _duplicate_tool_message(exc: MCPConfigError, config: EnvConfig) -> str:
    """The pool's start failure as one line naming the config key and the fix."""
    text = str(exc)
    if "is listed by servers" in text:
        return (f"env.mcp_servers: {text.replace('; set tool_prefix on one of them', '')}: set tool_prefix on one of "
                "them (e.g. tool_prefix: b_ makes its tools b_<name>), or drop one server")
    commands = "; ".join(f"{s.name}: {shlex.join([s.command, *s.args])}" for s in config.mcp_servers)
    return f"env.mcp_servers: {text} (commands: {commands}): check each server's command, args and cwd"


class EnvRuntime:
    """The run's MCP servers (`mcp.servers.ServerSet`) plus everything episodes of one configuration share.

    What a configuration can get wrong against its servers is checked here, as one `EnvDataError`
    line naming the key and the fix. Each episode asks the server set for its tools
    (`episode_tools`), and the original data is hashed now and checked before every scoring and at
    `close` (`rewards.originals`). `pool`: a started pool to route every call to (not owned)."""

    def __init__(self, config: EnvConfig, db_root: str | Path | None, pool: BackgroundMCPPool | None = None) -> None:
        self.config = config
        #: Absolute (a relative root is taken against the working directory now), so a later chdir
        #: cannot move the databases scoring reads away from the ones the servers serve.
        self.db_root: Path = expand_path(db_root or default_db_root()).resolve()
        #: What is specific to this kind of task (env.task_family).
        self.family: TaskFamily = resolve_family(config.task_family)
        if config.tool_call_format == "skyrl_sql" and not self.family.uses_databases:
            raise EnvDataError(f"env.tool_call_format skyrl_sql is SQL's turn format; task family "
                               f"{self.family.name!r} needs hermes")
        family_tools = dict(self.family.tools or {})
        unknown_roles = sorted(set(config.tool_map) - set(family_tools))
        if unknown_roles:
            known = ", ".join(family_tools) or "none"
            raise EnvDataError(f"env.tool_map: {unknown_roles[0]!r} is not a tool of task family {self.family.name!r} "
                               f"(its tools: {known}); map only those")
        rubric = build_rubric(config, self.family)
        self.settings = EnvSettings(
            tool_call_format=config.tool_call_format,
            sql_timeout_s=config.sql_timeout_s,
            shaping_penalty=config.shaping_penalty if config.shaping_rewards else 0.0,
            rubric=rubric,
            keep_distinct=config.reward.keep_distinct,
        )
        self.gold_cache = GoldResultCache(maxsize=config.reward.gold_cache_size)
        self._closed = False
        self.originals: OriginalData | None = None
        #: Originals found changed when the run ended (`close`), one line each.
        self.data_faults: list[str] = []
        # else the server dies at start with an opaque TaskGroup error
        if pool is None and self.family.uses_databases and not self.db_root.is_dir():
            raise EnvDataError(f"database root not found: {self.db_root}")
        #: Every server process of the run, behind one door.
        self.servers = ServerSet(config.resolved_servers(self.db_root), call_timeout_s=config.call_timeout_s,
                                 sessions_per_server=config.sessions_per_server,
                                 warm_size=config.isolation_pool_size or os.cpu_count() or 1, pool=pool)
        if pool is None:  # hashed before any server could write
            watched = self.servers.writable_originals
            if self.family.uses_databases:
                watched.extend(sorted(self.db_root.glob("*/*.sqlite")))
            self.originals = OriginalData(watched)
            try:
                self.servers.start()
            except MCPConfigError as exc:
                raise EnvDataError(_duplicate_tool_message(exc, config)) from None
        try:
            self._resolve_tools(config, family_tools)
        except BaseException:
            self.close()  # a config error must not leave server processes behind
            raise
        self._schemas: dict[str, str] = {}

    def _resolve_tools(self, config: EnvConfig, family_tools: Mapping[str, tuple[str, ...]]) -> None:
        #: Every tool the servers list (the env may read the schema with one not offered).
        self.all_tools: list[ToolSpec] = list(self.servers.tools)
        listed = {t.name: t for t in self.all_tools}
        for role, mapping in config.tool_map.items():
            if mapping.tool not in listed:
                raise EnvDataError(f"env.tool_map.{role}.tool: no server lists {mapping.tool!r}; the servers list "
                                   f"{sorted(listed)}")
            props = set((listed[mapping.tool].input_schema.get("properties") or {}))
            bad = [a for a in mapping.args.values() if a not in props]
            if bad:
                raise EnvDataError(f"env.tool_map.{role}.args: tool {mapping.tool!r} takes no argument {bad[0]!r} (it "
                                   f"takes {sorted(props) or 'none'})")
        tool_map = {role: m.tool for role, m in config.tool_map.items()}
        #: The tools offered to the policy, as it sees them (db_id hidden when bound).
        self.tools: list[ToolSpec] = offered_tools(self.all_tools, config.offered_tools, bind_db_id=config.bind_db_id,
                                                   tool_map=tool_map)
        self.tool_arg_schemas: dict[str, Mapping[str, Any]] = {t.name: t.input_schema for t in self.tools}
        #: Offered tools whose db_id argument the env fills in.
        self.db_id_bound: frozenset[str] = frozenset(
            t.name for t in self.all_tools if config.bind_db_id and "db_id" in t.input_schema.get("properties", {}))
        #: The family's own tools -> the tool that plays each (listed by a server), None when none does.
        self.family_tools: dict[str, str | None] = {
            role: (tool_map.get(role, role) if tool_map.get(role, role) in listed else None) for role in family_tools}
        offered_names = {t.name for t in self.tools}
        self.system_prompt: str = family_system_prompt(
            self.family, {role: t if t in offered_names else None for role, t in self.family_tools.items()})
        if config.schema_in_prompt and self.family.uses_databases and not self.family_tools.get("get_schema"):
            raise EnvDataError(
                f"env.schema_in_prompt is true but no server lists get_schema (the servers list {sorted(listed)}): set "
                "env.schema_in_prompt=false (the policy reads the schema with the tools), or map a tool that returns "
                "the schema with env.tool_map.get_schema.tool=NAME")
        offered = ", ".join(sorted(offered_names)) or "none"
        for server in config.mcp_servers:
            names = ", ".join(t.name for t in self.all_tools if t.server == server.name)
            logger.info("MCP server %r%s: %s; offered to the policy: %s", server.name, self.servers.describe(server.name),
                        names or "no tools", offered)

    def family_call(self, role: str, arguments: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
        """The call that plays the family's tool `role` with its own `arguments`: the mapped tool
        name and the arguments renamed for it (db_id dropped when the tool takes none)."""
        tool = self.family_tools.get(role) or role
        mapping = self.config.tool_map.get(role)
        renames = mapping.args if mapping is not None else {}
        schema = next((t.input_schema for t in self.all_tools if t.name == tool), {})
        props = schema.get("properties") or {}
        out = {renames.get(k, k): v for k, v in arguments.items()}
        if "db_id" in out and "db_id" not in props:
            out.pop("db_id")
        return tool, out

    def database_schema(self, db_id: str) -> str:
        """The get_schema tool's text for `db_id` (cached; for `schema_in_prompt`)."""
        text = self._schemas.get(db_id)
        if text is None:
            if not self.family_tools.get("get_schema"):
                raise EnvDataError("env.schema_in_prompt needs a server listing a get_schema tool (or "
                                   "env.tool_map.get_schema); none does")
            name, arguments = self.family_call("get_schema", {"db_id": db_id})
            tools = self.servers.episode_tools()  # the tool may be a server that writes: its own episode
            try:
                ((result_text, is_error),) = tools.call_sync([(name, arguments)])
            finally:
                tools.close()
            if is_error:
                raise EpisodeSetupError(f"cannot read the schema of database {db_id!r}: {result_text}")
            text = self._schemas[db_id] = result_text
        return text

    def __enter__(self) -> "EnvRuntime":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop the servers, remove the copies, and hash the originals again (`data_faults`); idempotent."""
        if self._closed:
            return
        self._closed = True
        self.servers.close()
        if self.originals is not None and not self.data_faults:
            self.data_faults = self.originals.verify()
            for fault in self.data_faults:
                logger.error("original data changed during the run: %s (episodes scored after it were not scored)",
                             fault)


_RUNTIMES: dict[tuple[Any, ...], EnvRuntime] = {}
_LOCK = threading.Lock()
_CLOSE_AT_EXIT = False


def close_runtimes() -> list[str]:
    """Close every runtime `resolve_runtime` cached (the skyrl-gym route's): servers stopped, copies
    removed, the originals hashed again. What changed, one line each (also logged). Runs at exit by
    itself, before the pools' own exit handlers; call it to have the check now."""
    with _LOCK:
        runtimes = list(_RUNTIMES.values())
        _RUNTIMES.clear()
    faults: list[str] = []
    for runtime in runtimes:
        runtime.close()
        faults.extend(runtime.data_faults)
    return faults


_LOCATION_KEYS = ("db_root", "db_path")


def _as_mapping(env_config: Any) -> dict[str, Any]:
    """The keys an env config sets (a location left null is not set)."""
    if env_config is None:
        data: dict[str, Any] = {}
    elif isinstance(env_config, EnvConfig):
        data = env_config.model_dump()
    elif hasattr(env_config, "items"):  # dict or omegaconf DictConfig (SkyRL passes one): plain values
        from omegaconf import OmegaConf

        data = {str(k): OmegaConf.to_container(v, resolve=True) if OmegaConf.is_config(v) else v
                for k, v in env_config.items()}
    else:
        raise TypeError(f"env_config must be EnvConfig, a mapping or None, not {type(env_config).__name__}")
    return {k: v for k, v in data.items() if not (k in _LOCATION_KEYS and v is None)}


def as_gym_env_config(env_config: Any, defaults: Any = None) -> SkyRLEnvConfig:
    """`SkyRLEnvConfig` from what `skyrl_gym.make` passed over `defaults` (`register_envs`): the
    keys given win, a location given replaces the defaults'. A bad key is one `env_config:` line."""
    given, base = _as_mapping(env_config), _as_mapping(defaults)
    if any(k in given for k in _LOCATION_KEYS):
        base = {k: v for k, v in base.items() if k not in _LOCATION_KEYS}
    merged = {**base, **given}
    try:
        return SkyRLEnvConfig.model_validate(merged)
    except ValidationError as exc:
        raise EnvDataError(validation_message(exc, SkyRLEnvConfig, "env_config")) from None


def _existing_root(path: str | Path, where: str) -> Path:
    """`path` made absolute (a relative one against the working directory now); it must be a directory."""
    root = expand_path(path)
    absolute = root if root.is_absolute() else Path.cwd() / root
    if not absolute.is_dir():
        base = "" if root.is_absolute() else f", relative to the working directory {Path.cwd()}"
        raise EnvDataError(f"database root not found: {absolute} ({where} = {str(path)!r}{base})")
    return absolute.resolve()


def resolve_db_root(config: SkyRLEnvConfig, extras: Mapping[str, Any]) -> Path:
    """The database root of an episode, absolute and existing: the row's `db_root`, else
    env_config `db_root`, else env_config `db_path` (with the row's `data` subdirectory, as
    skyrl-gym's text2sql env reads it), else the built-in databases (see `SkyRLEnvConfig`)."""
    if extras.get("db_root"):
        return _existing_root(extras["db_root"], "the row's db_root")
    if config.db_root:
        return _existing_root(config.db_root, "env_config db_root")
    if config.db_path:
        data = extras.get("data")
        if not data:
            return _existing_root(config.db_path, "env_config db_path")
        if data not in SKYRL_SQL_DATA_DIRS:
            known = ", ".join(f"{k} -> {v}" for k, v in SKYRL_SQL_DATA_DIRS.items())
            raise EnvDataError(f"the row's data {data!r} is not one of skyrl-gym's text2sql layouts under "
                               f"env_config db_path ({known}); give db_root instead")
        return _existing_root(Path(config.db_path) / SKYRL_SQL_DATA_DIRS[data],
                              f"env_config db_path + the row's data {data!r}")
    return default_db_root()


def resolve_runtime(env_config: Any, extras: Mapping[str, Any], defaults: Any = None) -> EnvRuntime:
    """The cached runtime for this configuration and database root, started on first use."""
    gym_config = as_gym_env_config(env_config, defaults)
    db_root = resolve_db_root(gym_config, extras)
    config = gym_config.env_config()
    key = (config.model_dump_json(), str(db_root))
    global _CLOSE_AT_EXIT
    with _LOCK:
        runtime = _RUNTIMES.get(key)
        if runtime is None:
            runtime = EnvRuntime(config, db_root)
            _RUNTIMES[key] = runtime
            if not _CLOSE_AT_EXIT:  # registered after the pool's own handler, so it runs first (LIFO)
                atexit.register(close_runtimes)
                _CLOSE_AT_EXIT = True
        return runtime
