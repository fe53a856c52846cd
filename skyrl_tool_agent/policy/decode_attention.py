"""One decode step's attention over a slot KV cache: each row reads only its own valid positions.

The cache is `[slots, kv_heads, capacity, head_dim]` per layer and row b of the batch is slot
`slots[b]` with `lengths[b]` valid positions. At 256 rows and ~2k-token contexts the cache, not the
weights, is most of the bytes a decode step reads, so the GPU kernel (Triton, flash-decoding style
without the split) reads exactly `lengths[b]` positions per row, once per KV head for all the query
heads sharing it (GQA grouped: no `repeat_kv` copy), and its shapes do not depend on the lengths,
so it can be captured in a CUDA graph. `reference_decode_attention` is the same arithmetic in
plain torch (CPU, and the oracle the kernel is tested against).
"""

from __future__ import annotations

import torch
from torch import Tensor

try:  # Triton comes with CUDA builds of torch; CPU-only installs may lack it.
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - exercised on machines without triton
    triton = None


def reference_decode_attention(q: Tensor, keys: Tensor, values: Tensor, slots: Tensor, lengths: Tensor,
                               scale: float) -> Tensor:
    """q [B, H, D]; keys/values [S, KVH, C, D]; row b attends to positions < lengths[b] of slot
    slots[b]. Returns [B, H, D] in q's dtype."""
    batch, heads, dim = q.shape
    kv_heads = keys.shape[1]
    used = int(lengths.max())
    k = keys[:, :, :used].index_select(0, slots)  # [B, KVH, T, D]: only the used positions are copied
    v = values[:, :, :used].index_select(0, slots)
    grouped = q.view(batch, kv_heads, heads // kv_heads, dim) * scale
    scores = torch.matmul(grouped, k.transpose(-1, -2))  # [B, KVH, G, T]
    hidden = torch.arange(used, device=q.device) >= lengths.view(batch, 1, 1, 1)
    weights = torch.softmax(scores.masked_fill(hidden, float("-inf")), dim=-1)
    return torch.matmul(weights, v).view(batch, heads, dim)


if triton is not None:

    @triton.jit
    def _decode_attention_kernel(
        q_ptr, k_ptr, v_ptr, out_ptr, slots_ptr, lengths_ptr, scale,
        stride_qb, stride_qh, stride_ks, stride_kh, stride_kt, stride_ob, stride_oh,
        GROUPS: tl.constexpr, GROUPS_PAD: tl.constexpr, HEAD_DIM: tl.constexpr, DIM_PAD: tl.constexpr,
        BLOCK_N: tl.constexpr,
    ):
        row = tl.program_id(0)
        kv_head = tl.program_id(1)
        slot = tl.load(slots_ptr + row).to(tl.int64)
        length = tl.load(lengths_ptr + row)
        g = tl.arange(0, GROUPS_PAD)
        d = tl.arange(0, DIM_PAD)
        head = kv_head * GROUPS + g
        q_mask = (g < GROUPS)[:, None] & (d < HEAD_DIM)[None, :]
        q = tl.load(q_ptr + row * stride_qb + head[:, None] * stride_qh + d[None, :], mask=q_mask, other=0.0)
        q = (q.to(tl.float32) * scale).to(q_ptr.dtype.element_ty)
        base = slot * stride_ks + kv_head * stride_kh
        m = tl.full([GROUPS_PAD], float("-inf"), tl.float32)
        total = tl.zeros([GROUPS_PAD], tl.float32)
        acc = tl.zeros([GROUPS_PAD, DIM_PAD], tl.float32)
        for start in range(0, length, BLOCK_N):
            t = start + tl.arange(0, BLOCK_N)
            t_mask = t < length
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
        out = acc / total[:, None]
        tl.store(out_ptr + row * stride_ob + head[:, None] * stride_oh + d[None, :],
                 out.to(out_ptr.dtype.element_ty), mask=q_mask)


def triton_available() -> bool:
    return triton is not None


def decode_attention(q: Tensor, keys: Tensor, values: Tensor, slots: Tensor, lengths: Tensor, scale: float,
                     *, block_n: int = 64) -> Tensor:
    """`reference_decode_attention` as one Triton launch over (row, KV head): no host sync, static
    shapes (capturable). `lengths` must be >= 1 per row."""
    if triton is None:
        raise RuntimeError("decode_attention needs triton; use reference_decode_attention")
    batch, heads, dim = q.shape
    kv_heads = keys.shape[1]
    groups = heads // kv_heads
    assert keys.stride(-1) == 1 and q.stride(-1) == 1 and keys.stride() == values.stride()
    out = torch.empty_like(q)
    _decode_attention_kernel[(batch, kv_heads)](
        q, keys, values, out, slots, lengths, scale,
        q.stride(0), q.stride(1), keys.stride(0), keys.stride(1), keys.stride(2), out.stride(0), out.stride(1),
        GROUPS=groups, GROUPS_PAD=max(16, triton.next_power_of_2(groups)), HEAD_DIM=dim,
        DIM_PAD=max(16, triton.next_power_of_2(dim)), BLOCK_N=block_n,
    )
    return out
