"""`RolloutEngine`: continuous-batching sampling over a slot KV cache, with CUDA-graph decode steps.

The engine keeps each episode in a *slot* of one preallocated KV cache from its first turn to its
end, so a later turn prefills only the tokens appended since. A worker thread runs the loop of
vLLM's continuous batching:

    admit the turns that arrived (prefill) -> decode `stop_check_interval` steps for every row in
    flight -> read the new tokens back once, finish the rows that hit a stop id or their token cap

The system prompt every fresh prompt shares becomes the cache's *root*, stored once; a prompt a
GRPO group shares is run once and its keys copied to the others' slots. The forward is
`slot_model.SlotModel`; tokens come from a per-episode seed (`token_sampling`); the weights are a
`weights.SamplingWeights` snapshot refreshed in place when no row is in flight, so captured graphs
stay valid and the engine is built once per run.

It gets the slots that fit its memory budget (`memory.plan`); a fresh episode that finds every
slot taken waits, in arrival order, and draws the tokens it would have drawn.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Hashable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import NamedTuple

import torch

from skyrl_tool_agent.config import ModelConfig
from skyrl_tool_agent.config.base import default_of
from skyrl_tool_agent.kernels.cpu_threads import release_thread_pool
from skyrl_tool_agent.memory import model as memory_model
from skyrl_tool_agent.memory.device import device_memory, format_bytes
from skyrl_tool_agent.memory.plan import SlotPlan, plan_slots
from skyrl_tool_agent.policy.prefix import MIN_SHARED_PREFIX, common_prefix_length
from skyrl_tool_agent.policy.slot_model import SlotModel, default_prefill_tokens
from skyrl_tool_agent.policy.sampling_params import SamplingParams
from skyrl_tool_agent.policy.weights import SamplingWeights

logger = logging.getLogger(__name__)

# Seconds without work after which the worker thread frees its OpenMP threads (`cpu_threads`).
IDLE_RELEASE_S = 0.05
# What a finished turn resolves to: sampled ids, their log-probs, whether it ended on a stop id.
TurnResult = tuple[list[int], list[float], bool]


class EpisodeTurn(NamedTuple):
    """One turn to sample: episode `key`'s `prompt` (its whole history), at most `max_new_tokens`
    new tokens drawn from `seed`."""

    prompt: Sequence[int]
    max_new_tokens: int
    key: Hashable
    seed: int


@dataclass
class _Request:
    prompt: list[int]
    params: SamplingParams
    max_new_tokens: int
    key: Hashable
    seed: int
    future: Future = field(default_factory=Future)
    waiting: bool = False  # found every slot taken
    waited_since: float = 0.0  # when it first found every slot taken (perf_counter)


@dataclass
class _Slot:
    index: int
    key: Hashable | None = None
    tokens: list[int] = field(default_factory=list)  # ids whose keys/values are valid at 0..len-1
    root: int = 0  # of those, the first `root` are read from the root slot


@dataclass
class _Row:
    """A turn being decoded: its slot's valid KV ends at `length`; the next token to read back is
    at position `read` of the slot's token history."""

    slot: _Slot
    request: _Request
    length: int
    read: int
    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)


class RolloutEngine:
    """Samples turns of many episodes at once for a Qwen2 (see the module docstring).

    `weights`: the snapshot, or a model to take one of. `slots`: episodes wanted in flight; the
    engine gets what fits `memory_fraction` (`self.plan`). `capacity`: most tokens an episode holds.
    `stop_check_interval`: decode steps between reads of the sampled tokens (default 8 on CUDA, 1
    on CPU). `cuda_graphs`, `attention`, `prefill_tokens`: `slot_model.SlotModel`'s.
    """

    def __init__(self, weights: SamplingWeights | torch.nn.Module, *, slots: int, capacity: int,
                 stop_ids: Sequence[int], pad_id: int, stop_check_interval: int | None = None,
                 memory_fraction: float | None = None, reserved_bytes: int = 0, cuda_graphs: bool | None = None,
                 attention: str | None = None, prefill_tokens: int | None = None) -> None:
        self.weights = weights if isinstance(weights, SamplingWeights) else SamplingWeights(weights)
        on_cuda = self.weights.device.type == "cuda"
        self.demand, self.interval = slots, stop_check_interval or (8 if on_cuda else 1)
        self.max_tokens = capacity  # most tokens an episode may hold
        self.capacity = capacity + self.interval + 2  # cache positions: a row may decode `interval` steps past its cap
        self.stop_ids = list(stop_ids)
        prefill_tokens = prefill_tokens or default_prefill_tokens(self.weights.device)
        # Planned after the snapshot exists, so the budget counts it as in use.
        self.plan = self._plan_slots(slots, memory_fraction or default_of(ModelConfig, "engine_memory_fraction"),
                                     prefill_tokens, reserved_bytes)
        logger.info(self.plan.describe())
        slots = self.slots = self.plan.slots
        self.step = SlotModel(self.weights, slots=slots, capacity=self.capacity, pad_id=pad_id,
                              cuda_graphs=cuda_graphs, attention=attention, prefill_tokens=prefill_tokens)
        self.stats = self.step.stats  # counters for benchmarks and logs (prefill_s: admission, synchronised)
        self.stats["waited"] = 0  # fresh episodes that found every slot taken and waited for one
        self.stats["wait_s"] = 0.0  # the seconds they waited, summed
        self.stats["slot_moves"] = 0  # rows moved to pack the rows being decoded (`_pack_rows`)
        self._slots = [_Slot(i) for i in range(slots)]
        self._free = list(reversed(self._slots))
        self.root_tokens: list[int] = []  # what the root slot holds
        self._root_refresh = self.weights.refreshes  # the weights the root was computed with
        self._by_key: dict[Hashable, _Slot] = {}
        self._rows: list[_Row] = []
        self._waiting: list[_Request] = []
        self._inbox: queue.Queue = queue.Queue()
        self._thread: threading.Thread | None = None
        self._closed = False

    def _plan_slots(self, demand: int, fraction: float, prefill_tokens: int, update_bytes: int) -> SlotPlan:
        memory = device_memory(self.weights.device)
        setup = memory_model.Setup(self.weights.shape, dtype_bytes=self.weights.dtype.itemsize)
        working = int(memory_model.engine_working_bytes(setup, rows=demand, capacity=self.capacity,
                                                        chunk_tokens=prefill_tokens))
        size = format_bytes
        explanation = (f"{fraction:g} x {size(memory.total)} {memory.where} - {size(memory.in_use)} in use "
                       f"- {size(working)} forward working set"
                       + (f" - {size(update_bytes)} reserved for the update" if update_bytes else ""))
        return plan_slots(demand=demand, capacity=self.capacity, bytes_per_token=memory_model.kv_bytes_per_token(setup),
                          memory_bytes=memory.total, fraction=fraction,
                          reserved_bytes=memory.in_use + working + update_bytes, explanation=explanation)

    # ------------------------------------------------------------------ public API (any thread)
    def submit_all(self, turns: Sequence[EpisodeTurn], params: SamplingParams) -> list[Future]:
        """Queue `turns`, sampled with `params`, each a turn of its episode `key` (a continuation when
        its prompt extends what the episode's slot holds, else a fresh start); each future resolves
        to (ids, log-probs, stopped). They are admitted together: the worker never starts some of
        them a decode step before the others, so a lockstep batch is prefilled and decoded the same
        way however the threads are scheduled (exactly reproducible runs and resumes)."""
        requests = [_Request(list(t.prompt), params, t.max_new_tokens, t.key, t.seed & 0x7FFFFFFF) for t in turns]
        for request in requests:
            if not request.prompt:
                request.future.set_exception(ValueError("empty prompt"))
            elif len(request.prompt) + request.max_new_tokens > self.max_tokens:
                request.future.set_exception(ValueError(
                    f"prompt of {len(request.prompt)} tokens + {request.max_new_tokens} new exceeds the engine's "
                    f"capacity ({self.max_tokens} tokens per episode)"))
        queued = [request for request in requests if not request.future.done()]
        if queued:
            self._start()
            # The caller now waits for the engine: its OpenMP threads would only slow the engine's.
            release_thread_pool()
            self._inbox.put(("turns", queued))
        return [request.future for request in requests]

    def release(self, key: Hashable) -> None:
        """Episode `key` has ended: its slot is free for another."""
        self._inbox.put(("release", key))

    def close(self) -> None:
        """Stop the worker thread (pending turns fail) and free the cache."""
        self._closed = True
        self._inbox.put(("close", None))
        if self._thread is not None:
            self._thread.join()
        self.step.close()

    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams, *, max_new_tokens: int,
                 seeds: Sequence[int]) -> list[TurnResult]:
        """One turn per prompt, blocking; each prompt is its own episode (released after)."""
        turns = [EpisodeTurn(prompt, max_new_tokens, ("generate", id(self), i, s), s)
                 for i, (prompt, s) in enumerate(zip(prompts, seeds))]
        futures = self.submit_all(turns, params)
        for future, turn in zip(futures, turns):
            # Freed as soon as its turn is done: with more prompts than slots the others wait for it.
            future.add_done_callback(lambda _, key=turn.key: self.release(key))
        return [f.result() for f in futures]

    # ------------------------------------------------------------------ worker thread
    def _start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="rollout-engine", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while not self._closed:
            try:
                self._serve_inbox(block=not self._rows)
                if self._rows:
                    self._decode_chunk()
            except Exception as exc:  # noqa: BLE001 - fail the turns in flight, keep serving
                logger.exception("rollout engine step failed")
                for row in self._rows:
                    self._free_slot(row.slot)
                    if not row.request.future.done():
                        row.request.future.set_exception(exc)
                self._rows = []
        for row in self._rows:
            row.request.future.set_exception(RuntimeError("rollout engine closed"))
        for request in self._waiting:
            request.future.set_exception(RuntimeError("rollout engine closed"))

    def _serve_inbox(self, block: bool) -> None:
        messages = []
        if block:
            try:
                messages.append(self._inbox.get(timeout=IDLE_RELEASE_S))
            except queue.Empty:  # idle (e.g. between steps): free the OpenMP threads for the update's
                release_thread_pool()
                messages.append(self._inbox.get())
        while True:
            try:
                messages.append(self._inbox.get_nowait())
            except queue.Empty:
                break
        turns = []
        for kind, payload in messages:
            if kind == "turns":
                turns.extend(payload)
            elif kind == "release":
                slot = self._by_key.get(payload)
                if slot is not None and not any(r.slot is slot for r in self._rows):
                    self._free_slot(slot)
            else:
                self._closed = True
        if self._waiting or turns:
            turns, self._waiting = [*self._waiting, *turns], []
            start = time.perf_counter()
            self._admit(turns)
            if self.weights.device.type == "cuda":
                torch.cuda.synchronize(self.weights.device)
            self.stats["prefill_s"] += time.perf_counter() - start

    def _free_slot(self, slot: _Slot) -> None:
        if self._by_key.get(slot.key) is slot:
            del self._by_key[slot.key]
        slot.key, slot.tokens, slot.root = None, [], 0
        self._free.append(slot)

    # ------------------------------------------------------------------ admission and prefill
    def _admit(self, requests: list[_Request]) -> None:
        if not self._rows and not self._by_key and not self.weights.is_current():
            self.weights.refresh_()  # once per optimizer step: no episode holds old keys/values
        if self.weights.refreshes != self._root_refresh:  # (a sharded model's refresh comes from its policy)
            self.root_tokens, self._root_refresh = [], self.weights.refreshes  # the root's keys are of old weights
        continuing: list[tuple[_Request, _Slot]] = []
        fresh: list[tuple[_Request, _Slot]] = []
        for request in requests:
            slot = self._by_key.get(request.key)
            if slot is not None and (len(slot.tokens) >= len(request.prompt)
                                     or request.prompt[:len(slot.tokens)] != slot.tokens):
                self._free_slot(slot)  # not a continuation (e.g. a retried episode): start afresh
                slot = None
            if slot is not None:
                continuing.append((request, slot))
                continue
            if not self._free:  # every slot taken: wait (in arrival order) for an episode to end
                if not request.waiting:
                    self.stats["waited"] += 1
                    request.waiting, request.waited_since = True, time.perf_counter()
                self._waiting.append(request)
                continue
            if request.waiting:
                self.stats["wait_s"] += time.perf_counter() - request.waited_since
            slot = self._free.pop()
            slot.key, slot.tokens = request.key, []
            self._by_key[request.key] = slot
            fresh.append((request, slot))
        if not continuing and not fresh:
            return
        if fresh:
            self._set_root([r.prompt for r, _ in fresh])
        for request, slot in fresh:
            slot.root = self._reads_root(request.prompt)
        admitted = continuing + fresh
        self.step.set_slots([s.index for _, s in admitted], [r.seed for r, _ in admitted],
                            [r.params for r, _ in admitted], [s.root for _, s in admitted])
        work = [(s.index, len(s.tokens), r.prompt[len(s.tokens):]) for r, s in continuing]
        # A prompt several fresh episodes ask for (a GRPO group) runs once, all but its last token,
        # and its keys are copied to the others' slots; each then runs its last token and draws.
        siblings: dict[tuple[int, ...], list[_Slot]] = {}
        for request, slot in fresh:
            siblings.setdefault(tuple(request.prompt), []).append(slot)
        stems = [(slots[0].index, slots[0].root, list(prompt[slots[0].root:-1]))
                 for prompt, slots in siblings.items() if len(slots) > 1 and len(prompt) - 1 > slots[0].root]
        if stems:
            self.step.prefill(stems, sample=False)
        for prompt, slots in siblings.items():
            if len(slots) > 1:
                if len(prompt) - 1 > slots[0].root:
                    self.step.copy_positions(slots[0].index, [s.index for s in slots[1:]], slots[0].root, len(prompt) - 1)
                work += [(s.index, len(prompt) - 1, [prompt[-1]]) for s in slots]
            else:
                work.append((slots[0].index, slots[0].root, list(prompt[slots[0].root:])))
        self.step.prefill(work, sample=True, nucleus=any(r.params.nucleus for r, _ in admitted))
        for request, slot in admitted:
            slot.tokens = list(request.prompt)
            self._rows.append(_Row(slot, request, len(request.prompt), len(request.prompt)))

    def _set_root(self, prompts: list[list[int]]) -> None:
        """Make the fresh `prompts`' common prefix the root (all but the last token when they are
        copies of one prompt), unless a held slot still reads the root or it is the root already.
        Computed once, in the root slot."""
        if any(slot.root for slot in self._by_key.values() if slot.tokens):
            return  # episodes in flight read the current root
        distinct = [list(p) for p in dict.fromkeys(tuple(p) for p in prompts)]
        shared = common_prefix_length(distinct) if len(distinct) > 1 else len(distinct[0]) - 1
        if shared < MIN_SHARED_PREFIX or distinct[0][:shared] == self.root_tokens:
            return  # (a root that does not fit a prompt is not read by it: `_reads_root`)
        self.root_tokens = list(distinct[0][:shared])
        self.step.slot_root[self.step.root] = 0
        self.step.prefill([(self.step.root, 0, self.root_tokens)], sample=False)

    def _reads_root(self, prompt: list[int]) -> int:
        """How many of the root's positions `prompt` can read: their common prefix (each prompt
        keeps one own token), when it is long enough to be worth it."""
        limit = min(len(self.root_tokens), len(prompt) - 1)
        shared = next((i for i in range(limit) if prompt[i] != self.root_tokens[i]), limit)
        return shared if shared >= MIN_SHARED_PREFIX else 0

    def _pack_rows(self) -> None:
        """Move the rows being decoded into slots 0..n-1 (swapping with what holds them), so the
        torch attention reads their keys as one view instead of copying them every decode step."""
        rows = len(self._rows)
        movers = [r for r in self._rows if r.slot.index >= rows]
        if not movers:
            return
        taken = {r.slot.index for r in self._rows}
        by_index = {slot.index: slot for slot in self._slots}
        holes = (i for i in range(rows) if i not in taken)
        for row, hole in zip(movers, holes):
            other = by_index[hole]  # held between turns (its tokens' keys), or free (nothing)
            self.step.swap_slots(row.slot.index, hole, max(row.length, len(other.tokens)))
            other.index, row.slot.index = row.slot.index, hole
            self.stats["slot_moves"] += 1

    def _decode_chunk(self) -> None:
        if self.step.reads_consecutive_rows_in_place:
            self._pack_rows()
        rows = self._rows = sorted(self._rows, key=lambda r: r.slot.index)  # consecutive slots: no gather
        starts = [r.length for r in rows]
        nucleus = any(r.request.params.nucleus for r in rows)
        ids, logps = self.step.decode([r.slot.index for r in rows], starts, self.interval, nucleus)
        still: list[_Row] = []
        for row, start, row_ids, row_logps in zip(rows, starts, ids, logps):
            row.length = start + self.interval
            if not self._take(row, start, row_ids, row_logps):
                still.append(row)
        self._rows = still

    def _take(self, row: _Row, start: int, ids: list[int], logps: list[float]) -> bool:
        """Append the row's new tokens up to its stop id or cap; True (and the turn resolved) if it ended."""
        for offset, (token, logp) in enumerate(zip(ids, logps)):
            position = start + offset
            if position < row.read:
                continue
            row.read = position + 1
            row.ids.append(token)
            row.logprobs.append(logp)
            stopped = token in self.stop_ids
            if stopped or len(row.ids) >= row.request.max_new_tokens:
                # Valid keys/values: the prompt and every sampled token but the last (never fed).
                row.slot.tokens = row.request.prompt + row.ids[:-1]
                row.request.future.set_result((row.ids, row.logprobs, stopped))
                return True
        return False
