"""`SamplingParams`: how a turn's tokens are drawn, one small torch-free value passed whole from the
trainer and the evaluator to the engine's slots and a served model's requests (a turn's token cap
is the collector's, `TurnRequest.max_new_tokens`). The greedy rule lives here once: temperature
<= 0 is the argmax token.
"""

from __future__ import annotations

from dataclasses import dataclass

from skyrl_tool_agent.config.grpo import GRPOConfig


def is_greedy(temperature: float) -> bool:
    """Temperature 0 (or below) means greedy decoding: the argmax token, no random draw."""
    return temperature <= 0


def logprob_temperature(temperature: float) -> float:
    """The temperature a sampled token's log-prob is taken at: its sampling temperature, 1 for greedy."""
    return 1.0 if is_greedy(temperature) else temperature


@dataclass(frozen=True)
class SamplingParams:
    """Temperature (0 = greedy) and top-p (1 = the whole distribution)."""

    temperature: float = 1.0
    top_p: float = 1.0

    @classmethod
    def of(cls, grpo: GRPOConfig) -> SamplingParams:
        """Training's (`grpo.temperature`, `grpo.top_p`): the one place the config's floats become this value."""
        return cls(temperature=grpo.temperature, top_p=grpo.top_p)

    @property
    def greedy(self) -> bool:
        return is_greedy(self.temperature)

    @property
    def nucleus(self) -> bool:
        """Whether top-p truncates anything (a greedy draw ignores it)."""
        return not self.greedy and self.top_p < 1


#: Argmax at every token (top_p 1 keeps it exact): every evaluation's greedy figure.
GREEDY = SamplingParams(temperature=0.0)
