"""`MCPToolEnvironment`: a skyrl-gym text environment whose tools are MCP servers.

One instance is one episode; MCP server processes are shared (`env.pools`). The turn protocol is
README's (`env.parsing`); the episode ends at the answer or after `max_turns` turns. Malformed turns get an error observation telling the model what to fix (a turn, never a raise).
The reward is returned when the episode ends, its terms in the metadata's `reward_components`.
`step` is the synchronous skyrl-gym API; `astep` is the same step for asyncio callers.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from skyrl_gym.envs.base_text_env import BaseTextEnv, BaseTextEnvStepOutput, ConversationType

from skyrl_tool_agent.config.base import default_of
from skyrl_tool_agent.config.grpo import GRPOConfig
from skyrl_tool_agent.data.tasks import Task, db_path_for
from skyrl_tool_agent.env import skyrl_sql
from skyrl_tool_agent.env.chat_format import system_prompt_with_tools, tool_to_openai
from skyrl_tool_agent.env.families import resolve_family
from skyrl_tool_agent.env.parsing import ParsedTurn, ToolCall, format_tool_response, parse_turn
from skyrl_tool_agent.env.pools import EnvDataError, EnvRuntime, as_gym_env_config, resolve_runtime
from skyrl_tool_agent.rewards.rubric import RewardBreakdown
from skyrl_tool_agent.rewards.terms import Episode

logger = logging.getLogger(__name__)

#: Turns of an episode whose dataset row does not say: `grpo.max_turns`'s default, so a SkyRL row
#: and our own run end an episode alike (SkyRL-train's generator sets every row's max_turns anyway).
DEFAULT_MAX_TURNS: int = default_of(GRPOConfig, "max_turns")


@dataclass
class _StepPlan:
    """What a parsed turn asks for, before any tool runs."""

    parsed: ParsedTurn
    calls: list[ToolCall] = field(default_factory=list)
    done: bool = False
    done_reason: str | None = None


class MCPToolEnvironment(BaseTextEnv):
    """Multi-turn tool-use episode over MCP tools, scored with execution accuracy.

    `env_config`: what `skyrl_gym.make` passes (`SkyRLEnvConfig` fields), over `default_env_config`
    (`register_envs`). `extras`: one dataset row in SkyRL-train's shape: `db_id` and
    `reward_spec.ground_truth` (or `gold_sql`) required; optional `max_turns`, `db_root`, `data`
    (skyrl-gym's `db_path` subdirectory), `system_prompt`, `reward_spec.keep_distinct`. `runtime`: a
    started `EnvRuntime` to share (default: built from `env_config`, cached per process).

    Bad input is one `EnvDataError` line, raised here, before any MCP server starts.
    """

    def __init__(
        self,
        env_config: Any = None,
        extras: Mapping[str, Any] | None = None,
        *,
        runtime: EnvRuntime | None = None,
        default_env_config: Any = None,
    ) -> None:
        super().__init__()
        extras = dict(extras or {})
        reward_spec = extras.get("reward_spec") or {}
        # The row is checked before `resolve_runtime`, which may start the MCP servers.
        family = runtime.family if runtime is not None else resolve_family(
            as_gym_env_config(env_config, default_env_config).task_family)
        ground_truth = reward_spec.get("ground_truth") or extras.get("gold_sql")
        if not ground_truth:
            what = "the gold SQL" if family.uses_databases else f"the ground truth of task family {family.name!r}"
            raise EnvDataError(f"extras: missing {what}: give reward_spec.ground_truth (SkyRL's spelling) or gold_sql")
        if family.uses_databases and not extras.get("db_id"):
            raise EnvDataError("extras: missing 'db_id' (the task's database, <db_root>/<db_id>/<db_id>.sqlite; "
                               "skyrl-gym's text2sql rows use the same key)")
        keep = reward_spec.get("keep_distinct")
        self._start(runtime or resolve_runtime(env_config, extras, default_env_config), ground_truth,
                    str(extras.get("db_id") or ""), max_turns=int(extras.get("max_turns") or DEFAULT_MAX_TURNS),
                    keep_distinct=None if keep is None else bool(keep), system_prompt=extras.get("system_prompt"))

    @classmethod
    def for_task(cls, task: Task, runtime: EnvRuntime, *, max_turns: int,
                 keep_distinct: bool | None = None) -> MCPToolEnvironment:
        """One episode of `task` on a started runtime: how our collector builds an env, with no
        SkyRL row in between (`__init__` is skyrl_gym.make's way in, from a dataset row).
        `keep_distinct`: as the row's `reward_spec.keep_distinct` (None = the runtime's)."""
        if not task.gold_sql or (runtime.family.uses_databases and not task.db_id):
            needs = "gold_sql and db_id" if runtime.family.uses_databases else "gold_sql"
            raise EnvDataError(f"task {task.task_id}: an episode needs its {needs}")
        env = cls.__new__(cls)
        BaseTextEnv.__init__(env)
        env._start(runtime, task.gold_sql, task.db_id, max_turns=max_turns, keep_distinct=keep_distinct,
                   system_prompt=None)
        return env

    def _start(self, runtime: EnvRuntime, ground_truth: str, db_id: str, *, max_turns: int,
               keep_distinct: bool | None, system_prompt: str | None) -> None:
        """The episode's state, whichever way in it was built (a row or a `Task`)."""
        #: The task's reference: the gold SQL, or another family's expected answer.
        self.gold_sql: str = ground_truth
        self.db_id: str = db_id
        self.runtime = runtime
        self.family = runtime.family
        settings = runtime.settings
        self.keep_distinct: bool = settings.keep_distinct if keep_distinct is None else keep_distinct
        #: The task's database (SQL family); None for a family without databases.
        self.db_path: Path | None = db_path_for(runtime.db_root, db_id) if self.family.uses_databases else None
        self.max_turns = max_turns
        self.style = settings.tool_call_format
        default_prompt = skyrl_sql.SYSTEM_PROMPT if self.style == "skyrl_sql" else runtime.system_prompt
        self.system_prompt: str = system_prompt or default_prompt
        self.chat_history: ConversationType = []
        self.final_sql: str | None = None
        #: The last query run with the family's execute tool that the server answered (not an error).
        self.last_query: str | None = None
        #: (tool, argument) that run a query under the tool map's names; None without databases.
        self._execute_call: tuple[str, str] | None = None
        if self.family.uses_databases:
            tool, renamed = runtime.family_call("execute_sql", {"sql": ""})
            self._execute_call = (tool, next(iter(renamed)))
        self.done = False
        self.format_errors = 0
        self.tool_calls = 0
        self.tool_errors = 0
        self.reward: RewardBreakdown | None = None
        #: This episode's tool calls (whatever a server writes is isolated per episode: `mcp.servers`).
        self.episode_tools = runtime.servers.episode_tools()

    # ----------------------------------------------------------------- prompt
    def init(self, prompt: ConversationType) -> tuple[ConversationType, dict[str, Any]]:
        """Prepend a system message listing the tools (Qwen2.5 format) to the task prompt; a system
        message in `prompt` is kept as the instruction part. With `skyrl_sql` there is no tool
        block: the prompt's system message is kept as is, else `skyrl_sql.SYSTEM_PROMPT` is used.
        """
        messages = [dict(m) for m in prompt]
        system = self.system_prompt
        if messages and messages[0].get("role") == "system":
            system = messages.pop(0)["content"]
        config = self.runtime.config
        if config.schema_in_prompt and self.db_id:
            first_user = next((m for m in messages if m.get("role") == "user"), None)
            if first_user is not None:
                schema = self.runtime.database_schema(self.db_id)
                first_user["content"] = f"Schema:\n{schema}\n{first_user['content']}"
        if self.style != "skyrl_sql":
            tools = [tool_to_openai(t.name, t.description or "", t.input_schema) for t in self.runtime.tools]
            system = system_prompt_with_tools(tools, system)
        full = [{"role": "system", "content": system}, *messages]
        self.chat_history = list(full)
        return full, {"db_id": self.db_id, "max_turns": self.max_turns, "tools": [t.name for t in self.runtime.tools],
                      "schema_in_prompt": config.schema_in_prompt, "db_id_bound": sorted(self.runtime.db_id_bound),
                      "tool_args": {t.name: sorted((t.input_schema.get("properties") or {})) for t in self.runtime.tools},
                      "family_tools": {role: {"tool": tool, "args": dict(m.args) if (m := config.tool_map.get(role)) else {}}
                                       for role, tool in self.runtime.family_tools.items() if tool}}

    # ------------------------------------------------------------------- step
    def _plan(self, action: str) -> _StepPlan:
        self.turns += 1
        self.chat_history.append({"role": "assistant", "content": action})
        bound = self.runtime.db_id_bound
        parsed = parse_turn(action, self.runtime.tool_arg_schemas, style=self.style, db_id=None if bound else self.db_id,
                            answer_hint=self.family.answer_hint)
        if self.style == "skyrl_sql":  # <sql> is the family's execute_sql: played by the tool mapped onto it
            parsed = replace(parsed, tool_calls=tuple(
                ToolCall(*self.runtime.family_call(c.name, c.arguments)) for c in parsed.tool_calls))
        if bound and self.db_id:  # the episode's database, whatever the model might have meant
            parsed = replace(parsed, tool_calls=tuple(
                ToolCall(c.name, {**c.arguments, "db_id": self.db_id}) if c.name in bound else c for c in parsed.tool_calls))
        if parsed.errors:
            self.format_errors += 1
        plan = _StepPlan(parsed=parsed)
        if parsed.answer is not None and not parsed.errors:
            self.final_sql = parsed.answer
            plan.done, plan.done_reason = True, "answer"
        elif self.turns >= self.max_turns:
            plan.done, plan.done_reason = True, "max_turns"
        else:
            plan.calls = list(parsed.tool_calls)
        return plan

    def _finish(self, plan: _StepPlan, results: Sequence[tuple[str, bool]]) -> BaseTextEnvStepOutput:
        metadata: dict[str, Any] = {"turn": self.turns, "tool_calls": [c.name for c in plan.calls]}
        if plan.parsed.errors:
            metadata["format_errors"] = list(plan.parsed.errors)
        if plan.done:
            self.done = True
            assert self.reward is not None
            metadata.update(
                done_reason=plan.done_reason,
                final_sql=self.final_sql,
                reward_components=dict(self.reward.terms),
                **self.get_metrics(),
            )
            return BaseTextEnvStepOutput(observations=[], reward=self.reward.total, done=True, metadata=metadata)

        self.tool_calls += len(results)
        self.tool_errors += sum(1 for _, is_error in results if is_error)
        self._note_tested_query(plan.calls, results)
        observation = {"role": "user", "content": self._observation_text(plan.parsed.errors, [t for t, _ in results])}
        self.chat_history.append(observation)
        metadata["tool_errors"] = sum(1 for _, e in results if e)
        failed = bool(plan.parsed.errors) or (bool(results) and all(e for _, e in results))
        reward = -self.runtime.settings.shaping_penalty if failed else 0.0
        return BaseTextEnvStepOutput(observations=[observation], reward=reward, done=False, metadata=metadata)

    def _note_tested_query(self, calls: Sequence[ToolCall], results: Sequence[tuple[str, bool]]) -> None:
        """Remember the last query of this turn that the family's execute tool answered."""
        if self._execute_call is None:
            return
        tool, argument = self._execute_call
        for call, (_, is_error) in zip(calls, results, strict=True):
            query = call.arguments.get(argument)
            if call.name == tool and not is_error and isinstance(query, str):
                self.last_query = query

    def _observation_text(self, errors: Sequence[str], results: Sequence[str]) -> str:
        """What the policy sees after a tool turn: format errors (valid calls of the same turn still
        ran: both are shown) and the tool results, in the turn format's own wrapping."""
        if self.style == "skyrl_sql":
            return skyrl_sql.observation(errors, results, turns_left=self.max_turns - self.turns)
        if not errors:
            return format_tool_response(results)
        text = "Error: " + " ".join(errors)
        return text + "\n" + format_tool_response(results) if results else text

    def score(self) -> RewardBreakdown:
        """The reward of the episode as it stands (blocking: the queries run); `step` and a caller
        that ends an episode itself (the collector, at its token budget) score by this one rule."""
        settings = self.runtime.settings
        if self.runtime.originals is not None:  # a changed original is an infrastructure fault, never a score
            self.runtime.originals.check()
        episode = Episode(
            answer=self.final_sql,
            ground_truth=self.gold_sql,
            db_path=self.db_path,
            format_ok=self.format_errors == 0 and self.final_sql is not None,
            turns=self.turns,
            tool_calls=self.tool_calls,
            tool_errors=self.tool_errors,
            format_errors=self.format_errors,
            messages=tuple(self.chat_history),
        )
        return settings.rubric.score(episode, cache=self.runtime.gold_cache, timeout_s=settings.sql_timeout_s,
                                     keep_distinct=self.keep_distinct)

    def step(self, action: str) -> BaseTextEnvStepOutput:
        """Synchronous step (skyrl-gym API): tool calls go to the shared pool's own event loop."""
        plan = self._plan(action)
        if plan.done:
            self.reward = self.score()
        results = self.episode_tools.call_sync([(c.name, c.arguments) for c in plan.calls])
        return self._finish(plan, results)

    async def astep(self, action: str) -> BaseTextEnvStepOutput:
        """The same step for asyncio callers: calls of one turn run concurrently, scoring in a thread."""
        plan = self._plan(action)
        if plan.done:
            self.reward = await asyncio.to_thread(self.score)
        results = await asyncio.gather(*(self.episode_tools.call(c.name, c.arguments) for c in plan.calls))
        return self._finish(plan, results)

    # ---------------------------------------------------------------- metrics
    def get_metrics(self) -> dict[str, Any]:
        solved = bool(self.reward and self.reward.solved)
        return {
            "turns": self.turns,
            "tool_calls": self.tool_calls,
            "tool_errors": self.tool_errors,
            "format_errors": self.format_errors,
            "solved": float(solved),
            "answered": float(self.final_sql is not None),
        }

    def close(self) -> None:
        """End the episode's own servers, if it started any (the shared pool outlives episodes and is
        closed at process exit)."""
        self.episode_tools.close()

    async def aclose(self) -> None:
        """`close` for asyncio callers (the collector)."""
        await self.episode_tools.aclose()
