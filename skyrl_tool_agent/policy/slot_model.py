"""`SlotModel`: a Qwen2's forward over a slot KV cache, the model half of `engine.RolloutEngine`.

One slot per episode: per layer `[slots + 2, kv_heads, capacity, head_dim]` keys and values, the
two extra slots the scratch (padding rows) and the *root* (the shared prompt prefix, which a slot
with `slot_root[slot]` > 0 reads: `decode_attention`'s cascade); per slot also the token history and
the sampling state.

The Qwen2 layer is written once (`_layers`); attention alone differs between `prefill` (any rows'
new tokens, maybe drawing each row's next) and `decode` (`steps` static-shape steps for a batch
padded to a bucket of 1, 2, 4, ... rows, each bucket captured once in a CUDA graph, the new tokens
read back in one transfer). Which episode holds which slot is the engine's business.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from skyrl_tool_agent.kernels.decode_attention import (ReferenceDecodeAttention, decode_attention, prefill_attention,
                                                       reference_decode_attention, triton_available)
from skyrl_tool_agent.policy.sampling_params import SamplingParams
from skyrl_tool_agent.policy.token_sampling import counter_uniform, sample_tokens
from skyrl_tool_agent.policy.weights import SamplingWeights, rotate

logger = logging.getLogger(__name__)

#: What a prefill runs per row: (slot, first position, the ids to run there).
PrefillRow = tuple[int, int, list[int]]
#: Attention of one layer: (layer index, q, k, v) -> the attended values, q's shape.
Attend = Callable[[int, Tensor, Tensor, Tensor], Tensor]


def default_prefill_tokens(device: torch.device) -> int:
    """Most (padded) tokens one prefill forward runs, by default."""
    return 16384 if device.type == "cuda" else 4096


@dataclass
class _StepInputs:
    """A bucket's static decode inputs (a captured graph reads and updates them in place)."""

    slots: Tensor
    lengths: Tensor


class SlotModel:
    """`weights`' forward over `slots` slots of `capacity` positions (module docstring). `attention`:
    "triton" (default on CUDA where installed) or "torch"; `prefill_tokens`: most (padded) tokens
    one prefill forward runs."""

    def __init__(self, weights: SamplingWeights, *, slots: int, capacity: int, pad_id: int,
                 cuda_graphs: bool | None = None, attention: str | None = None,
                 prefill_tokens: int | None = None) -> None:
        w = self.weights = weights
        self.device, self.dtype = w.device, w.dtype
        on_cuda = self.device.type == "cuda"
        self.capacity, self.pad_id = capacity, pad_id
        self.scratch, self.root = slots, slots + 1  # the padding rows' slot; the shared prefix's slot
        self.root_index = torch.tensor([self.root], device=self.device)
        self.use_graphs = on_cuda if cuda_graphs is None else cuda_graphs
        attention = attention or ("triton" if on_cuda and triton_available() else "torch")
        self.attend = {"triton": decode_attention, "torch": reference_decode_attention}[attention]
        self.prefill_tokens = prefill_tokens or default_prefill_tokens(self.device)
        shape = (slots + 2, w.shape.kv_heads, capacity, w.shape.head_dim)
        # Uninitialised: on the CPU only the pages episodes reach are ever resident (attention never
        # reads a position its row did not write: `cascade_attention`, `prefill_attention`).
        self.keys = [torch.empty(shape, dtype=self.dtype, device=self.device) for _ in range(w.shape.layers)]
        self.values = [torch.empty(shape, dtype=self.dtype, device=self.device) for _ in range(w.shape.layers)]
        # Root positions each slot reads (0: none); its own positions start there.
        self.slot_root = torch.zeros(slots + 2, dtype=torch.long, device=self.device)
        # Token history per slot: the id at position p and its sampling log-prob (sampled ones only).
        self.history = torch.full((slots + 2, capacity + 1), pad_id, dtype=torch.long, device=self.device)
        self.history_logp = torch.zeros((slots + 2, capacity + 1), dtype=torch.float32, device=self.device)
        self.seed = torch.zeros(slots + 2, dtype=torch.long, device=self.device)
        self.temperature = torch.ones(slots + 2, dtype=torch.float32, device=self.device)
        self.top_p = torch.ones(slots + 2, dtype=torch.float32, device=self.device)
        positions = torch.arange(capacity + 1, device=self.device).unsqueeze(0)
        cos, sin = w.rotary(w.embed[:1].unsqueeze(0), positions)
        self.cos, self.sin = cos[0].to(self.dtype), sin[0].to(self.dtype)  # [capacity + 1, head_dim]
        self.buckets = sorted({min(1 << i, slots) for i in range(slots.bit_length() + 1)})
        self.inputs = {b: _StepInputs(torch.full((b,), self.scratch, dtype=torch.long, device=self.device),
                                      torch.zeros(b, dtype=torch.long, device=self.device)) for b in self.buckets}
        self.graphs: dict[tuple[int, bool], torch.cuda.CUDAGraph] = {}
        self._pool = None
        # Counters for benchmarks and logs (seconds are wall time).
        self.stats = {"decode_steps": 0, "decoded_rows": 0, "prefill_tokens": 0, "chunks": 0,
                      "decode_s": 0.0, "prefill_s": 0.0, "capture_s": 0.0, "capture_failed": 0}

    def close(self) -> None:
        """Free the cache and the captured graphs."""
        self.keys = self.values = []
        self.graphs.clear()

    def set_slots(self, slots: Sequence[int], seeds: Sequence[int], params: Sequence[SamplingParams],
                  roots: Sequence[int]) -> None:
        """How each of `slots` samples from now on, and how many root positions it reads."""
        index = torch.tensor(list(slots), device=self.device)
        self.seed[index] = torch.tensor(list(seeds), device=self.device)
        self.temperature[index] = torch.tensor([p.temperature for p in params], dtype=torch.float32, device=self.device)
        self.top_p[index] = torch.tensor([p.top_p for p in params], dtype=torch.float32, device=self.device)
        self.slot_root[index] = torch.tensor(list(roots), device=self.device)

    def copy_positions(self, source: int, targets: Sequence[int], start: int, stop: int) -> None:
        """Positions start..stop-1 of slot `source`'s keys and values into each of `targets`."""
        others = torch.tensor(list(targets), device=self.device)
        for cache in (*self.keys, *self.values):
            cache[others, :, start:stop] = cache[source:source + 1, :, start:stop]

    def swap_slots(self, a: int, b: int, positions: int) -> None:
        """Exchange what slots `a` and `b` hold: keys/values at positions 0..positions-1, token
        history and sampling state."""
        pair, swapped = torch.tensor([a, b], device=self.device), torch.tensor([b, a], device=self.device)
        for cache in (*self.keys, *self.values):
            cache[pair, :, :positions] = cache[swapped, :, :positions]
        for state in (self.history, self.history_logp, self.seed, self.temperature, self.top_p, self.slot_root):
            state[pair] = state[swapped]

    @property
    def reads_consecutive_rows_in_place(self) -> bool:
        """Whether decode reads rows in consecutive slots as one view of the cache (the torch
        attention; others copy each row's keys out at every step), so packing them pays."""
        return self.attend is reference_decode_attention

    # ------------------------------------------------------------------ the one Qwen2 layer stack
    def _layers(self, x: Tensor, cos: Tensor, sin: Tensor, attend: Attend) -> Tensor:
        """Every decoder layer over hidden states x [..., hidden] (rotary cos/sin broadcast to the
        heads' axis); `attend` writes the new keys/values and attends."""
        w = self.weights
        q_size, kv_size = w.shape.q_dim, w.shape.kv_dim
        for i, layer in enumerate(w.layers):
            q, k, v = layer.qkv(w.norm(x, layer.norm1)).split([q_size, kv_size, kv_size], -1)
            q = rotate(q.unflatten(-1, (w.shape.heads, w.shape.head_dim)), cos, sin)
            k = rotate(k.unflatten(-1, (w.shape.kv_heads, w.shape.head_dim)), cos, sin)
            x = x + layer.o(attend(i, q, k, v.unflatten(-1, (w.shape.kv_heads, w.shape.head_dim))).flatten(-2))
            gate, up = layer.gate_up(w.norm(x, layer.norm2)).chunk(2, dim=-1)
            x = x + layer.down(F.silu(gate) * up)
        return x

    def _logits(self, x: Tensor) -> Tensor:
        head = self.weights.lm_head  # in its own dtype when sampled through the modules (a QLoRA head: float32)
        return F.linear(self.weights.norm(x, self.weights.final_norm).to(head.dtype), head)

    # ------------------------------------------------------------------ prefill
    @torch.no_grad()
    def prefill(self, work: list[PrefillRow], *, sample: bool, nucleus: bool = False) -> None:
        """Run `ids` at positions start.. of each (slot, start, ids), writing their keys/values;
        with `sample`, draw each row's next token into the slot's history (`nucleus`: some row
        has top_p < 1)."""
        chunk: list[PrefillRow] = []
        for item in sorted(work, key=lambda w: len(w[2])):
            if chunk and (len(chunk) + 1) * len(item[2]) > self.prefill_tokens:
                self._prefill_chunk(chunk, sample, nucleus)
                chunk = []
            chunk.append(item)
        if chunk:
            self._prefill_chunk(chunk, sample, nucleus)

    def _prefill_chunk(self, work: list[PrefillRow], sample: bool, nucleus: bool) -> None:
        w, dev = self.weights, self.device
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
        roots = self.slot_root[slots]  # [R]
        low, used, prefix = int(roots.min()), int((starts + counts).max()), int(roots.max())
        groups = w.shape.heads // w.shape.kv_heads
        # Query (g, s) of a row sees its own positions from its root's end up to its own position,
        # and the root's positions below its root length; queries stacked (g, s) per KV head.
        own = torch.arange(low, used, device=dev)
        own_written = (own >= roots.view(rows, 1)) & (own < (starts + counts).view(rows, 1))  # [R, T]
        own_visible = (own >= roots.view(rows, 1, 1)) & (own <= positions.unsqueeze(-1))  # [R, S, T]
        own_visible = own_visible.unsqueeze(1).expand(rows, groups, width, used - low).reshape(rows, 1, groups * width, -1)
        root_visible = (torch.arange(prefix, device=dev) < roots.view(rows, 1, 1, 1))
        clamped = positions.clamp(max=self.capacity)
        cos, sin = self.cos[clamped].unsqueeze(2), self.sin[clamped].unsqueeze(2)  # [R, S, 1, D]
        scale = w.shape.head_dim ** -0.5

        def attend(layer: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
            k_cache, v_cache = self.keys[layer], self.values[layer]
            k_cache[write_slots, :, write_pos] = k[write_rows, write_cols]
            v_cache[write_slots, :, write_pos] = v[write_rows, write_cols]
            q = q.view(rows, width, w.shape.kv_heads, groups, w.shape.head_dim).permute(0, 2, 3, 1, 4)
            q = q.reshape(rows, w.shape.kv_heads, groups * width, w.shape.head_dim) * scale
            out = prefill_attention(q, k_cache[:, :, low:used].index_select(0, slots),
                                    v_cache[:, :, low:used].index_select(0, slots), own_visible, own_written,
                                    k_cache[self.root, :, :prefix], v_cache[self.root, :, :prefix], root_visible)
            return out.view(rows, w.shape.kv_heads, groups, width, w.shape.head_dim).permute(0, 3, 1, 2, 4).reshape(
                rows, width, w.shape.heads, w.shape.head_dim)

        x = self._layers(F.embedding(ids, w.embed).to(self.dtype), cos, sin, attend)
        if sample:
            last = x[torch.arange(rows, device=dev), counts - 1]
            self._draw(self._logits(last), slots, starts + counts, nucleus=nucleus)

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
        w = self.weights
        slots, lengths = inputs.slots, inputs.lengths
        roots, valid, scale = self.slot_root[slots], lengths + 1, w.shape.head_dim ** -0.5
        if self.attend is reference_decode_attention:  # the rows' masks once for every layer
            step = ReferenceDecodeAttention(slots, valid, roots, self.root_index)
            attention = lambda q, keys, values: step(q, keys, values, scale)  # noqa: E731
        else:
            attention = lambda q, keys, values: self.attend(q, keys, values, slots, valid, roots,  # noqa: E731
                                                            self.root_index, scale)

        def attend(layer: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
            k_cache, v_cache = self.keys[layer], self.values[layer]
            k_cache[slots, :, lengths] = k
            v_cache[slots, :, lengths] = v
            return attention(q.contiguous(), k_cache, v_cache)

        cos, sin = self.cos[lengths].unsqueeze(1), self.sin[lengths].unsqueeze(1)  # [B, 1, D]
        x = self._layers(F.embedding(self.history[slots, lengths], w.embed).to(self.dtype), cos, sin, attend)
        self._draw(self._logits(x), slots, valid, nucleus=nucleus)
        lengths.add_(1)

    def _graph(self, bucket: int, nucleus: bool) -> torch.cuda.CUDAGraph | None:
        """The decode step of `bucket` rows, captured on first use (on the scratch slot). None
        when the warm-up or the capture fails: the engine then decodes eagerly with the torch
        attention (slower, same tokens), says so in the log and counts it in `stats`."""
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

    def decode(self, slots: Sequence[int], starts: Sequence[int], steps: int,
               nucleus: bool) -> tuple[list[list[int]], list[list[float]]]:
        """`steps` decode steps for the rows holding `slots` at positions `starts` (each feeds its
        pending token and draws the next), then one read-back: per row, the ids and log-probs at
        positions start .. start + steps of its history."""
        rows = len(slots)
        bucket = next(b for b in self.buckets if b >= rows)
        graph = self._graph(bucket, nucleus) if self.use_graphs else None
        start_time = time.perf_counter()
        if graph is not None:  # the bucket's static inputs, padded with scratch rows
            inputs, pad = self.inputs[bucket], bucket - rows
            inputs.slots.copy_(torch.tensor(list(slots) + [self.scratch] * pad), non_blocking=True)
            inputs.lengths.copy_(torch.tensor(list(starts) + [0] * pad), non_blocking=True)
        else:  # eager: exactly the rows (padding would only add work)
            inputs = _StepInputs(torch.tensor(list(slots), device=self.device),
                                 torch.tensor(list(starts), device=self.device))
        for _ in range(steps):
            if graph is not None:
                graph.replay()
            else:
                self._decode_step(inputs, nucleus)
        window = torch.tensor(list(starts), device=self.device).unsqueeze(1) + torch.arange(steps + 1, device=self.device)
        slot_ids = inputs.slots[:rows].unsqueeze(1)
        ids = self.history[slot_ids, window].tolist()
        logps = self.history_logp[slot_ids, window].tolist()
        self.stats["decode_s"] += time.perf_counter() - start_time
        self.stats["decode_steps"] += steps
        self.stats["decoded_rows"] += steps * rows
        self.stats["chunks"] += 1
        return ids, logps
