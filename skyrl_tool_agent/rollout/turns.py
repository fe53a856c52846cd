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


class Agent(Protocol):
    """Answers a batch of turns. An agent that keeps state per episode between turns (a KV cache)
    may also have `end_episode(seq)`, which the collector calls when episode `seq` ends."""

    async def act(self, requests: Sequence[TurnRequest]) -> list[AgentTurn]: ...
