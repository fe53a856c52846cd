"""`GRPOConfig` (configs/grpo_config.yaml): sampling, episode limits, the GRPO/DAPO/Dr.GRPO loss,
advantages, curriculum and step batching."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from skyrl_tool_agent.config.base import Section, knob

# The choices of the GRPO math's knobs, spelled once: the config validates them, the pure tensor
# functions in skyrl_tool_agent.grpo take them as their parameter types.
KLEstimator = Literal["k1", "k2", "k3"]
AdvantageEstimator = Literal["grpo", "dr_grpo", "rloo"]
Aggregation = Literal["token_mean", "sequence_mean", "fixed_length"]

#: Two mixes are equal when their weights sum to 1 within this tolerance.
MIX_TOLERANCE = 1e-6


class DifficultyMix(Section):
    """Sampling weights of the difficulty buckets; non-negative and summing to 1."""

    easy: float = knob(..., "Weight of easy tasks.", ge=0)
    medium: float = knob(..., "Weight of medium tasks.", ge=0)
    hard: float = knob(..., "Weight of hard tasks.", ge=0)

    @model_validator(mode="after")
    def _sums_to_one(self) -> DifficultyMix:
        total = self.easy + self.medium + self.hard
        if abs(total - 1.0) > MIX_TOLERANCE:
            raise ValueError(
                f"weights must sum to 1, got {total:.6g} (easy {self.easy}, medium {self.medium}, hard {self.hard})"
            )
        return self


class CurriculumConfig(Section):
    """Which difficulty to draw each task from over training, and which tasks to favour.

    linear: the mix moves from `start` to `end` as training goes from step 0 to training.max_steps.
    uniform: a constant mix, `fixed` if set, else proportional to the bucket sizes.
    adaptive: the linear schedule, plus per-task weights from fed-back pass rates: a task with at
    least `adaptive_min_attempts` attempts whose pass rate is above `adaptive_high` (always solved)
    or below `adaptive_low` (never solved; GRPO advantages all zero) gets `adaptive_min_weight`.
    The weights act only on tasks drawn again (once a bucket has been gone through, as on the
    frontier), so on the whole generated pool a CPU run samples exactly what linear does.
    """

    mode: Literal["linear", "uniform", "adaptive"] = knob(
        "adaptive", "How the difficulty mix evolves. See the class doc."
    )
    start: DifficultyMix = knob(
        default_factory=lambda: DifficultyMix(easy=0.3, medium=0.5, hard=0.2),
        description="Difficulty mix at step 0.",
    )
    end: DifficultyMix = knob(
        default_factory=lambda: DifficultyMix(easy=0.1, medium=0.4, hard=0.5),
        description="Difficulty mix at the last step.",
    )
    fixed: DifficultyMix | None = knob(None, "Constant mix for uniform mode; null = bucket sizes.")
    adaptive_low: float = knob(0.1, "Pass rate below which a task is down-weighted.", ge=0, le=1)
    adaptive_high: float = knob(0.9, "Pass rate above which a task is down-weighted.", ge=0, le=1)
    adaptive_min_weight: float = knob(
        0.1, "Weight of a down-weighted task (> 0 keeps every task reachable).", gt=0, le=1
    )
    adaptive_min_attempts: int = knob(4, "Attempts before a task's pass rate counts.", ge=1)
    adaptive_ema_alpha: float | None = knob(
        0.5,
        "EMA alpha for pass rates; null = cumulative. An EMA lets a task never solved early come "
        "back once the policy improves.",
        gt=0,
        le=1,
    )

    @model_validator(mode="after")
    def _thresholds_ordered(self) -> CurriculumConfig:
        if not self.adaptive_low < self.adaptive_high:
            raise ValueError(
                f"adaptive_low ({self.adaptive_low}) must be below adaptive_high ({self.adaptive_high})"
            )
        return self


class BatcherConfig(Section):
    """Turn-budget step sizing: pack tasks into a step until their expected environment turns
    (expected turns per episode by difficulty x group_size) reach `target_turns`."""

    enabled: bool = knob(
        False,
        "Size steps by expected turns instead of training.tasks_per_step. Keeps rollout work per "
        "step roughly constant as the curriculum shifts to longer tasks.",
        h100=True,
    )
    target_turns: float = knob(64.0, "Expected environment turns per step.", h100=1024.0, gt=0)
    max_batch: int = knob(16, "Most tasks per step.", h100=32, ge=1)


class GRPOConfig(Section):
    """GRPO rollouts and loss: group sampling, episode limits, clipping, KL, advantages, curriculum."""

    group_size: int = knob(8, "Episodes sampled per task (the GRPO group).", h100=16, ge=2)
    temperature: float = knob(1.0, "Sampling temperature for rollouts.", gt=0)
    top_p: float = knob(1.0, "Nucleus sampling mass (1.0 = off, keeps log-probs exact).", gt=0, le=1)
    max_new_tokens_per_turn: int = knob(128, "Token cap for one assistant turn.", h100=512, ge=1)
    max_turns: int = knob(
        3,
        "Assistant turns per episode; the episode ends (unanswered) after the last. The oracle needs 2 "
        "with the CPU env defaults (execute_sql, answer) and 4 when exploring (list tables, describe, "
        "execute, answer); a spare turn lets the policy retry after an error.",
        h100=8,
        ge=1,
    )
    max_total_tokens: int = knob(
        1536,
        "Token cap for a whole episode. It counts prompt + all turns + tool outputs; the episode "
        "ends when it is reached.",
        h100=6144,
        ge=1,
    )
    clip_eps_low: float = knob(0.2, "PPO clip range below 1 (ratio >= 1 - eps_low).", ge=0, lt=1)
    clip_eps_high: float = knob(
        0.28, "PPO clip range above 1; above clip_eps_low = DAPO clip-higher.", ge=0
    )
    kl_coef: float = knob(
        0.0,
        "Weight of the KL penalty to the reference policy. The reference is the base model (LoRA "
        "just disables the adapter); 0 = no reference forward at all (the CPU default: the "
        "reference pass cost ~25% of an update).",
        h100=0.001,
        ge=0,
    )
    kl_estimator: KLEstimator = knob(
        "k3", "KL estimator (Schulman's k1/k2/k3; k3 is unbiased and non-negative)."
    )
    entropy_coef: float = knob(
        0.0,
        "Weight of the entropy bonus: > 0 rewards entropy (exploration); < 0 minimises it "
        "(sharpening, as verl's entropy_coeff does with a negative sign).",
    )
    advantage_estimator: AdvantageEstimator = knob(
        "grpo",
        "Group advantage. grpo = (r - mean) / std; dr_grpo = r - mean (no std: no difficulty "
        "bias); rloo = leave-one-out baseline.",
    )
    scale_advantages_by_batch: bool = knob(
        False,
        "Scale by one batch-wide reward std instead of each group's (TRL scale_rewards='batch'). "
        "Rewards are centred within each group (rloo: times G / (G - 1)) and divided by the std of "
        "all rewards of the step's scored groups, so grpo and dr_grpo coincide.",
    )
    turn_credit_discount: float | None = knob(
        None,
        "Per-turn credit: discount of the shaping-reward returns added to each turn's tokens. "
        "The tokens of turn k get the episode's group-relative advantage plus sum_{j >= k} "
        "discount^(j - k) s_j over the per-turn shaping rewards s (env.shaping_rewards; the last "
        "turn's entry is the final reward, already in the advantage, and counts 0). null = off: "
        "every policy token gets the episode's advantage, and shaping rewards only show in "
        "rollouts.jsonl.",
        ge=0,
        le=1,
    )
    filter_uniform_groups: bool = knob(
        True,
        "Drop groups whose episodes all got the same reward. DAPO dynamic sampling: they carry no "
        "gradient but dilute token_mean.",
    )
    refill_rounds: int = knob(
        0,
        "DAPO dynamic sampling: up to this many extra rollout rounds per step replace the groups "
        "dropped as uniform (or as infrastructure errors) with groups of new tasks from the loader "
        "(as many new tasks as groups are missing), until the step has as many informative groups as "
        "tasks. 0 = a step trains on the groups it has. Each round "
        "is another rollout (on CPU ~0.5-0.8x a step's). Needs filter_uniform_groups.",
        ge=0,
    )
    loss_aggregation: Aggregation = knob(
        "token_mean",
        "Loss reduction. token_mean = over all policy tokens (DAPO); sequence_mean = per "
        "sequence, then over sequences (GRPO); fixed_length = sum / (B * fixed_length_normalizer) "
        "(Dr. GRPO, no length bias).",
    )
    fixed_length_normalizer: int | None = knob(
        None, "Constant length for fixed_length; null = max_total_tokens.", ge=1
    )
    curriculum: CurriculumConfig = Field(default_factory=CurriculumConfig, description="Difficulty curriculum.")
    batcher: BatcherConfig = Field(default_factory=BatcherConfig, description="Turn-budget step sizing.")

    @model_validator(mode="after")
    def _consistent(self) -> GRPOConfig:
        if self.max_total_tokens < self.max_new_tokens_per_turn:
            raise ValueError(
                f"max_total_tokens ({self.max_total_tokens}) must be >= max_new_tokens_per_turn "
                f"({self.max_new_tokens_per_turn})"
            )
        if self.refill_rounds and not self.filter_uniform_groups:
            raise ValueError(f"refill_rounds ({self.refill_rounds}) replaces groups dropped as uniform: it needs "
                             "filter_uniform_groups: true")
        return self

    def resolved_fixed_length(self) -> int:
        """The fixed_length normaliser: `fixed_length_normalizer`, else `max_total_tokens`."""
        return self.fixed_length_normalizer or self.max_total_tokens
