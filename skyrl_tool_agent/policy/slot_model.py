"""`SlotModel`: a Qwen2's forward over a slot KV cache, the model half of `engine.RolloutEngine`.

One slot per episode: per layer `[slots + 1, kv_heads, capacity, head_dim]` keys and values (the
extra slot is scratch for the rows that pad a batch to its bucket), and per slot the token history
(the id at each position, the sampling log-prob of each sampled one) and the sampling state (seed,
temperature, top-p). Two forwards write into it, both `Qwen2Kernel`'s arithmetic (LoRA folded in,
fused projections): `prefill` runs any rows' new tokens at their positions and may draw each row's
next token; `decode` runs `steps` static-shape decode steps for a batch of slots, padded to a
bucket (1, 2, 4, ... slots rows) so that on CUDA each bucket's step is captured once in a CUDA
graph and replayed, then reads the new tokens back in one transfer. Attention in the decode step
reads only each row's valid positions (`decode_attention`); tokens are drawn on the device from the
slot's seed and the position (`token_sampling`), so a row's tokens do not depend on its batch.
Which episode holds which slot, and when, is the engine's business.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from skyrl_tool_agent.policy.decode_attention import decode_attention, reference_decode_attention, triton_available
from skyrl_tool_agent.policy.qwen2_kernel import Qwen2Kernel, _rotate
from skyrl_tool_agent.policy.token_sampling import counter_uniform, sample_tokens

logger = logging.getLogger(__name__)

#: What a prefill runs per row: (slot, first position, the ids to run there).
PrefillRow = tuple[int, int, list[int]]


def default_prefill_tokens(device: torch.device) -> int:
    """Most (padded) tokens one prefill forward runs, by default."""
    return 16384 if device.type == "cuda" else 4096


@dataclass
class _StepInputs:
    """A bucket's static decode inputs (a captured graph reads and updates them in place)."""

    slots: Tensor
    lengths: Tensor


class SlotModel:
    """`kernel`'s forward over `slots` slots of `capacity` positions (module docstring).

    Args:
        cuda_graphs: capture the decode step per bucket (default: on CUDA).
        attention: the decode attention, "triton" (`decode_attention`) or "torch"
            (`reference_decode_attention`); default: triton on CUDA where it is installed.
        prefill_tokens: most (padded) tokens one prefill forward runs.
    """

    def __init__(self, kernel: Qwen2Kernel, *, slots: int, capacity: int, pad_id: int,
                 cuda_graphs: bool | None = None, attention: str | None = None,
                 prefill_tokens: int | None = None) -> None:
        k = self.kernel = kernel
        self.device, self.dtype = k.device, k.dtype
        on_cuda = self.device.type == "cuda"
        self.capacity, self.pad_id = capacity, pad_id
        self.scratch = slots  # the padding rows' slot
        self.use_graphs = on_cuda if cuda_graphs is None else cuda_graphs
        attention = attention or ("triton" if on_cuda and triton_available() else "torch")
        self.attend = {"triton": decode_attention, "torch": reference_decode_attention}[attention]
        self.prefill_tokens = prefill_tokens or default_prefill_tokens(self.device)
        shape = (slots + 1, k.kv_heads, capacity, k.head_dim)
        # Zeroed: positions a row does not own still enter the reference path's matmuls (masked),
        # and NaN in uninitialised memory survives a mask (NaN * 0 = NaN).
        self.keys = [torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in range(k.layers_n)]
        self.values = [torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in range(k.layers_n)]
        # Token history per slot: the id at position p and its sampling log-prob (sampled ones only).
        self.history = torch.full((slots + 1, capacity + 1), pad_id, dtype=torch.long, device=self.device)
        self.history_logp = torch.zeros((slots + 1, capacity + 1), dtype=torch.float32, device=self.device)
        self.seed = torch.zeros(slots + 1, dtype=torch.long, device=self.device)
        self.temperature = torch.ones(slots + 1, dtype=torch.float32, device=self.device)
        self.top_p = torch.ones(slots + 1, dtype=torch.float32, device=self.device)
        positions = torch.arange(capacity + 1, device=self.device).unsqueeze(0)
        cos, sin = k.rotary(k.embed[:1].unsqueeze(0), positions)
        self.cos, self.sin = cos[0], sin[0]  # [capacity + 1, head_dim]
        self.buckets = sorted({min(1 << i, slots) for i in range(slots.bit_length() + 1)})
        self.inputs = {b: _StepInputs(torch.full((b,), self.scratch, dtype=torch.long, device=self.device),
                                      torch.zeros(b, dtype=torch.long, device=self.device)) for b in self.buckets}
        self.graphs: dict[tuple[int, bool], torch.cuda.CUDAGraph] = {}
        self._pool = None
        # Counters for benchmarks and logs (seconds are wall time).
        self.stats = {"decode_steps": 0, "decoded_rows": 0, "prefill_tokens": 0, "chunks": 0,
                      "decode_s": 0.0, "prefill_s": 0.0, "capture_s": 0.0}

    @staticmethod
    def bytes_per_position(kernel: Qwen2Kernel) -> int:
        """Bytes a slot holds per position: keys and values of every layer, the token id and its log-prob."""
        return 2 * kernel.layers_n * kernel.kv_heads * kernel.head_dim * kernel.dtype.itemsize + 8 + 4

    @staticmethod
    def working_set_bytes(kernel: Qwen2Kernel, *, rows: int, capacity: int, prefill_tokens: int) -> int:
        """An estimate of the largest transient memory of a forward beside the cache: a prefill
        chunk's activations (residual stream, fused projections, MLP), its attention mask, the
        keys/values of one layer gathered for up to `rows` rows, and the logits of `rows` rows."""
        k, item = kernel, kernel.dtype.itemsize
        hidden, inner = k.embed.shape[1], k.layers[0].down_w.shape[1]
        activations = prefill_tokens * item * (6 * hidden + (k.heads + 2 * k.kv_heads) * k.head_dim + 3 * inner)
        mask = prefill_tokens * (k.heads // k.kv_heads) * capacity
        gathered = min(rows, prefill_tokens) * capacity * 2 * k.kv_heads * k.head_dim * item
        logits = rows * k.lm_head.shape[0] * 4 * 2
        return activations + mask + gathered + logits

    def close(self) -> None:
        """Free the cache and the captured graphs."""
        self.keys = self.values = []
        self.graphs.clear()

    def set_sampling(self, slots: Sequence[int], seeds: Sequence[int], temperatures: Sequence[float],
                     top_ps: Sequence[float]) -> None:
        """How each of `slots` samples from now on."""
        index = torch.tensor(list(slots), device=self.device)
        self.seed[index] = torch.tensor(list(seeds), device=self.device)
        self.temperature[index] = torch.tensor(list(temperatures), dtype=torch.float32, device=self.device)
        self.top_p[index] = torch.tensor(list(top_ps), dtype=torch.float32, device=self.device)

    def copy_prefix(self, source: int, targets: Sequence[int], length: int) -> None:
        """Positions 0..length-1 of slot `source`'s keys and values into each of `targets`."""
        others = torch.tensor(list(targets), device=self.device)
        for cache in (*self.keys, *self.values):
            cache[others, :, :length] = cache[source:source + 1, :, :length]

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

    def decode(self, slots: Sequence[int], starts: Sequence[int], steps: int,
               nucleus: bool) -> tuple[list[list[int]], list[list[float]]]:
        """`steps` decode steps for the rows holding `slots` at positions `starts` (each feeds its
        pending token and draws the next), then one read-back: per row, the ids and log-probs at
        positions start .. start + steps of its history."""
        rows = len(slots)
        bucket = next(b for b in self.buckets if b >= rows)
        graph = self._graph(bucket, nucleus) if self.use_graphs else None
        start_time = time.perf_counter()
        inputs = self.inputs[bucket]
        pad = bucket - rows
        inputs.slots.copy_(torch.tensor(list(slots) + [self.scratch] * pad), non_blocking=True)
        inputs.lengths.copy_(torch.tensor(list(starts) + [0] * pad), non_blocking=True)
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
