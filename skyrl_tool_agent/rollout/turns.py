"""What passes between the collector and an agent: a `TurnRequest` per episode waiting for its next
turn, an `AgentTurn` back, and the `Agent` protocol (every agent kind: `rollout.agents`,
`rollout.openai_agent`; `rollout.agents.make_agent` picks one)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from skyrl_tool_agent.data.tasks import Task


@dataclass
class TurnRequest:
    """One episode waiting for its next assistant turn."""

    task: Task
    group_index: int
    messages: list[dict[str, str]]
    token_ids: list[int] | None  # the full token history when tokens are recorded
    max_new_tokens: int
    turn: int  # 0-based index of the turn being asked for
    seq: int = 0  # episode number within the collect() call (orders deterministic batches)
    env_info: dict[str, Any] = field(default_factory=dict)  # what `env.init` said (tools offered, ...)


@dataclass
class AgentTurn:
    text: str
    token_ids: list[int] | None = None
    logprobs: list[float] | None = None
    finish_reason: str = "stop"
    meta: dict[str, Any] = field(default_factory=dict)
    # Set when no turn could be had for a reason that says nothing about the policy (a served
    # model's 5xx after retries, or an answer over its caps or not a chat completion): the collector
    # ends the episode there, unscored (done_reason "error", this as its error), never scored wrong.
    infra_error: str | None = None


class Agent(Protocol):
    """Answers a batch of turns. Optional hooks the collector calls when an agent has them:
    `end_episode(seq)` when episode `seq` ends (an agent keeping a KV cache per episode frees it);
    `start_collection(concurrency=, max_total_tokens=)` before a collection's first episode and
    `finish_collection()` after its last; and a true `continuous` attribute means the agent
    batches on its own (each request goes to `act` at once, and answers come back turn by turn)."""

    async def act(self, requests: Sequence[TurnRequest]) -> list[AgentTurn]: ...
