"""Shared-prefix training forwards: the system prompt is computed once per batch.

Every episode starts with the same system message (~570 of ~830 tokens on the embedded default);
running it once and broadcasting its key/value cache cuts the log-prob forwards ~2-3x on CPU.
Rows are `prefix + suffix_i`: the prefix KV is computed once (with gradient when training),
expanded over the batch, and the suffixes run on it with explicit position ids, in passes of
similar lengths (`suffix_passes`), equal to a plain forward up to float rounding. Without a prefix
worth sharing, and under ZeRO-3, one plain forward runs (`plain_forward_logprobs`).
"""

from __future__ import annotations

import types
from collections.abc import Sequence

import torch
from transformers import DynamicCache

from skyrl_tool_agent.policy.checkpointing import recomputing
from skyrl_tool_agent.kernels.logprobs import entropy_from_logits, head_token_stats, token_logprobs
from skyrl_tool_agent.policy.sampling_params import logprob_temperature
from skyrl_tool_agent.policy.weights import base_model

# Below this many shared tokens the plain full-sequence path is used (nothing worth sharing).
MIN_SHARED_PREFIX = 16


def common_prefix_length(rows: Sequence[Sequence[int]]) -> int:
    """Length of the longest common prefix, capped so every row keeps at least one own token."""
    if not rows:
        return 0
    first, shortest = rows[0], min(len(r) for r in rows)
    n = 0
    while n < shortest - 1 and all(r[n] == first[n] for r in rows):
        n += 1
    return n


def output_head(model: torch.nn.Module, *, partitioned: bool = False) -> tuple[torch.nn.Module, torch.nn.Linear] | None:
    """(the decoder body, the output projection) of a causal LM whose log-probs `head_token_stats`
    can take from the hidden states: a plain bias-free `lm_head` with nothing after it; None for
    other heads (their log-probs come from the logits). A ZeRO-3 partitioned head counts only
    where `partitioned` (its weight exists only inside lm_head's forward and backward)."""
    causal = base_model(model)
    body, head = getattr(causal, "model", None), getattr(causal, "lm_head", None)
    config = getattr(causal, "config", None)
    if body is None or type(head) is not torch.nn.Linear or head.bias is not None:
        return None
    if getattr(config, "final_logit_softcapping", None) or getattr(config, "logit_scale", None):
        return None
    if hasattr(head.weight, "ds_id") and not partitioned:
        return None
    return body, head


def _head_stats(weight: torch.Tensor, hidden: torch.Tensor, labels: torch.Tensor, keep: torch.Tensor,
                temperature: float, with_entropy: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`head_token_stats` of the `keep` positions of `[B, L, H]` hidden states scoring `[B, L]`
    labels, as `[B, L]` tensors (0 elsewhere: padding costs no projection)."""
    shape = labels.shape
    where = keep.reshape(-1).nonzero().squeeze(-1)
    logp, entropy = head_token_stats(hidden.reshape(-1, hidden.shape[-1]).index_select(0, where), weight,
                                     labels.reshape(-1).index_select(0, where), temperature, with_entropy=with_entropy)

    def spread(values: torch.Tensor) -> torch.Tensor:
        return values.new_zeros(shape.numel()).index_copy(0, where, values).view(shape)

    return spread(logp), (spread(entropy) if entropy is not None else None)


def shared_prefix_logprobs(
    model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, prefix_len: int,
    *, temperature: float = 1.0, with_entropy: bool = False, score_mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Right-padded rows sharing their first `prefix_len` ids -> log-probs of ids[:, 1:] ([B, L-1]),
    as a plain forward would give (position t scores token t+1), and entropies if asked; only at
    `score_mask`'s positions when given (`batch_logprobs`). The model must have an `output_head`."""
    head = output_head(model)
    if head is None:
        raise ValueError("shared_prefix_logprobs needs a model with a plain output head (output_head)")
    body, weight = head[0], head[1].weight
    batch, width = input_ids.shape
    out = body(input_ids=input_ids[:1, :prefix_len], use_cache=True)
    kv = [(layer.keys, layer.values) for layer in out.past_key_values.layers]
    pre_hidden = out.last_hidden_state  # [1, P, H]
    # Prefix positions predict the same next ids in every row: scored once, broadcast. Position P-1
    # predicts each row's first own id; the suffix's positions the rest.
    scored = attention_mask[:, 1:].bool() if score_mask is None else attention_mask[:, 1:].bool() & score_mask.bool()
    pre_lp, pre_h = _head_stats(weight, pre_hidden[:, :-1], input_ids[:1, 1:prefix_len],
                                scored[:, :prefix_len - 1].any(0, keepdim=True), temperature, with_entropy)
    own_lengths = attention_mask[:, prefix_len:].sum(1).tolist()
    parts: list[tuple[list[int], torch.Tensor, torch.Tensor | None]] = []
    for rows in suffix_passes(own_lengths):  # each pass padded to its own longest row only
        ids = input_ids[rows, prefix_len:prefix_len + max(own_lengths[r] for r in rows)]
        suffix_mask = attention_mask[rows, prefix_len:prefix_len + ids.shape[1]]
        positions = prefix_len + (suffix_mask.cumsum(1) - 1).clamp(min=0)
        ones = torch.ones(len(rows), prefix_len, dtype=suffix_mask.dtype, device=input_ids.device)
        cache = DynamicCache(ddp_cache_data=[(k.expand(len(rows), -1, -1, -1), v.expand(len(rows), -1, -1, -1)) for k, v in kv])
        suf_hidden = body(input_ids=ids, attention_mask=torch.cat([ones, suffix_mask], 1), position_ids=positions,
                          past_key_values=cache, use_cache=False).last_hidden_state
        own = torch.cat([pre_hidden[:, -1:].expand(len(rows), -1, -1), suf_hidden[:, :-1]], dim=1)
        own_lp, own_h = _head_stats(weight, own, ids, scored[rows, prefix_len - 1:prefix_len - 1 + ids.shape[1]],
                                    temperature, with_entropy)
        parts.append((rows, own_lp, own_h))

    def assembled(pre: torch.Tensor, own: list[torch.Tensor]) -> torch.Tensor:
        """[B, L-1]: the prefix's values in every row, each pass's own values in its rows, 0 past the ends."""
        pad = width - prefix_len
        rows = torch.cat([torch.nn.functional.pad(o, (0, pad - o.shape[1])) for o in own])  # in pass order
        order = torch.tensor([r for part in parts for r in part[0]], device=input_ids.device)
        rows = rows.index_select(0, torch.argsort(order))
        return torch.cat([pre.expand(batch, -1), rows], dim=1)

    logp = assembled(pre_lp, [lp for _, lp, _ in parts])
    entropy = None if pre_h is None else assembled(pre_h, [h for _, _, h in parts])  # type: ignore[misc]
    if score_mask is not None:  # a prefix position another row wanted: 0 in the rows that did not
        logp = logp.where(scored, 0.0)
        entropy = None if entropy is None else entropy.where(scored, 0.0)
    assert logp.shape == (batch, width - 1)
    return logp, entropy


# What one more suffix pass costs, in padded token positions (its launches and Python, beside its rows' work).
SUFFIX_PASS_COST = 64


def suffix_passes(lengths: Sequence[int], pass_cost: int = SUFFIX_PASS_COST) -> list[list[int]]:
    """Rows (indices into `lengths`) of each suffix pass: the split by length that minimises padded
    positions plus `pass_cost` a pass (one long episode would otherwise pad every row to it)."""
    order = sorted(range(len(lengths)), key=lambda r: -lengths[r])
    best = [0] + [0] * len(order)  # best[i]: the cheapest split of the i longest rows
    cut = [0] * (len(order) + 1)
    for i in range(1, len(order) + 1):  # the last pass holds rows j..i-1 of `order`, padded to the j-th's length
        best[i], cut[i] = min((best[j] + (i - j) * lengths[order[j]] + pass_cost, j) for j in range(i))
    passes, i = [], len(order)
    while i > 0:
        passes.append(order[cut[i]:i])
        i = cut[i]
    return passes[::-1]


def batch_logprobs(
    model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, *, temperature: float = 1.0,
    with_entropy: bool = False, score_mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs of `input_ids[:, 1:]` ([B, L-1], right-padded; position t scores token t+1),
    sharing the rows' common prefix when long enough; entropies if asked. Positions past a row's end
    or outside `score_mask` score 0 (no head projection there). Identical rows (a confident
    policy's group) are computed once; a copy's gradient flows back through `index_select`."""
    temperature = logprob_temperature(temperature)
    rows = [tuple(r[: int(m.sum())]) for r, m in zip(input_ids.tolist(), attention_mask)]
    first: dict[tuple[int, ...], int] = {}
    copy_of = [first.setdefault(row, len(first)) for row in rows]  # each row's distinct row
    if len(first) == len(rows):
        return _distinct_logprobs(model, input_ids, attention_mask, list(first), temperature, with_entropy, score_mask)
    distinct = torch.tensor([copy_of.index(i) for i in range(len(first))], device=input_ids.device)
    width = max(map(len, first))
    spread = torch.tensor(copy_of, device=input_ids.device)
    given_mask = score_mask
    if score_mask is not None:  # a distinct row is scored where any of its copies needs it
        score_mask = torch.zeros((len(first), score_mask.shape[1]), dtype=torch.int32, device=input_ids.device) \
            .index_add_(0, spread, score_mask.int())[:, :width - 1] > 0
    logp, entropy = _distinct_logprobs(model, input_ids[distinct, :width], attention_mask[distinct, :width],
                                       list(first), temperature, with_entropy, score_mask)

    def copied(values: torch.Tensor) -> torch.Tensor:
        values = torch.nn.functional.pad(values, (0, input_ids.shape[1] - width)).index_select(0, spread)
        return values if given_mask is None else values.where(given_mask.bool(), 0.0)  # another copy's positions: 0

    return copied(logp), (copied(entropy) if entropy is not None else None)


def _distinct_logprobs(
    model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, rows: list[tuple[int, ...]],
    temperature: float, with_entropy: bool, score_mask: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`batch_logprobs` of rows that are all different (`rows`: their ids without padding)."""
    head = output_head(model)
    prefix_len = common_prefix_length(rows) if len(rows) > 1 else 0  # one row: nothing to share
    if head is not None and prefix_len >= MIN_SHARED_PREFIX and not recomputing(model):  # checkpointing drops the prefix's cache
        return shared_prefix_logprobs(model, input_ids, attention_mask, prefix_len, temperature=temperature,
                                      with_entropy=with_entropy, score_mask=score_mask)
    return plain_forward_logprobs(model, input_ids, attention_mask, temperature=temperature, with_entropy=with_entropy,
                                  score_mask=score_mask)


def plain_forward_logprobs(
    model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, *, temperature: float = 1.0,
    with_entropy: bool = False, score_mask: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`batch_logprobs` from one plain forward of `model` (or a DeepSpeed engine around one),
    nothing shared. With an `output_head` the log-probs are computed chunk by chunk inside lm_head's
    own forward, so the logits never exist whole and a ZeRO-3 partitioned head is gathered (and its
    gradient reduced) by DeepSpeed's hooks as usual; the module then outputs log-probs, not logits."""
    temperature = logprob_temperature(temperature)
    scored = attention_mask[:, 1:].bool() if score_mask is None else attention_mask[:, 1:].bool() & score_mask.bool()
    head = output_head(model, partitioned=True)
    if head is None:
        logits = model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits[:, :-1]
        logp = token_logprobs(logits, input_ids[:, 1:], temperature) * scored
        return logp, (entropy_from_logits(logits, temperature) * scored if with_entropy else None)
    lm_head = head[1]

    def head_stats(self: torch.nn.Linear, hidden: torch.Tensor) -> torch.Tensor:
        logp, entropy = _head_stats(self.weight, hidden[:, :-1], input_ids[:, 1:], scored, temperature, with_entropy)
        return torch.stack([logp, entropy], -1) if entropy is not None else logp.unsqueeze(-1)

    lm_head.forward = types.MethodType(head_stats, lm_head)  # the module's hooks (ZeRO-3's gathers) still run
    try:
        stats = model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits
    finally:
        del lm_head.forward
    return stats[..., 0], (stats[..., 1] if with_entropy else None)
