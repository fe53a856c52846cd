"""Agents the collector can drive: the model (`PolicyAgent`), the scripted oracle (`OracleAgent`), a
served model (`openai_agent.OpenAIChatAgent`), and `make_agent`, the one place that picks among them.

Model agents return sampled token ids + log-probs and expose the `tokenizer` the collector records
tokens with; text agents return text, which the collector tokenises when it records tokens.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import sqlglot
from sqlglot import exp

from skyrl_tool_agent.data.tasks import Task
from skyrl_tool_agent.env.chat_format import format_answer, format_tool_call
from skyrl_tool_agent.policy.sampling_params import GREEDY, SamplingParams
from skyrl_tool_agent.rollout.turns import Agent, AgentTurn, TurnRequest, as_agent

__all__ = ["Agent", "AgentTurn", "OracleAgent", "PolicyAgent", "SamplingPolicy", "ScriptedAgent", "TurnRequest",
           "make_agent", "oracle_turn_texts"]


class SamplingPolicy(Protocol):
    """What `PolicyAgent` samples from: `policy.qwen.QwenPolicy` (and its ZeRO-3 subclass)."""

    tokenizer: Any

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams, *, max_new_tokens: int,
                 seeds: Sequence[int] | None = None) -> list[Any]:
        """One sampled continuation per prompt, each drawn from its seed."""

    def rollout_engine(self, *, slots: int, capacity: int) -> Any:
        """The continuous-batching engine for `slots` episodes of `capacity` tokens, or None (none)."""


class PolicyAgent(Agent):
    """Samples turns from a `QwenPolicy`: through its `RolloutEngine` each turn is submitted as it
    arrives and resolves when its own tokens are done (`continuous`); without an engine a batch of
    turns is generated in a worker thread. Each episode is seeded from one torch-RNG draw per
    collection and its number, so its tokens do not depend on what it was batched with.
    """

    def __init__(self, policy: SamplingPolicy, params: SamplingParams) -> None:
        self.policy = policy
        self.params = params
        self.tokenizer = policy.tokenizer  # the collector records tokens with it
        self.engine: Any = None
        self._base_seed = 0

    @property
    def continuous(self) -> bool:  # type: ignore[override]  # the engine batches turn by turn
        return self.engine is not None

    def start_collection(self, *, concurrency: int, max_total_tokens: int) -> None:
        """Open the policy's rollout engine for `concurrency` episodes of `max_total_tokens`, where it has one."""
        self.engine = self.policy.rollout_engine(slots=concurrency, capacity=max_total_tokens)
        import torch  # the sampling seed comes from the caller's torch RNG (seeded per training step)

        self._base_seed = int(torch.randint(0, 2**31 - 1, ()).item())

    def finish_collection(self) -> None:
        """The collection is over (the engine stays with the policy for the next one)."""
        self.engine = None

    async def act(self, requests: Sequence[TurnRequest]) -> list[AgentTurn]:
        from skyrl_tool_agent.policy.token_sampling import episode_seed

        seeds = [episode_seed(self._base_seed, r.seq) for r in requests]  # the collection's draw, the episode's number
        if self.engine is not None:
            from skyrl_tool_agent.policy.engine import EpisodeTurn

            # One submission: a lockstep batch is admitted whole, however the engine's thread is scheduled.
            turns = [EpisodeTurn(r.token_ids or [], r.max_new_tokens, r.seq, seed) for r, seed in zip(requests, seeds)]
            futures = [asyncio.wrap_future(f) for f in self.engine.submit_all(turns, self.params)]
            results = [(ids, logps) for ids, logps, _ in await asyncio.gather(*futures)]
        else:
            generations = await asyncio.to_thread(self.policy.generate, [r.token_ids or [] for r in requests],
                                                  self.params, max_new_tokens=max(r.max_new_tokens for r in requests),
                                                  seeds=seeds)
            results = [(g.token_ids, g.logprobs) for g in generations]
        return [self._turn(request, *result) for request, result in zip(requests, results)]

    def _turn(self, request: TurnRequest, token_ids: list[int], logprobs: list[float]) -> AgentTurn:
        ids, logps = token_ids[: request.max_new_tokens], logprobs[: request.max_new_tokens]
        text = self.policy.tokenizer.decode(ids, skip_special_tokens=True)
        return AgentTurn(text=text, token_ids=ids, logprobs=logps)

    def end_episode(self, seq: int) -> None:
        """The collector's episode `seq` has ended: its engine slot is released now, so memory
        follows the episodes in flight, not every episode of the collection."""
        if self.engine is not None:
            self.engine.release(seq)


@functools.lru_cache(maxsize=8192)  # the oracle asks for every turn of every episode
def gold_tables(sql: str) -> tuple[str, ...]:
    """Tables a query reads, in order of first appearance (CTE names excluded)."""
    try:
        tree = sqlglot.parse_one(sql, read="sqlite")
    except sqlglot.errors.SqlglotError:
        return ()
    ctes = {c.alias_or_name.lower() for c in tree.find_all(exp.CTE)}
    seen: list[str] = []
    for table in tree.find_all(exp.Table):
        name = table.name
        if name and name.lower() not in ctes and name.lower() not in [s.lower() for s in seen]:
            seen.append(name)
    return tuple(seen)


def oracle_turn_texts(task: Task, env_info: Mapping[str, Any] | None = None, *, describe: bool = True) -> list[str]:
    """The scripted oracle's turns for an env's `env_info`: list and describe the gold query's tables
    (unless the schema is in the prompt), execute the gold SQL, submit it; tools not offered are
    skipped, and describe_table when max_turns leaves no room."""
    info = env_info or {}
    offered = info.get("tools")
    bound = set(info.get("db_id_bound") or ())
    takes = info.get("tool_args")  # offered tool -> its argument names (None: every tool takes db_id)
    #: The family's tools -> the server tool that plays each and its argument names (`env.tool_map`).
    roles = info.get("family_tools") or {}

    def call(name: str, **arguments: Any) -> str:
        role = roles.get(name) or {}
        tool, renames = role.get("tool", name), role.get("args") or {}
        arguments = {renames.get(k, k): v for k, v in arguments.items()}
        wants_db_id = tool not in bound and (takes is None or "db_id" in takes.get(tool, ()))
        return format_tool_call(tool, {"db_id": task.db_id, **arguments} if wants_db_id else arguments)

    def has(name: str) -> bool:
        tool = (roles.get(name) or {}).get("tool", name)
        return offered is None or tool in offered

    turns = []
    if not info.get("schema_in_prompt"):
        if has("list_tables"):
            turns.append(call("list_tables"))
        tables = gold_tables(task.gold_sql)
        if describe and tables and has("describe_table"):
            turns.append("\n".join(call("describe_table", table=t) for t in tables))
    if has("execute_sql"):
        turns.append(call("execute_sql", sql=task.gold_sql))
    turns.append(format_answer(task.gold_sql))
    if describe and len(turns) > info.get("max_turns", len(turns)):  # no room: skip describe_table
        return oracle_turn_texts(task, env_info, describe=False)
    return turns


class ScriptedAgent(Agent):
    """Needs no model: answers turn t of an episode with `script(request)[t]` (its last turn again
    past the end). Drives the real env end to end: tests, warm-start data, a task family's oracle."""

    def __init__(self, script: Callable[[TurnRequest], Sequence[str]]) -> None:
        self.script = script

    async def act(self, requests: Sequence[TurnRequest]) -> list[AgentTurn]:
        out = []
        for r in requests:
            turns = self.script(r)
            out.append(AgentTurn(text=turns[min(r.turn, len(turns) - 1)]))
        return out


class OracleAgent(ScriptedAgent):
    """The SQL family's scripted oracle (`oracle_turn_texts`): it adapts its script to the env's
    tools and max_turns."""

    def __init__(self, *, describe: bool = True) -> None:
        super().__init__(lambda r: oracle_turn_texts(r.task, r.env_info, describe=describe))


def make_agent(policy: Any, params: SamplingParams = GREEDY, *, seed: int = 0) -> Agent:
    """The agent for `policy`: 'oracle' -> `OracleAgent`, an `Endpoint` -> `OpenAIChatAgent`, a
    `SamplingPolicy` -> `PolicyAgent`, an `Agent` -> itself. Model agents sample with `params`
    (default greedy).
    """
    from skyrl_tool_agent.rollout.openai_agent import Endpoint, OpenAIChatAgent

    if hasattr(policy, "act"):  # an agent already (`as_agent` names the fix for one not deriving from Agent)
        return as_agent(policy)
    if isinstance(policy, Endpoint):
        return OpenAIChatAgent(policy, params, seed=seed)
    if isinstance(policy, str):
        if policy != "oracle":
            raise ValueError(f"unknown policy {policy!r}: 'oracle', an Endpoint, a QwenPolicy or an Agent")
        return OracleAgent()
    return PolicyAgent(policy, params)
