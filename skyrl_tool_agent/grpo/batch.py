"""Trajectories -> right-padded training tensors, aligned with `token_logprobs` (position t scores
token t+1), plus group rewards -> per-token advantages."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields

import torch

from skyrl_tool_agent.grpo.advantages import (
    AdvantageEstimator,
    batch_scaled_advantages,
    group_advantages,
    informative_group_mask,
)
from skyrl_tool_agent.rollout.trajectory import Trajectory


@dataclass
class TrainBatch:
    """Shifted tensors for a set of trajectories ([B, L] for ids/attention, [B, L-1] for the rest)."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    loss_mask: torch.Tensor  # bool, sampled tokens only
    old_logp: torch.Tensor  # sampling log-probs
    advantages: torch.Tensor  # per token
    ref_logp: torch.Tensor | None = None  # the reference policy's log-probs, once computed (KL term)

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    def slice(self, rows: Sequence[int]) -> TrainBatch:
        idx = torch.as_tensor(list(rows), dtype=torch.long)
        width = int(self.attention_mask[idx].sum(dim=1).max())  # trim shared right padding
        return TrainBatch(
            self.input_ids[idx, :width],
            self.attention_mask[idx, :width],
            self.loss_mask[idx, : width - 1],
            self.old_logp[idx, : width - 1],
            self.advantages[idx, : width - 1],
            None if self.ref_logp is None else self.ref_logp[idx, : width - 1],
        )


def collate(trajectories: Sequence[Trajectory], advantages: Sequence[float | torch.Tensor], pad_id: int) -> TrainBatch:
    """Pad on the right and shift by one so every tensor lines up with next-token log-probs.

    An advantage is one float for every policy token of its episode, or a tensor with one value per
    id of `token_ids` (per-turn credit, `grpo.advantages.turn_token_advantages`)."""
    width = max(len(t.token_ids) for t in trajectories)
    n = len(trajectories)
    input_ids = torch.full((n, width), pad_id, dtype=torch.long)
    attention = torch.zeros((n, width), dtype=torch.long)
    loss_mask = torch.zeros((n, width - 1), dtype=torch.bool)
    old_logp = torch.zeros((n, width - 1), dtype=torch.float32)
    adv = torch.zeros((n, width - 1), dtype=torch.float32)
    for row, (t, a) in enumerate(zip(trajectories, advantages, strict=True)):
        k = len(t.token_ids)
        input_ids[row, :k] = torch.tensor(t.token_ids)
        attention[row, :k] = 1
        loss_mask[row, : k - 1] = torch.tensor(t.loss_mask[1:], dtype=torch.bool)
        old_logp[row, : k - 1] = torch.tensor(t.sampling_logprobs[1:], dtype=torch.float32)
        adv[row, : k - 1] = a[1:].float() if isinstance(a, torch.Tensor) else float(a)
    return TrainBatch(input_ids, attention, loss_mask, old_logp, adv * loss_mask)


def plan_micro_batches(lengths: Sequence[int], max_rows: int, max_tokens: int | None = None) -> list[list[int]]:
    """Rows (indices into `lengths`) of each forward/backward pass: without `max_tokens`, `max_rows`
    at a time in order; with it, longest first, each pass filled while rows x longest row stays
    within `max_tokens` (and `max_rows`); a row longer than the budget runs alone."""
    if max_rows < 1 or (max_tokens is not None and max_tokens < 1):
        raise ValueError("max_rows and max_tokens must be >= 1")
    order = list(range(len(lengths)))
    if max_tokens is None:
        return [order[i:i + max_rows] for i in range(0, len(order), max_rows)]
    order.sort(key=lambda r: -lengths[r])
    plan: list[list[int]] = []
    for row in order:  # longest first: a pass's first row is its longest
        if plan and len(plan[-1]) < max_rows and (len(plan[-1]) + 1) * lengths[plan[-1][0]] <= max_tokens:
            plan[-1].append(row)
        else:
            plan.append([row])
    return plan


@dataclass
class EpisodeDecisions:
    """What a step does with each of its episodes (task-major groups): the one place that decides,
    read by the update batch, `train/groups_dropped`, `reward/*` and rollouts.jsonl alike."""

    advantages: list[float]  # the outcome advantage (0 for episodes of groups that get no update)
    kept: list[bool]  # enters the update
    scored: list[bool]  # not an infrastructure failure: counts in reward/* and the curriculum
    groups_dropped: int  # groups without reward spread left out by `filter_uniform_groups`
    infra_groups: int  # groups left out because one of their episodes was never scored
    kept_groups: int = 0  # groups that enter the update


def decide_episodes(
    trajectories: Sequence[Trajectory],
    group_size: int,
    *,
    estimator: AdvantageEstimator = "grpo",
    scale_batch: bool = False,
    filter_uniform: bool = True,
) -> EpisodeDecisions:
    """Advantages and kept flags for one step's episodes, `group_size` per task in task order.

    A group with an infrastructure failure would skew its baseline, so it is left out whole (also of
    `scale_batch`'s statistics); groups without reward spread are dropped when `filter_uniform`;
    episodes without token ids are never kept."""
    scored = [tr.result.done_reason != "error" for tr in trajectories]
    groups = len(trajectories) // group_size
    clean = torch.tensor([all(scored[i * group_size:(i + 1) * group_size]) for i in range(groups)], dtype=torch.bool)
    rewards = torch.tensor([tr.result.reward for tr in trajectories], dtype=torch.float32).view(groups, group_size)
    adv = torch.zeros_like(rewards)
    informative = torch.zeros(groups, dtype=torch.bool)
    if bool(clean.any()):
        informative[clean] = informative_group_mask(rewards[clean])
        adv[clean] = (batch_scaled_advantages(rewards[clean], estimator) if scale_batch
                      else group_advantages(rewards[clean], estimator))
    keep_group = clean & informative if filter_uniform else clean
    kept = [bool(keep_group[i // group_size]) and bool(tr.token_ids) for i, tr in enumerate(trajectories)]
    dropped = int((clean & ~informative).sum()) if filter_uniform else 0
    return EpisodeDecisions(adv.reshape(-1).tolist(), kept, scored, dropped, int((~clean).sum()), int(keep_group.sum()))


def on_device(batch: TrainBatch, device: torch.device) -> TrainBatch:
    """`batch` with every tensor on `device` (collated batches live on the CPU)."""
    return TrainBatch(**{f.name: None if getattr(batch, f.name) is None else getattr(batch, f.name).to(device)
                         for f in fields(batch)})
