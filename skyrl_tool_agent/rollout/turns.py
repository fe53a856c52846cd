"""What passes between the collector and an agent: a `TurnRequest` per episode waiting for its next
turn, an `AgentTurn` back, and the `Agent` protocol (every agent kind: `rollout.agents`,
`rollout.openai_agent`; `rollout.agents.make_agent` picks one), and `as_agent`, the check every
agent passes before the collector drives it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from abc import abstractmethod
from typing import Any, Protocol, runtime_checkable

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
    meta: dict[str, Any] = field(default_factory=dict)
    # Set when no turn could be had for a reason that says nothing about the policy (a served model's
    # 5xx after retries, an answer over its caps): the collector ends the episode unscored.
    infra_error: str | None = None


@runtime_checkable
class Agent(Protocol):
    """What the collector drives: `start_collection`, then `act` with the turns waiting (a batch, or
    one at a time when `continuous`), `end_episode` as each ends, `finish_collection`. An agent
    writes `act`; the other hooks' defaults do nothing.
    """

    #: True: the agent batches on its own (each request goes to `act` at once and the answers come
    #: back turn by turn, as the rollout engine's do); False: the collector batches the requests.
    continuous: bool = False
    #: The tokenizer of the agent's token ids (a collector recording tokens uses it); None: text only.
    tokenizer: Any = None

    @abstractmethod
    async def act(self, requests: Sequence[TurnRequest]) -> list[AgentTurn]:
        """One turn per request, in order."""

    def start_collection(self, *, concurrency: int, max_total_tokens: int) -> None:
        """A collection starts: up to `concurrency` episodes of up to `max_total_tokens` tokens at once."""

    def finish_collection(self) -> None:
        """The collection's last episode has ended (what it held can go, e.g. for an update's memory)."""

    def end_episode(self, seq: int) -> None:
        """Episode `seq` of the collection has ended (its per-episode state, e.g. a KV cache, can go)."""


def as_agent(agent: Any) -> Agent:
    """`agent` itself when it is an `Agent`; a `TypeError` naming the fix for an object with an
    `act` that does not derive from `Agent` (the collector would call hooks it lacks)."""
    if isinstance(agent, Agent):
        return agent
    raise TypeError(f"{type(agent).__name__} is not an Agent: derive it from skyrl_tool_agent.rollout.turns.Agent "
                    "(it writes `async act(requests)`; the collection hooks have defaults)")
