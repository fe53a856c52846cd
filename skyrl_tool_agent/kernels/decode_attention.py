"""Attention over a slot KV cache with a shared root: each row reads the root once and its own positions.

The cache is `[slots, kv_heads, capacity, head_dim]` per layer. One slot, the *root*, holds the
prompt prefix every episode shares; a row that reads it (`root_lens[b]` > 0) attends to root
positions < root_lens[b] and its own slot's positions root_lens[b]..lengths[b]-1, one softmax over
both (cascade attention, as FlashInfer's).

`cascade_attention` is the plain-torch arithmetic (CPU decode), `prefill_attention` a prefill's
through torch's fused kernels, `decode_attention` the GPU decode step (Triton: one program per
(row, KV head) with an online softmax, GQA grouped; shapes independent of the lengths, so it is
captured in a CUDA graph).
"""

from __future__ import annotations

import torch
from torch import Tensor

try:  # Triton comes with CUDA builds of torch; CPU-only installs may lack it.
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - exercised on machines without triton
    triton = None


def cascade_attention(q: Tensor, own_k: Tensor, own_v: Tensor, own_visible: Tensor | None, own_written: Tensor | None,
                      root_k: Tensor | None = None, root_v: Tensor | None = None,
                      root_visible: Tensor | None = None) -> Tensor:
    """Softmax attention of q [R, KVH, Q, D] (the Q query heads and positions of each row's KV
    head, already scaled) over each row's own keys/values [R, KVH, T, D] where `own_visible`
    [R, 1, Q, T] (bool), and over the root's [KVH, P, D] where `root_visible` [R, 1, Q, P]. One
    softmax in float32 over both. Returns [R, KVH, Q, D] in q's dtype. A mask of None: all visible.

    The cache is uninitialised, so positions a row never wrote may hold NaN (0 x NaN = NaN): own
    values outside `own_written` [R, T] are zeroed (`own_v` is the caller's copy)."""
    rows, kv_heads, queries, dim = q.shape
    own = torch.matmul(q, own_k.transpose(-1, -2)).float()
    if own_written is not None:
        own_v.masked_fill_(~own_written[:, None, :, None], 0)
    if own_visible is not None:
        own.masked_fill_(~own_visible, float("-inf"))
    if root_k is None or root_k.shape[1] == 0:
        return torch.matmul(torch.softmax(own, dim=-1).to(q.dtype), own_v)
    # The root's scores for every row at once: one [R*Q, D] x [D, P] matmul per KV head.
    flat = q.transpose(0, 1).reshape(kv_heads, rows * queries, dim)
    shared = torch.matmul(flat, root_k.transpose(-1, -2)).view(kv_heads, rows, queries, -1).transpose(0, 1).float()
    if root_visible is not None:
        shared = shared.masked_fill(~root_visible, float("-inf"))
    weights = torch.softmax(torch.cat([shared, own], dim=-1), dim=-1).to(q.dtype)
    prefix = root_k.shape[1]
    to_root = weights[..., :prefix].transpose(0, 1).reshape(kv_heads, rows * queries, prefix)
    out = torch.matmul(to_root, root_v).view(kv_heads, rows, queries, dim).transpose(0, 1)
    return out + torch.matmul(weights[..., prefix:], own_v)


def prefill_attention(q: Tensor, own_k: Tensor, own_v: Tensor, own_visible: Tensor, own_written: Tensor | None,
                      root_k: Tensor, root_v: Tensor, root_visible: Tensor) -> Tensor:
    """`cascade_attention`'s result for a prefill, through torch's fused attention: the root's keys
    and values are put before each row's own, so no float32 scores are held, only the visibility
    mask. `own_k`/`own_v` are the caller's copies, zeroed outside `own_written` (a NaN key would
    survive the mask)."""
    rows = q.shape[0]
    if own_written is not None:
        unwritten = ~own_written[:, None, :, None]
        own_k.masked_fill_(unwritten, 0)
        own_v.masked_fill_(unwritten, 0)
    if root_k.shape[1]:
        own_k = torch.cat([root_k.expand(rows, -1, -1, -1), own_k], dim=2)
        own_v = torch.cat([root_v.expand(rows, -1, -1, -1), own_v], dim=2)
        own_visible = torch.cat([root_visible.expand(-1, -1, q.shape[2], -1), own_visible], dim=-1)
    return torch.nn.functional.scaled_dot_product_attention(q, own_k, own_v, attn_mask=own_visible, scale=1.0)


class ReferenceDecodeAttention:
    """`reference_decode_attention` for one decode step: what depends only on the rows (their
    position ranges and masks, whether their slots are consecutive) worked out once for every layer."""

    def __init__(self, slots: Tensor, lengths: Tensor, root_lens: Tensor, root_slot: Tensor) -> None:
        batch = slots.shape[0]
        self.low, self.used, self.prefix = int(root_lens.min()), int(lengths.max()), int(root_lens.max())
        positions = torch.arange(self.low, self.used, device=slots.device)
        written = (positions >= root_lens.view(batch, 1)) & (positions < lengths.view(batch, 1))
        self.own_written = None if bool(written.all()) else written  # (rows of one length need no mask)
        root_visible = torch.arange(self.prefix, device=slots.device) < root_lens.view(batch, 1, 1, 1)
        self.root_visible = None if bool(root_visible.all()) else root_visible
        self.first = int(slots[0])
        self.consecutive = bool((slots == torch.arange(self.first, self.first + batch, device=slots.device)).all())
        self.slots, self.root = slots, int(root_slot)

    def __call__(self, q: Tensor, keys: Tensor, values: Tensor, scale: float) -> Tensor:
        batch, heads, dim = q.shape
        kv_heads, (low, used) = keys.shape[1], (self.low, self.used)
        grouped = q.view(batch, kv_heads, heads // kv_heads, dim) * scale
        if self.consecutive:
            # Consecutive slots (the engine orders its rows by slot): a view, nothing copied. Zeroing
            # the values a row never wrote then writes zeros where no row has written yet: harmless.
            own_k, own_v = keys[self.first:self.first + batch, :, low:used], values[self.first:self.first + batch, :, low:used]
        else:  # only each row's own used positions are copied out of the cache
            own_k = keys[:, :, low:used].index_select(0, self.slots)
            own_v = values[:, :, low:used].index_select(0, self.slots)
        own_visible = None if self.own_written is None else self.own_written.view(batch, 1, 1, -1)
        out = cascade_attention(grouped, own_k, own_v, own_visible, self.own_written, keys[self.root, :, :self.prefix],
                                values[self.root, :, :self.prefix], self.root_visible)
        return out.reshape(batch, heads, dim)


def reference_decode_attention(q: Tensor, keys: Tensor, values: Tensor, slots: Tensor, lengths: Tensor,
                               root_lens: Tensor, root_slot: Tensor, scale: float) -> Tensor:
    """q [B, H, D]; keys/values [S, KVH, C, D]; row b attends to root positions < root_lens[b] of
    slot `root_slot` (a one-element tensor) and to positions root_lens[b] .. lengths[b]-1 of slot
    slots[b]. [B, H, D]."""
    return ReferenceDecodeAttention(slots, lengths, root_lens, root_slot)(q, keys, values, scale)


if triton is not None:

    @triton.jit
    def _attend_span(q, k_ptr, v_ptr, base, start, stop, stride_kt, m, total, acc, d,
                     HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr):
        """Online-softmax accumulation over positions start..stop-1 at `base` (one slot, one KV head)."""
        for first in range(start, stop, BLOCK_N):
            t = first + tl.arange(0, BLOCK_N)
            t_mask = t < stop
            kv_mask = t_mask[:, None] & (d < HEAD_DIM)[None, :]
            offsets = base + t[:, None] * stride_kt + d[None, :]
            k = tl.load(k_ptr + offsets, mask=kv_mask, other=0.0)
            v = tl.load(v_ptr + offsets, mask=kv_mask, other=0.0)
            s = tl.dot(q, tl.trans(k))  # [G, N], fp32 accumulate
            s = tl.where(t_mask[None, :], s, float("-inf"))
            m_new = tl.maximum(m, tl.max(s, 1))
            alpha = tl.exp(m - m_new)
            p = tl.exp(s - m_new[:, None])
            total = total * alpha + tl.sum(p, 1)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
            m = m_new
        return m, total, acc

    @triton.jit
    def _decode_attention_kernel(
        q_ptr, k_ptr, v_ptr, out_ptr, slots_ptr, lengths_ptr, root_lens_ptr, root_slot_ptr, scale,
        stride_qb, stride_qh, stride_ks, stride_kh, stride_kt, stride_ob, stride_oh,
        GROUPS: tl.constexpr, GROUPS_PAD: tl.constexpr, HEAD_DIM: tl.constexpr, DIM_PAD: tl.constexpr,
        BLOCK_N: tl.constexpr,
    ):
        row = tl.program_id(0)
        kv_head = tl.program_id(1)
        slot = tl.load(slots_ptr + row).to(tl.int64)
        length = tl.load(lengths_ptr + row)
        root_len = tl.load(root_lens_ptr + row)
        g = tl.arange(0, GROUPS_PAD)
        d = tl.arange(0, DIM_PAD)
        head = kv_head * GROUPS + g
        q_mask = (g < GROUPS)[:, None] & (d < HEAD_DIM)[None, :]
        q = tl.load(q_ptr + row * stride_qb + head[:, None] * stride_qh + d[None, :], mask=q_mask, other=0.0)
        q = (q.to(tl.float32) * scale).to(q_ptr.dtype.element_ty)
        m = tl.full([GROUPS_PAD], float("-inf"), tl.float32)
        total = tl.zeros([GROUPS_PAD], tl.float32)
        acc = tl.zeros([GROUPS_PAD, DIM_PAD], tl.float32)
        root_base = tl.load(root_slot_ptr).to(tl.int64) * stride_ks + kv_head * stride_kh
        m, total, acc = _attend_span(q, k_ptr, v_ptr, root_base, 0, root_len, stride_kt, m, total, acc, d,
                                     HEAD_DIM, BLOCK_N)
        own_base = slot * stride_ks + kv_head * stride_kh
        m, total, acc = _attend_span(q, k_ptr, v_ptr, own_base, root_len, length, stride_kt, m, total, acc, d,
                                     HEAD_DIM, BLOCK_N)
        out = acc / total[:, None]
        tl.store(out_ptr + row * stride_ob + head[:, None] * stride_oh + d[None, :],
                 out.to(out_ptr.dtype.element_ty), mask=q_mask)


def triton_available() -> bool:
    return triton is not None


def decode_attention(q: Tensor, keys: Tensor, values: Tensor, slots: Tensor, lengths: Tensor, root_lens: Tensor,
                     root_slot: Tensor, scale: float, *, block_n: int = 64) -> Tensor:
    """`reference_decode_attention` as one Triton launch over (row, KV head): no host sync, static
    shapes (capturable); `root_slot` is a one-element tensor. `lengths` must be > `root_lens` per row."""
    if triton is None:
        raise RuntimeError("decode_attention needs triton; use reference_decode_attention")
    batch, heads, dim = q.shape
    kv_heads = keys.shape[1]
    groups = heads // kv_heads
    assert keys.stride(-1) == 1 and q.stride(-1) == 1 and keys.stride() == values.stride()
    out = torch.empty_like(q)
    _decode_attention_kernel[(batch, kv_heads)](
        q, keys, values, out, slots, lengths, root_lens, root_slot, scale,
        q.stride(0), q.stride(1), keys.stride(0), keys.stride(1), keys.stride(2), out.stride(0), out.stride(1),
        GROUPS=groups, GROUPS_PAD=max(16, triton.next_power_of_2(groups)), HEAD_DIM=dim,
        DIM_PAD=max(16, triton.next_power_of_2(dim)), BLOCK_N=block_n,
    )
    return out
