"""The optimizer of a GRPO run: AdamW over the policy's trainable parameters and the learning-rate
schedule of `training.*` (warmup, then constant, linear or cosine to 0 at `max_steps`).

The schedule counts updates, not steps: it advances once per rollout batch that trained, so a step
whose groups were all dropped leaves it where it was."""

from __future__ import annotations

import math
from typing import Any

import torch

from skyrl_tool_agent.config import Config
from skyrl_tool_agent.policy.qwen import QwenPolicy


def build_optimizer(policy: QwenPolicy, config: Config) -> tuple[torch.optim.Optimizer, Any]:
    t = config.training
    optimizer = torch.optim.AdamW(
        policy.trainable_parameters(), lr=t.learning_rate, betas=tuple(t.adam_betas), eps=t.adam_eps,
        weight_decay=t.weight_decay,
    )

    def factor(step: int) -> float:
        warm = min(1.0, (step + 1) / t.warmup_steps) if t.warmup_steps else 1.0
        frac = min(1.0, step / max(1, t.max_steps))
        if t.lr_scheduler == "linear":
            return warm * (1.0 - frac)
        if t.lr_scheduler == "cosine":
            return warm * 0.5 * (1.0 + math.cos(math.pi * frac))
        return warm

    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
