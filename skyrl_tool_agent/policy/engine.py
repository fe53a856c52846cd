"""`RolloutEngine`: continuous-batching sampling over a slot KV cache, with CUDA-graph decode steps.

The rollout of a GRPO step is hundreds of multi-turn episodes whose turns end at different times
and whose tool calls take different times. The engine keeps every episode of a collection in a
*slot* of one preallocated KV cache (`[slots + 1, kv_heads, capacity, head_dim]` per layer; the
extra slot is scratch for padding rows) from its first turn to its end, so a later turn prefills
only the tokens appended since (sampled token, observation, next header). A worker thread runs the
loop vLLM and transformers' continuous batching run:

    admit the turns that arrived (prefill, sharing the fresh prompts' common prefix once)
    -> decode `stop_check_interval` steps for every row in flight
    -> read the new tokens back once, finish the rows that hit a stop id or their token cap

so a row whose turn ends leaves the batch at the next check and a turn that arrives joins there,
without waiting for the slowest row. The decode step has static shapes (the batch is padded to a
bucket: 1, 2, 4, ... slots rows; row b is slot `slots[b]` at position `lengths[b]`), so on CUDA it
is captured once per bucket in a CUDA graph and replayed: one launch per token instead of a few
hundred kernel launches from Python. Attention reads only each row's valid positions
(`decode_attention`), tokens are drawn on the device from a per-episode counter-based seed
(`token_sampling`): no host synchronisation inside a check interval, and an episode samples the
same tokens whatever else shares its batch.

The weights are `Qwen2Kernel`'s snapshot (LoRA folded in, fused projections), refreshed in place
when the model's weights changed and no row is in flight, i.e. once per optimizer step, so the
captured graphs stay valid. Arithmetic per token is `Qwen2Kernel.forward`'s (and so
`Qwen2ForCausalLM`'s in eval mode).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Hashable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor

from skyrl_tool_agent.policy.decode_attention import decode_attention, reference_decode_attention, triton_available
from skyrl_tool_agent.policy.prefix import MIN_SHARED_PREFIX, common_prefix_length
from skyrl_tool_agent.policy.qwen2_kernel import Qwen2Kernel, _rotate, weights_version
from skyrl_tool_agent.policy.token_sampling import counter_uniform, sample_tokens

logger = logging.getLogger(__name__)

# What a finished turn resolves to: sampled ids, their log-probs, whether it ended on a stop id.
TurnResult = tuple[list[int], list[float], bool]


@dataclass
class _Request:
    prompt: list[int]
    max_new_tokens: int
    temperature: float
    top_p: float
    key: Hashable
    seed: int
    future: Future = field(default_factory=Future)


@dataclass
class _Slot:
    index: int
    key: Hashable | None = None
    tokens: list[int] = field(default_factory=list)  # ids whose keys/values are valid at 0..len-1


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


@dataclass
class _StepInputs:
    """A bucket's static decode inputs (a captured graph reads and updates them in place)."""

    slots: Tensor
    lengths: Tensor


class RolloutEngine:
    """Samples turns of many episodes at once for a Qwen2 `model` (see the module docstring).

    Args:
        slots: episodes in flight at once (the collector's concurrency).
        capacity: most tokens an episode holds (prompt and every turn; `grpo.max_total_tokens`).
        stop_ids, pad_id: the tokenizer's end-of-turn ids and padding id.
        stop_check_interval: decode steps between reads of the sampled tokens (a row may run up to
            this many steps past its stop id; those tokens are dropped). Default: 8 on CUDA, 1 on CPU.
        cuda_graphs: capture the decode step per bucket (default: on CUDA).
        attention: the decode attention, "triton" (`decode_attention`) or "torch"
            (`reference_decode_attention`); default: triton on CUDA where it is installed.
        prefill_tokens: most (padded) tokens one prefill forward runs.
    """

    def __init__(self, model: torch.nn.Module, *, slots: int, capacity: int, stop_ids: Sequence[int], pad_id: int,
                 stop_check_interval: int | None = None, cuda_graphs: bool | None = None,
                 attention: str | None = None, prefill_tokens: int | None = None) -> None:
        self.model = model
        self.kernel = Qwen2Kernel(model)
        k = self.kernel
        self.device, self.dtype = k.device, k.dtype
        on_cuda = self.device.type == "cuda"
        self.slots, self.interval = slots, stop_check_interval or (8 if on_cuda else 1)
        self.capacity = capacity + self.interval + 2  # a row may decode `interval` steps past its cap
        self.scratch = slots  # the padding rows' slot
        self.use_graphs = on_cuda if cuda_graphs is None else cuda_graphs
        attention = attention or ("triton" if on_cuda and triton_available() else "torch")
        self.attend = {"triton": decode_attention, "torch": reference_decode_attention}[attention]
        self.prefill_tokens = prefill_tokens or (16384 if on_cuda else 4096)
        self.stop_ids, self.pad_id = list(stop_ids), pad_id
        shape = (slots + 1, k.kv_heads, self.capacity, k.head_dim)
        # Zeroed: positions a row does not own still enter the reference path's matmuls (masked),
        # and NaN in uninitialised memory survives a mask (NaN * 0 = NaN).
        self.keys = [torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in range(k.layers_n)]
        self.values = [torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in range(k.layers_n)]
        # Token history per slot: the id at position p and its sampling log-prob (sampled ones only).
        self.history = torch.full((slots + 1, self.capacity + 1), pad_id, dtype=torch.long, device=self.device)
        self.history_logp = torch.zeros((slots + 1, self.capacity + 1), dtype=torch.float32, device=self.device)
        self.seed = torch.zeros(slots + 1, dtype=torch.long, device=self.device)
        self.temperature = torch.ones(slots + 1, dtype=torch.float32, device=self.device)
        self.top_p = torch.ones(slots + 1, dtype=torch.float32, device=self.device)
        positions = torch.arange(self.capacity + 1, device=self.device).unsqueeze(0)
        cos, sin = k.rotary(k.embed[:1].unsqueeze(0), positions)
        self.cos, self.sin = cos[0], sin[0]  # [capacity + 1, head_dim]
        self.buckets = sorted({min(1 << i, slots) for i in range(slots.bit_length() + 1)})
        self.inputs = {b: _StepInputs(torch.full((b,), self.scratch, dtype=torch.long, device=self.device),
                                      torch.zeros(b, dtype=torch.long, device=self.device)) for b in self.buckets}
        self.graphs: dict[tuple[int, bool], torch.cuda.CUDAGraph] = {}
        self._pool = None
        self._free = [_Slot(i) for i in reversed(range(slots))]
        self._by_key: dict[Hashable, _Slot] = {}
        self._rows: list[_Row] = []
        self._waiting: list[_Request] = []
        self._inbox: queue.Queue = queue.Queue()
        self._thread: threading.Thread | None = None
        self._closed = False
        # Counters for benchmarks and logs; the seconds are wall time, prefill synchronised at its end.
        self.stats = {"decode_steps": 0, "decoded_rows": 0, "prefill_tokens": 0, "chunks": 0,
                      "decode_s": 0.0, "prefill_s": 0.0, "capture_s": 0.0}

    # ------------------------------------------------------------------ public API (any thread)
    def submit(self, prompt: Sequence[int], *, max_new_tokens: int, temperature: float, top_p: float,
               key: Hashable, seed: int) -> Future:
        """Queue one turn of episode `key` (a continuation when `prompt` extends what the episode's
        slot holds, else a fresh start); the future resolves to (ids, log-probs, stopped)."""
        request = _Request(list(prompt), max_new_tokens, temperature, top_p, key, seed & 0x7FFFFFFF)
        if not request.prompt:
            request.future.set_exception(ValueError("empty prompt"))
        elif len(request.prompt) + max_new_tokens > self.capacity - self.interval - 2:
            request.future.set_exception(ValueError(
                f"prompt of {len(request.prompt)} tokens + {max_new_tokens} new exceeds the engine's capacity "
                f"({self.capacity - self.interval - 2} tokens per episode)"))
        else:
            self._start()
            self._inbox.put(("turn", request))
        return request.future

    def release(self, key: Hashable) -> None:
        """Episode `key` has ended: its slot is free for another."""
        self._inbox.put(("release", key))

    def close(self) -> None:
        """Stop the worker thread (pending turns fail) and free the cache."""
        self._closed = True
        self._inbox.put(("close", None))
        if self._thread is not None:
            self._thread.join()
        self.keys = self.values = []
        self.graphs.clear()

    def generate(self, prompts: Sequence[Sequence[int]], *, max_new_tokens: int, temperature: float, top_p: float,
                 seeds: Sequence[int]) -> list[TurnResult]:
        """One turn per prompt, blocking; each prompt is its own episode (released after)."""
        keys = [("generate", id(self), i, s) for i, s in enumerate(seeds)]
        futures = [self.submit(p, max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, key=k, seed=s)
                   for p, k, s in zip(prompts, keys, seeds)]
        try:
            return [f.result() for f in futures]
        finally:
            for k in keys:
                self.release(k)

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
            messages.append(self._inbox.get())
        while True:
            try:
                messages.append(self._inbox.get_nowait())
            except queue.Empty:
                break
        turns = []
        for kind, payload in messages:
            if kind == "turn":
                turns.append(payload)
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
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            self.stats["prefill_s"] += time.perf_counter() - start

    def _free_slot(self, slot: _Slot) -> None:
        if self._by_key.get(slot.key) is slot:
            del self._by_key[slot.key]
        slot.key, slot.tokens = None, []
        self._free.append(slot)

    # ------------------------------------------------------------------ admission and prefill
    def _admit(self, requests: list[_Request]) -> None:
        if not self._rows and not self._by_key and weights_version(self.model) != self.kernel.version:
            self.kernel.refresh_(self.model)  # once per optimizer step: no episode holds old keys/values
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
            if not self._free:
                self._waiting.append(request)
                continue
            slot = self._free.pop()
            slot.key, slot.tokens = request.key, []
            self._by_key[request.key] = slot
            fresh.append((request, slot))
        if not continuing and not fresh:
            return
        admitted = continuing + fresh
        index = torch.tensor([s.index for _, s in admitted], device=self.device)
        self.seed[index] = torch.tensor([r.seed for r, _ in admitted], device=self.device)
        self.temperature[index] = torch.tensor([r.temperature for r, _ in admitted], device=self.device)
        self.top_p[index] = torch.tensor([r.top_p for r, _ in admitted], device=self.device)
        work = [(s.index, len(s.tokens), r.prompt[len(s.tokens):]) for r, s in continuing]
        shared = common_prefix_length([r.prompt for r, _ in fresh]) if len(fresh) > 1 else 0
        if shared >= MIN_SHARED_PREFIX:
            # The fresh prompts' common prefix (the system prompt) runs once and is copied to the others.
            first = fresh[0][1].index
            self._prefill([(first, 0, fresh[0][0].prompt[:shared])], sample=False)
            others = torch.tensor([s.index for _, s in fresh[1:]], device=self.device)
            for cache in (*self.keys, *self.values):
                cache[others, :, :shared] = cache[first:first + 1, :, :shared]
        else:
            shared = 0
        work += [(s.index, shared, r.prompt[shared:]) for r, s in fresh]
        self._prefill(work, sample=True, nucleus=any(r.temperature > 0 and r.top_p < 1 for r, _ in admitted))
        for request, slot in admitted:
            slot.tokens = list(request.prompt)
            self._rows.append(_Row(slot, request, len(request.prompt), len(request.prompt)))

    @torch.no_grad()
    def _prefill(self, work: list[tuple[int, int, list[int]]], *, sample: bool, nucleus: bool = False) -> None:
        """Run `ids` at positions start.. of each (slot, start, ids), writing their keys/values;
        with `sample`, draw each row's next token into the slot's history (`nucleus`: some row
        has top_p < 1)."""
        chunk: list[tuple[int, int, list[int]]] = []
        for item in sorted(work, key=lambda w: len(w[2])):
            if chunk and (len(chunk) + 1) * len(item[2]) > self.prefill_tokens:
                self._prefill_chunk(chunk, sample, nucleus)
                chunk = []
            chunk.append(item)
        if chunk:
            self._prefill_chunk(chunk, sample, nucleus)

    def _prefill_chunk(self, work: list[tuple[int, int, list[int]]], sample: bool, nucleus: bool) -> None:
        k, dev = self.kernel, self.device
        rows, width = len(work), max(len(ids) for _, _, ids in work)
        self.stats["prefill_tokens"] += sum(len(ids) for _, _, ids in work)
        ids = torch.full((rows, width), self.pad_id, dtype=torch.long)
        for i, (_, _, row_ids) in enumerate(work):
            ids[i, :len(row_ids)] = torch.tensor(row_ids)
        ids = ids.to(dev)
        slots = torch.tensor([s for s, _, _ in work], device=dev)
        starts = torch.tensor([s for _, s, _ in work], device=dev)
        counts = torch.tensor([len(r) for _, _, r in work], device=dev)
        positions = starts.unsqueeze(1) + torch.arange(width, device=dev)  # [R, S]
        valid = torch.arange(width, device=dev) < counts.unsqueeze(1)
        write_rows, write_cols = valid.nonzero(as_tuple=True)
        write_slots, write_pos = slots[write_rows], positions[write_rows, write_cols]
        used = int((starts + counts).max())
        groups = k.heads // k.kv_heads
        # Query (g, s) of a row sees the row's positions up to its own; stacked as in Qwen2Kernel.
        visible = torch.arange(used, device=dev) <= positions.unsqueeze(-1)  # [R, S, T]
        visible = visible.unsqueeze(1).expand(rows, groups, width, used).reshape(rows, 1, groups * width, used)
        clamped = positions.clamp(max=self.capacity)
        cos, sin = self.cos[clamped].unsqueeze(2), self.sin[clamped].unsqueeze(2)  # [R, S, 1, D]
        x = F.embedding(ids, k.embed)
        q_size, kv_size = k.heads * k.head_dim, k.kv_heads * k.head_dim
        for layer, k_cache, v_cache in zip(k.layers, self.keys, self.values):
            qkv = F.linear(k._norm(x, layer.norm1), layer.qkv_w, layer.qkv_b)
            q, key, value = qkv.split([q_size, kv_size, kv_size], dim=-1)
            q = _rotate(q.view(rows, width, k.heads, k.head_dim), cos, sin)
            key = _rotate(key.view(rows, width, k.kv_heads, k.head_dim), cos, sin)
            k_cache[write_slots, :, write_pos] = key[write_rows, write_cols]
            v_cache[write_slots, :, write_pos] = value.view(rows, width, k.kv_heads, k.head_dim)[write_rows, write_cols]
            q = q.view(rows, width, k.kv_heads, groups, k.head_dim).permute(0, 2, 3, 1, 4)
            q = q.reshape(rows, k.kv_heads, groups * width, k.head_dim)
            attn = F.scaled_dot_product_attention(q, k_cache[:, :, :used].index_select(0, slots),
                                                  v_cache[:, :, :used].index_select(0, slots), attn_mask=visible,
                                                  scale=k.head_dim ** -0.5)
            attn = attn.view(rows, k.kv_heads, groups, width, k.head_dim).permute(0, 3, 1, 2, 4).reshape(rows, width, q_size)
            x = x + F.linear(attn, layer.o_w)
            gate, up = F.linear(k._norm(x, layer.norm2), layer.gate_up_w).chunk(2, dim=-1)
            x = x + F.linear(F.silu(gate) * up, layer.down_w)
        if not sample:
            return
        last = x[torch.arange(rows, device=dev), counts - 1]
        logits = F.linear(k._norm(last, k.final_norm), k.lm_head)
        self._draw(logits, slots, starts + counts, nucleus=nucleus)

    def _draw(self, logits: Tensor, slots: Tensor, positions: Tensor, *, nucleus: bool) -> None:
        """Sample the token at `positions` of each row's slot and record it with its log-prob."""
        token, logp = sample_tokens(logits, self.temperature[slots], self.top_p[slots],
                                    counter_uniform(self.seed[slots], positions), nucleus=nucleus)
        self.history[slots, positions] = token
        self.history_logp[slots, positions] = logp

    # ------------------------------------------------------------------ decode
    @torch.no_grad()
    def _decode_step(self, inputs: _StepInputs, nucleus: bool) -> None:
        """Feed each row's pending token at its position, sample the next one, advance `lengths`."""
        k = self.kernel
        slots, lengths = inputs.slots, inputs.lengths
        batch = slots.shape[0]
        x = F.embedding(self.history[slots, lengths], k.embed)  # [B, hidden]
        cos, sin = self.cos[lengths].unsqueeze(1), self.sin[lengths].unsqueeze(1)  # [B, 1, D]
        valid = lengths + 1
        q_size, kv_size = k.heads * k.head_dim, k.kv_heads * k.head_dim
        for layer, k_cache, v_cache in zip(k.layers, self.keys, self.values):
            qkv = F.linear(k._norm(x, layer.norm1), layer.qkv_w, layer.qkv_b)
            q, key, value = qkv.split([q_size, kv_size, kv_size], dim=-1)
            q = _rotate(q.view(batch, k.heads, k.head_dim), cos, sin)
            k_cache[slots, :, lengths] = _rotate(key.view(batch, k.kv_heads, k.head_dim), cos, sin)
            v_cache[slots, :, lengths] = value.view(batch, k.kv_heads, k.head_dim)
            attn = self.attend(q.contiguous(), k_cache, v_cache, slots, valid, k.head_dim ** -0.5)
            x = x + F.linear(attn.reshape(batch, q_size), layer.o_w)
            gate, up = F.linear(k._norm(x, layer.norm2), layer.gate_up_w).chunk(2, dim=-1)
            x = x + F.linear(F.silu(gate) * up, layer.down_w)
        logits = F.linear(k._norm(x, k.final_norm), k.lm_head)
        self._draw(logits, slots, valid, nucleus=nucleus)
        lengths.add_(1)

    def _graph(self, bucket: int, nucleus: bool) -> torch.cuda.CUDAGraph | None:
        """The decode step of `bucket` rows, captured on first use (on the scratch slot). None
        when the warm-up or the capture fails: the engine then decodes eagerly with the torch
        attention (slower, same tokens), and says so once in the log."""
        key = (bucket, nucleus)
        if key not in self.graphs:
            start = time.perf_counter()
            inputs = self.inputs[bucket]
            inputs.slots.fill_(self.scratch)
            try:
                side = torch.cuda.Stream()
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):  # warm-up (Triton compile, cuBLAS handles) off the capture
                    for _ in range(2):
                        inputs.lengths.zero_()
                        self._decode_step(inputs, nucleus)
                torch.cuda.current_stream().wait_stream(side)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=self._pool, capture_error_mode="thread_local"):
                    self._decode_step(inputs, nucleus)
            except Exception:  # noqa: BLE001 - a missing or broken Triton/CUDA feature must not stop a rollout
                logger.exception("rollout engine: decode-step capture failed; decoding eagerly with the torch attention")
                self.use_graphs, self.attend = False, reference_decode_attention
                self.stats["capture_failed"] = 1
                return None
            self._pool = graph.pool()
            self.graphs[key] = graph
            self.stats["capture_s"] += time.perf_counter() - start
        return self.graphs[key]

    def _decode_chunk(self) -> None:
        rows = self._rows
        bucket = next(b for b in self.buckets if b >= len(rows))
        nucleus = any(r.request.temperature > 0 and r.request.top_p < 1 for r in rows)
        graph = self._graph(bucket, nucleus) if self.use_graphs else None
        start_time = time.perf_counter()
        inputs = self.inputs[bucket]
        pad = bucket - len(rows)
        starts = [r.length for r in rows]
        inputs.slots.copy_(torch.tensor([r.slot.index for r in rows] + [self.scratch] * pad), non_blocking=True)
        inputs.lengths.copy_(torch.tensor(starts + [0] * pad), non_blocking=True)
        for _ in range(self.interval):
            if graph is not None:
                graph.replay()
            else:
                self._decode_step(inputs, nucleus)
        self.stats["decode_steps"] += self.interval
        self.stats["decoded_rows"] += self.interval * len(rows)
        self.stats["chunks"] += 1
        # One read-back per interval: positions start .. start+interval of each row's history.
        window = torch.tensor(starts, device=self.device).unsqueeze(1) + torch.arange(self.interval + 1, device=self.device)
        slot_ids = inputs.slots[:len(rows)].unsqueeze(1)
        ids = self.history[slot_ids, window].tolist()
        logps = self.history_logp[slot_ids, window].tolist()
        self.stats["decode_s"] += time.perf_counter() - start_time
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
