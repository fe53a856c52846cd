"""Supervised warm start on oracle trajectories: loss only on the assistant's tokens.

Conversations are tokenised with exactly the collector's segmentation (prompt; then per turn the
assistant text + `<|im_end|>` and the rendered observation), so the model is trained on the same
ids it will later see and sample during RL.
"""

from __future__ import annotations

import logging
import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from skyrl_tool_agent.env.chat_format import IM_END, render_conversation, render_observation
from skyrl_tool_agent.policy.prefix import batch_logprobs

logger = logging.getLogger(__name__)


def conversation_to_ids(messages: Sequence[dict[str, str]], tokenizer) -> tuple[list[int], list[int]]:
    """(token ids, loss mask) of a finished conversation: system + user prompt, then
    assistant/observation turns. Mask is 1 on assistant text and its end-of-turn token."""

    def enc(text: str) -> list[int]:
        return list(tokenizer(text, add_special_tokens=False)["input_ids"])

    first_assistant = next(i for i, m in enumerate(messages) if m["role"] == "assistant")
    ids = enc(render_conversation(messages[:first_assistant]))
    mask = [0] * len(ids)
    end = tokenizer.convert_tokens_to_ids(IM_END)
    i = first_assistant
    while i < len(messages):
        turn = enc(messages[i]["content"]) + [end]
        ids += turn
        mask += [1] * len(turn)
        j = i + 1
        while j < len(messages) and messages[j]["role"] != "assistant":
            j += 1
        if j > i + 1:
            obs = enc(render_observation(messages[i + 1 : j]))
            ids += obs
            mask += [0] * len(obs)
        i = j
    return ids, mask


@dataclass
class SFTSettings:
    """Warm-start recipe. The step count is bounded by the main job's 15-minute CPU budget (~0.7 s
    per step on 2 cores; see README: held-out EX is still rising there)."""

    steps: int = 600
    batch_size: int = 16
    learning_rate: float = 3e-3
    warmup_steps: int = 10
    weight_decay: float = 0.01
    max_length: int = 1536
    eval_every: int = 300
    # Wall-clock cap: the step count fits the budget on a 2-core CPU with bf16 matrix units (~0.7 s
    # per step); without them (fp32, e.g. AMD EPYC: ~1.8 s per step) the cap stops it instead.
    time_budget_minutes: float | None = 6.5
    seed: int = 0
    # bf16 autocast for the forward pass; None = on where the CPU has bf16 matrix instructions (see
    # `fast_cpu_bf16`; 1.4x faster steps measured on this project's 2-core Xeon) or on CUDA. The
    # saved weights stay fp32; RL samples and trains in the model's own dtype.
    bf16_autocast: bool | None = None


def fast_cpu_bf16() -> bool:
    """Whether this CPU has bf16 matrix instructions (AMX or AVX512-BF16), from /proc/cpuinfo.
    Without them CPU bf16 matmuls are emulated and slower than fp32."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line for line in f if line.startswith("flags")), "").split()
    except OSError:
        return False
    return "amx_bf16" in flags or "avx512_bf16" in flags


def _autocast(model: torch.nn.Module, wanted: bool | None):
    device = next(model.parameters()).device
    if wanted is None:
        wanted = device.type == "cuda" or (device.type == "cpu" and fast_cpu_bf16())
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=bool(wanted) and device.type in ("cpu", "cuda"))


@dataclass
class SFTHistory:
    """Training loss per step and held-out figures at eval steps (for the warm-start curve)."""

    loss: list[tuple[int, float]] = field(default_factory=list)
    evals: list[dict[str, float]] = field(default_factory=list)
    seconds: float = 0.0
    planned_steps: int = 0  # where the cosine schedule ends (fewer than asked when a time budget binds)


def _rng_state_to_list(state: tuple) -> list:
    version, internal, gauss = state
    return [version, list(internal), gauss]


def _rng_state_from_list(state: list) -> tuple:
    version, internal, gauss = state
    return (int(version), tuple(int(x) for x in internal), gauss)


def _collate(examples: Sequence[tuple[list[int], list[int]]], pad_id: int) -> dict[str, torch.Tensor]:
    width = max(len(ids) for ids, _ in examples)
    input_ids = torch.full((len(examples), width), pad_id, dtype=torch.long)
    attention = torch.zeros((len(examples), width), dtype=torch.long)
    labels = torch.full((len(examples), width), -100, dtype=torch.long)
    for row, (ids, mask) in enumerate(examples):
        n = len(ids)
        input_ids[row, :n] = torch.tensor(ids)
        attention[row, :n] = 1
        labels[row, :n] = torch.tensor([t if m else -100 for t, m in zip(ids, mask)])
    return {"input_ids": input_ids, "attention_mask": attention, "labels": labels}


def supervised_finetune(
    model: torch.nn.Module,
    examples: Sequence[tuple[list[int], list[int]]],
    pad_id: int,
    settings: SFTSettings,
    *,
    evaluate: Callable[[int], dict[str, float]] | None = None,
    progress: Callable[[int, float], None] | None = None,
    deadline: float | None = None,
    eval_at_seconds: Sequence[float] = (),
    train_seconds: float | None = None,
    resume: dict[str, Any] | None = None,
    after_eval: Callable[[SFTHistory, Callable[[], dict[str, Any]]], bool] | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> SFTHistory:
    """AdamW with linear warmup and cosine decay; batches of similar length to limit padding.
    Stops after `settings.steps`, at the monotonic-clock `deadline`, after
    `settings.time_budget_minutes` or after `train_seconds` of training, whichever comes first; the
    last step is always evaluated. `eval_at_seconds`: also evaluate when the training clock (wall
    time minus time spent evaluating) passes each of these marks, for curves against wall time.

    Long runs (`warmstart.plateau`): `after_eval(history, state)` is called after each evaluation;
    `state()` is everything needed to continue exactly (optimizer moments, step, data order, RNG,
    history; tensors and plain lists only, so `torch.load(weights_only=True)` reads it back), and
    returning True stops training there. `resume` is such a state: training goes on from its step
    with the same batches and learning rates an uninterrupted run would have had.

    `clock`: the monotonic clock every budget, deadline and mark reads (`deadline` is on it); tests
    pass a fake one so that what a budget holds never depends on the machine's speed."""
    rng = random.Random(settings.seed)
    data = [(ids[: settings.max_length], mask[: settings.max_length]) for ids, mask in examples]
    optimizer = torch.optim.AdamW(model.parameters(), lr=settings.learning_rate, weight_decay=settings.weight_decay)

    # The cosine schedule ends at `planned` steps. Under a time budget, the speed of the first steps
    # says how many steps fit, and the schedule is fitted to that (else a capped run would stop with
    # the learning rate still high, mid-schedule).
    planned = settings.steps
    probe = max(10, settings.warmup_steps)

    def lr_at(step: int) -> float:
        if step < settings.warmup_steps:
            return (step + 1) / settings.warmup_steps
        frac = (step - settings.warmup_steps) / max(1, planned - settings.warmup_steps)
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, frac)))

    device = next(model.parameters()).device
    history = SFTHistory()
    start = clock()
    budget_s = None if settings.time_budget_minutes is None else 60 * settings.time_budget_minutes
    if budget_s is not None:
        deadline = start + budget_s if deadline is None else min(deadline, start + budget_s)
    order: list[int] = []
    eval_marks = sorted(eval_at_seconds)
    eval_seconds = 0.0  # time spent evaluating, off the training clock
    step = 0
    if resume is not None:
        optimizer.load_state_dict(resume["optimizer"])
        step, planned, order = int(resume["step"]), int(resume["planned"]), [int(i) for i in resume["order"]]
        rng.setstate(_rng_state_from_list(resume["rng"]))
        history = SFTHistory(loss=[(int(s_), float(v)) for s_, v in resume["history"]["loss"]],
                             evals=list(resume["history"]["evals"]))
        start -= float(resume["history"]["seconds"])  # the training clock goes on where it stopped

    def state() -> dict[str, Any]:
        return {"step": step + 1, "planned": planned, "order": list(order), "rng": _rng_state_to_list(rng.getstate()),
                "optimizer": optimizer.state_dict(),
                "history": {"loss": [list(x) for x in history.loss], "evals": history.evals,
                            "seconds": clock() - start - eval_seconds}}

    def run_eval(step: int) -> bool:
        nonlocal eval_seconds
        t_eval = clock()
        model.eval()
        figures = {"step": step, "seconds": t_eval - start - eval_seconds, **evaluate(step)}
        model.train()
        history.evals.append(figures)
        logger.info("warm start step %d: %s", step, {k: v for k, v in figures.items() if not isinstance(v, list)})
        eval_seconds += clock() - t_eval
        return after_eval is not None and after_eval(history, state)

    model.train()
    while step < planned:
        if deadline is not None and clock() > deadline:
            logger.info("warm start stopped by its time budget after %d of %d steps", step, planned)
            break
        if train_seconds is not None and clock() - start - eval_seconds >= train_seconds:
            break
        if budget_s is not None and step == probe:
            fits = int(budget_s / ((clock() - start) / step))
            if fits < planned:
                planned = max(fits, step + 1)
                logger.info("warm start: %.1f min fit ~%d of %d steps; schedule fitted to %d",
                            settings.time_budget_minutes, fits, settings.steps, planned)
        if len(order) < settings.batch_size:
            # Shuffle, then sort chunks of 8 batches by length: little padding, still random order.
            idx = list(range(len(data)))
            rng.shuffle(idx)
            chunk = settings.batch_size * 8
            order = [i for c in range(0, len(idx), chunk) for i in sorted(idx[c : c + chunk], key=lambda k: len(data[k][0]))]
        batch_idx, order = order[: settings.batch_size], order[settings.batch_size :]
        batch = {k: v.to(device) for k, v in _collate([data[i] for i in batch_idx], pad_id).items()}
        with _autocast(model, settings.bf16_autocast):
            logp, _ = batch_logprobs(model, batch["input_ids"], batch["attention_mask"])  # shares the system prompt
        target = batch["labels"][:, 1:] != -100
        loss = -(logp.float() * target).sum() / target.sum().clamp(min=1)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        for group in optimizer.param_groups:
            group["lr"] = settings.learning_rate * lr_at(step)
        optimizer.step()
        history.loss.append((step + 1, loss.item()))
        if progress is not None:
            progress(step + 1, history.loss[-1][1])
        trained_s = clock() - start - eval_seconds
        due = bool(eval_marks) and trained_s >= eval_marks[0]
        while eval_marks and trained_s >= eval_marks[0]:
            eval_marks.pop(0)
        if evaluate is not None and step + 1 < planned and ((step + 1) % settings.eval_every == 0 or due):
            if run_eval(step + 1):
                step += 1
                break
        step += 1
    done = len(history.loss)  # the last step is evaluated here, whether the schedule or the clock ended it
    if evaluate is not None and done and (not history.evals or history.evals[-1]["step"] != done):
        step = done - 1  # state() names the step after the last one run
        run_eval(done)
    model.eval()
    history.seconds = clock() - start - eval_seconds
    history.planned_steps = planned
    return history
