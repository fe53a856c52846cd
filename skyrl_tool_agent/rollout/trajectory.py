"""What a rollout produces: `Trajectory` (tokens for training) and `EpisodeResult` (the outcome)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class EpisodeResult:
    """Outcome of one episode, for rewards, curriculum feedback, metrics and reports."""

    task_id: str
    db_id: str
    reward: float = 0.0
    components: dict[str, float] = field(default_factory=dict)
    solved: bool = False
    turns: int = 0
    tool_calls: int = 0
    tool_errors: int = 0
    format_errors: int = 0
    # "answer" | "max_turns" | "max_tokens" | "error" (infrastructure failure after retries)
    done_reason: str = "answer"
    final_sql: str | None = None
    # The last query the agent ran with the family's execute tool that the server answered (SQL
    # family): what it tested, against which the error anatomy reads its answer (`retyped`).
    last_query: str | None = None
    error: str | None = None
    retries: int = 0


@dataclass
class Trajectory:
    """One multi-turn episode as one token sequence.

    `token_ids` = prompt, then for each turn the sampled ids followed by the observation ids.
    `loss_mask` is 1 exactly on ids the policy sampled; `sampling_logprobs` holds their log-probs
    under the sampling distribution (0 elsewhere). Token lists are empty for text-only policies (the
    oracle).
    """

    task_id: str
    group_index: int
    messages: list[dict[str, str]]
    result: EpisodeResult
    token_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    sampling_logprobs: list[float] = field(default_factory=list)
    turn_rewards: list[float] = field(default_factory=list)
    prompt_length: int = 0
    agent_meta: list[dict[str, Any]] = field(default_factory=list)  # per turn, when the agent said more (`AgentTurn.meta`)

    @property
    def num_policy_tokens(self) -> int:
        return sum(self.loss_mask)

    def to_record(self) -> dict[str, Any]:
        """JSON-friendly view for trajectory logs and reports (no token arrays)."""
        return {
            "task_id": self.task_id,
            "group_index": self.group_index,
            "messages": self.messages,
            "turn_rewards": self.turn_rewards,
            "policy_tokens": self.num_policy_tokens,
            **({"agent_meta": self.agent_meta} if self.agent_meta else {}),
            **asdict(self.result),
        }
