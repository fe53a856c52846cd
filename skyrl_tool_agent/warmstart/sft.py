"""Supervised warm start on oracle trajectories: loss only on the assistant's tokens.

Conversations are tokenised with exactly the collector's segmentation (prompt; then per turn the
assistant text + `<|im_end|>` and the rendered observation), so the model is trained on the same
ids it will later see and sample during RL.

On CUDA nothing waits on the host: examples are packed on the device once (`PackedExamples`),
AdamW is fused, the loss is read back every `LOSS_READ_EVERY` steps and is a plain cross-entropy;
on a CPU the rows' shared system prompt is computed once per batch (`policy.prefix.batch_logprobs`,
which reads the batch back: free on a CPU, a sync on a GPU).
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
import torch.nn.functional as F

from skyrl_tool_agent.data.loader import rng_state_from_json, rng_state_to_json
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
    # bf16 autocast for the forward pass; None = on CUDA or where the CPU has bf16 matrix units
    # (`fast_cpu_bf16`). The saved weights stay fp32.
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


#: On CUDA, per-step losses stay on the device and are read back this often (and at evaluations
#: and the end): one host sync per this many steps instead of one per step.
LOSS_READ_EVERY = 50


@dataclass
class PackedExamples:
    """Every example tokenised once and held on the training device, right-padded (labels -100 off
    the loss mask); `lengths` stay on the host, so a batch's width needs no device read."""

    input_ids: torch.Tensor
    labels: torch.Tensor
    lengths: list[int]

    @classmethod
    def pack(cls, examples: Sequence[tuple[list[int], list[int]]], pad_id: int, device: torch.device | str,
             max_length: int) -> PackedExamples:
        data = [(ids[:max_length], mask[:max_length]) for ids, mask in examples]
        width = max((len(ids) for ids, _ in data), default=1)
        input_ids = torch.full((len(data), width), pad_id, dtype=torch.long)
        labels = torch.full((len(data), width), -100, dtype=torch.long)
        for row, (ids, mask) in enumerate(data):
            input_ids[row, :len(ids)] = torch.tensor(ids)
            labels[row, :len(ids)] = torch.tensor([t if m else -100 for t, m in zip(ids, mask)])
        return cls(input_ids.to(device), labels.to(device), [len(ids) for ids, _ in data])

    def __len__(self) -> int:
        return len(self.lengths)

    def batch(self, indices: Sequence[int]) -> dict[str, torch.Tensor]:
        width = max(self.lengths[i] for i in indices)
        device = self.input_ids.device
        index = torch.tensor(list(indices), dtype=torch.long)
        if device.type == "cuda":  # pinned, asynchronous: the host does not wait for the device
            index = index.pin_memory()
        index = index.to(device, non_blocking=True)
        lengths = torch.tensor([self.lengths[i] for i in indices], dtype=torch.long)
        lengths = (lengths.pin_memory() if device.type == "cuda" else lengths).to(device, non_blocking=True)
        attention = (torch.arange(width, device=device).unsqueeze(0) < lengths.unsqueeze(1)).long()
        return {"input_ids": self.input_ids.index_select(0, index)[:, :width], "attention_mask": attention,
                "labels": self.labels.index_select(0, index)[:, :width]}


def token_loss(model: torch.nn.Module, batch: dict[str, torch.Tensor], *, bf16: bool | None) -> torch.Tensor:
    """Mean negative log-likelihood of the labelled tokens of `batch` (module docstring: a plain
    cross-entropy on CUDA, the shared-prefix log-probs elsewhere)."""
    with _autocast(model, bf16):
        if next(model.parameters()).device.type == "cuda":
            logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], use_cache=False).logits
        else:
            logp, _ = batch_logprobs(model, batch["input_ids"], batch["attention_mask"])  # shares the system prompt
    if next(model.parameters()).device.type == "cuda":
        labels = batch["labels"][:, 1:]
        return F.cross_entropy(logits[:, :-1].float().reshape(-1, logits.shape[-1]), labels.reshape(-1),
                               ignore_index=-100)
    target = batch["labels"][:, 1:] != -100
    return -(logp.float() * target).sum() / target.sum().clamp(min=1)


def supervised_finetune(
    model: torch.nn.Module,
    examples: Sequence[tuple[list[int], list[int]]] | PackedExamples,
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
    epoch_examples: Callable[[int], Sequence[tuple[list[int], list[int]]]] | None = None,
) -> SFTHistory:
    """AdamW with linear warmup and cosine decay; batches of similar length to limit padding.
    `examples`: (ids, loss mask) pairs, or `PackedExamples`. Stops after `settings.steps`, at
    `deadline`, after `settings.time_budget_minutes` or `train_seconds` of training, whichever comes
    first (with `time_budget_minutes` None the schedule is `settings.steps` long); the last step is
    always evaluated, and so is each `eval_at_seconds` mark of the training clock.

    Long runs (`warmstart.plateau`): `after_eval(history, state)` is called after each evaluation;
    `state()` is everything needed to continue exactly (optimizer moments, step, data order, RNG,
    history; tensors and plain lists only, so `torch.load(weights_only=True)` reads it back), and
    returning True stops training there. `resume` is such a state: training goes on from its step
    with the same batches and learning rates an uninterrupted run would have had.

    `clock`: the monotonic clock every budget, deadline and mark reads (tests pass a fake one).
    `epoch_examples(epoch)`: each later epoch's examples (`warmstart.build.RedrawnEpochs`), the
    same for the same epoch every call, so a resumed run rebuilds the epoch it stopped in."""
    rng = random.Random(settings.seed)
    device = next(model.parameters()).device
    data = examples if isinstance(examples, PackedExamples) else PackedExamples.pack(
        examples, pad_id, device, settings.max_length)
    # AdamW, fused on CUDA (one kernel for every parameter's update), foreach elsewhere.
    optimizer = torch.optim.AdamW(model.parameters(), lr=settings.learning_rate, weight_decay=settings.weight_decay,
                                  **({"fused": True} if device.type == "cuda" else {"foreach": True}))
    read_every = LOSS_READ_EVERY if device.type == "cuda" else 1
    pending: list[tuple[int, torch.Tensor]] = []  # (step, loss on the device) not yet read back

    # Under a time budget the first steps' speed fits the cosine schedule (`planned` steps) to it, so
    # a capped run does not stop mid-schedule.
    planned = settings.steps
    probe = max(10, settings.warmup_steps)

    def lr_at(step: int) -> float:
        if step < settings.warmup_steps:
            return (step + 1) / settings.warmup_steps
        frac = (step - settings.warmup_steps) / max(1, planned - settings.warmup_steps)
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, frac)))

    history = SFTHistory()
    start = clock()
    budget_s = None if settings.time_budget_minutes is None else 60 * settings.time_budget_minutes
    if budget_s is not None:
        deadline = start + budget_s if deadline is None else min(deadline, start + budget_s)
    order: list[int] = []
    eval_marks = sorted(eval_at_seconds)
    eval_seconds = 0.0  # time spent evaluating, off the training clock
    step = 0
    epochs = 0  # passes over the data begun (each reshuffle begins one)
    if resume is not None:
        optimizer.load_state_dict(resume["optimizer"])
        epochs = int(resume.get("epochs", 0))
        if epoch_examples is not None and epochs > 1:  # the epoch it stopped in, rebuilt as it was
            data = PackedExamples.pack(epoch_examples(epochs - 1), pad_id, device, settings.max_length)
        step, planned, order = int(resume["step"]), int(resume["planned"]), [int(i) for i in resume["order"]]
        rng.setstate(rng_state_from_json(resume["rng"]))
        history = SFTHistory(loss=[(int(s_), float(v)) for s_, v in resume["history"]["loss"]],
                             evals=list(resume["history"]["evals"]))
        start -= float(resume["history"]["seconds"])  # the training clock goes on where it stopped

    def state() -> dict[str, Any]:
        return {"step": step + 1, "planned": planned, "order": list(order), "epochs": epochs,
                "rng": rng_state_to_json(rng.getstate()),
                "optimizer": optimizer.state_dict(),
                "history": {"loss": [list(x) for x in history.loss], "evals": history.evals,
                            "seconds": clock() - start - eval_seconds}}

    def read_losses() -> None:
        """The pending losses into the history (one transfer), each step's `progress` call."""
        if not pending:
            return
        values = torch.stack([v for _, v in pending]).tolist()
        for (at, _), value in zip(pending, values):
            history.loss.append((at, value))
            if progress is not None:
                progress(at, value)
        pending.clear()

    def run_eval(step: int) -> bool:
        nonlocal eval_seconds
        read_losses()
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
            if epoch_examples is not None and epochs > 0:
                t_data = clock()
                data = PackedExamples.pack(epoch_examples(epochs), pad_id, device, settings.max_length)
                logger.info("warm start epoch %d: %d examples built in %.0f s", epochs, len(data), clock() - t_data)
            epochs += 1
            # Shuffle, then sort chunks of 8 batches by length: little padding, still random order.
            idx = list(range(len(data)))
            rng.shuffle(idx)
            chunk = settings.batch_size * 8
            order = [i for c in range(0, len(idx), chunk) for i in sorted(idx[c : c + chunk], key=lambda k: data.lengths[k])]
        batch_idx, order = order[: settings.batch_size], order[settings.batch_size :]
        loss = token_loss(model, data.batch(batch_idx), bf16=settings.bf16_autocast)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        for group in optimizer.param_groups:
            group["lr"] = settings.learning_rate * lr_at(step)
        optimizer.step()
        pending.append((step + 1, loss.detach()))
        if len(pending) >= read_every:
            read_losses()
        trained_s = clock() - start - eval_seconds
        due = bool(eval_marks) and trained_s >= eval_marks[0]
        while eval_marks and trained_s >= eval_marks[0]:
            eval_marks.pop(0)
        if evaluate is not None and step + 1 < planned and ((step + 1) % settings.eval_every == 0 or due):
            if run_eval(step + 1):
                step += 1
                break
        step += 1
    read_losses()
    done = len(history.loss)  # the last step is evaluated here, whether the schedule or the clock ended it
    if evaluate is not None and done and (not history.evals or history.evals[-1]["step"] != done):
        step = done - 1  # state() names the step after the last one run
        run_eval(done)
    model.eval()
    history.seconds = clock() - start - eval_seconds
    history.planned_steps = planned
    return history
