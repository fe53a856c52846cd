"""Shared-prefix forward passes and sampling: the system prompt is computed once per batch.

Every episode of a run starts with the same system message (instructions + the tool list), which
is most of a small model's context: on the embedded default it is ~570 of ~830 tokens. Running it
once and broadcasting its key/value cache across the batch cuts training and sampling compute
~2-3x on CPU (vLLM's prefix caching does the same for serving). Sampling decodes into a
pre-allocated static cache and drops finished rows from the batch once they are half of it:
1.44x faster 64-episode rollouts than a growing `DynamicCache` on this project's 2-core CPU.

Layout: rows are `prefix + suffix_i`. The prefix KV is computed once (with gradient when
training, so LoRA/full updates still flow through it), expanded over the batch, and the suffixes
run on top of it with explicit position ids, so results equal a plain full-sequence forward up to
float rounding.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers import DynamicCache, StaticCache

from skyrl_tool_agent.policy.checkpointing import recomputing
from skyrl_tool_agent.policy.logprobs import entropy_from_logits, head_token_stats, token_logprobs
from skyrl_tool_agent.policy.token_sampling import counter_uniform, sample_tokens

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


def prefix_pass(model: torch.nn.Module, prefix: torch.Tensor) -> tuple[list[tuple[torch.Tensor, torch.Tensor]], torch.Tensor]:
    """Run the shared prefix `[P]` once: per-layer (key, value) of shape [1, h, P, d] and its logits [P, V]."""
    out = model(input_ids=prefix.unsqueeze(0), use_cache=True)
    kv = [(layer.keys, layer.values) for layer in out.past_key_values.layers]
    return kv, out.logits[0]


def expand_cache(kv: list[tuple[torch.Tensor, torch.Tensor]], batch: int) -> DynamicCache:
    return DynamicCache(ddp_cache_data=[(k.expand(batch, -1, -1, -1), v.expand(batch, -1, -1, -1)) for k, v in kv])


def output_head(model: torch.nn.Module) -> tuple[torch.nn.Module, torch.Tensor] | None:
    """(the decoder body, the output projection's weight) of a causal LM whose log-probs can be taken
    from the body's hidden states by `head_token_stats` (never materialising the logits): a plain
    bias-free `lm_head` with nothing after it. None for other heads (logit soft-capping or scaling,
    an adapter on the head, a ZeRO-3 partitioned weight): their log-probs come from the logits."""
    causal = model.get_base_model() if hasattr(model, "get_base_model") else model
    body, head = getattr(causal, "model", None), getattr(causal, "lm_head", None)
    config = getattr(causal, "config", None)
    if body is None or type(head) is not torch.nn.Linear or head.bias is not None:
        return None
    if getattr(config, "final_logit_softcapping", None) or getattr(config, "logit_scale", None):
        return None
    if hasattr(head.weight, "ds_id"):  # DeepSpeed ZeRO-3: the weight is gathered only inside lm_head's forward
        return None
    return body, head.weight


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
    *, temperature: float = 1.0, with_entropy: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Right-padded rows sharing their first `prefix_len` ids -> log-probs of ids[:, 1:] ([B, L-1]),
    as a plain forward would give (position t scores token t+1), and entropies if asked. The model
    must have an `output_head`."""
    head = output_head(model)
    if head is None:
        raise ValueError("shared_prefix_logprobs needs a model with a plain output head (output_head)")
    body, weight = head
    batch, width = input_ids.shape
    out = body(input_ids=input_ids[:1, :prefix_len], use_cache=True)
    kv = [(layer.keys, layer.values) for layer in out.past_key_values.layers]
    pre_hidden = out.last_hidden_state  # [1, P, H]
    suffix_mask = attention_mask[:, prefix_len:]
    positions = prefix_len + (suffix_mask.cumsum(1) - 1).clamp(min=0)
    attention = torch.cat([torch.ones(batch, prefix_len, dtype=suffix_mask.dtype, device=input_ids.device), suffix_mask], 1)
    suf_hidden = body(input_ids=input_ids[:, prefix_len:], attention_mask=attention, position_ids=positions,
                      past_key_values=expand_cache(kv, batch), use_cache=False).last_hidden_state
    # Prefix positions predict the same next ids in every row: scored once, broadcast. Position P-1
    # predicts each row's first own id; the suffix's positions the rest.
    pre_lp, pre_h = _head_stats(weight, pre_hidden[:, :-1], input_ids[:1, 1:prefix_len],
                                attention_mask[:1, 1:prefix_len].bool(), temperature, with_entropy)
    own = torch.cat([pre_hidden[:, -1:].expand(batch, -1, -1), suf_hidden[:, :-1]], dim=1)
    own_lp, own_h = _head_stats(weight, own, input_ids[:, prefix_len:], attention_mask[:, prefix_len:].bool(),
                                temperature, with_entropy)
    logp = torch.cat([pre_lp.expand(batch, -1), own_lp], dim=1)
    entropy = None if pre_h is None or own_h is None else torch.cat([pre_h.expand(batch, -1), own_h], dim=1)
    assert logp.shape == (batch, width - 1)
    return logp, entropy


def pick_tokens(logits: torch.Tensor, temperature: float, top_p: float) -> torch.Tensor:
    """Sample ids from [B, V] logits (greedy when temperature <= 0), nucleus-truncated at top_p."""
    if temperature <= 0:
        return logits.argmax(-1)
    probs = torch.softmax(logits.float() / temperature, -1)
    if top_p < 1.0:
        sorted_p, order = probs.sort(-1, descending=True)
        keep = sorted_p.cumsum(-1) - sorted_p < top_p  # always keeps the top token
        sorted_p = sorted_p * keep
        choice = torch.multinomial(sorted_p / sorted_p.sum(-1, keepdim=True), 1).squeeze(-1)
        return order.gather(-1, choice.unsqueeze(-1)).squeeze(-1)
    return torch.multinomial(probs, 1).squeeze(-1)


class SampledTokens:
    """What a sampler returns per original row: sampled ids, their log-probs under
    softmax(logits / temperature) (before top-p truncation: what the trainer's ratio compares
    against), and whether the row stopped on a stop id. Both samplers (the HF-cache one here and
    `episode_sampler`) record their decode steps with `take`, so they draw and keep tokens alike.

    `seeds` (one per original row): each token is drawn by inverting the CDF with
    `token_sampling.counter_uniform(seed, position)` instead of the torch RNG, so a row's tokens
    depend only on its seed and the logits, never on what it was batched with; two evaluations
    with the same seeds share their random draws (common random numbers: a before/after
    difference then measures the policy's change, not the luck of two draws)."""

    def __init__(self, batch: int, temperature: float, top_p: float, stop: torch.Tensor,
                 seeds: Sequence[int] | None = None) -> None:
        self.ids: list[list[int]] = [[] for _ in range(batch)]
        self.logprobs: list[list[float]] = [[] for _ in range(batch)]
        self.stopped = [False] * batch
        self.temperature, self.top_p, self.stop = temperature, top_p, stop
        self._scale = temperature if temperature > 0 else 1.0
        self.seeds = None if seeds is None else torch.tensor(list(seeds), dtype=torch.long, device=stop.device)

    def take(self, next_logits: torch.Tensor, done: torch.Tensor, rows: Sequence[int],
             positions: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Sample a token for each row of the batch (`rows[i]`: row i's original index; with
        `seeds`, `positions[i]`: the position the token takes in its sequence) and record it for
        the rows not `done`; returns (tokens, `done` with the rows that hit a stop id)."""
        if self.seeds is not None and self.temperature > 0:
            if positions is None:
                raise ValueError("seeded sampling needs each row's position")
            n = next_logits.shape[0]
            uniform = counter_uniform(self.seeds[torch.tensor(list(rows), device=self.seeds.device)], positions.long())
            token, logp = sample_tokens(next_logits, next_logits.new_full((n,), self.temperature, dtype=torch.float32),
                                        next_logits.new_full((n,), self.top_p, dtype=torch.float32), uniform,
                                        nucleus=self.top_p < 1.0)
        else:
            token = pick_tokens(next_logits, self.temperature, self.top_p)
            logp = torch.log_softmax(next_logits.float() / self._scale, -1).gather(-1, token.unsqueeze(-1)).squeeze(-1)
        hit = torch.isin(token, self.stop) & ~done
        for i in torch.nonzero(~done).flatten().tolist():
            self.ids[rows[i]].append(int(token[i]))
            self.logprobs[rows[i]].append(float(logp[i]))
        for i in torch.nonzero(hit).flatten().tolist():
            self.stopped[rows[i]] = True
        return token, done | hit

    def result(self) -> tuple[list[list[int]], list[list[float]], list[bool]]:
        return self.ids, self.logprobs, self.stopped


def static_cache_with_prefix(model: torch.nn.Module, kv: list[tuple[torch.Tensor, torch.Tensor]], batch: int,
                             max_len: int) -> StaticCache:
    """A pre-allocated cache of `max_len` positions per row, holding the shared prefix in every row.

    Decoding appends one position per step in place; a `DynamicCache` would re-copy the whole cache
    (prefix included, once per row) at every step, which dominates small-model decoding on CPU.
    """
    cache = StaticCache(config=model.config, max_cache_len=max_len)
    for layer, (k, v) in zip(cache.layers, kv):
        layer.update(k.expand(batch, -1, -1, -1), v.expand(batch, -1, -1, -1))
    return cache


@torch.no_grad()
def sample_with_shared_prefix(
    model: torch.nn.Module, prompts: Sequence[Sequence[int]], prefix_len: int, *, max_new_tokens: int,
    temperature: float, top_p: float, stop_ids: Sequence[int], pad_id: int, device: torch.device,
    seeds: Sequence[int] | None = None,
) -> tuple[list[list[int]], list[list[float]], list[bool]]:
    """Sample continuations for prompts sharing `prefix_len` ids. Returns ids, their log-probs under
    softmax(logits / temperature) (pre-truncation: what the trainer's ratio compares against), and
    whether each stopped on a stop id. `seeds`: draws from (seed, position), see `SampledTokens`."""
    batch = len(prompts)
    suffixes = [list(p[prefix_len:]) for p in prompts]
    width = max(len(s) for s in suffixes)
    total = prefix_len + width + max_new_tokens
    ids = torch.full((batch, width), pad_id, dtype=torch.long)
    # One mask over the whole static cache: prefix, left-padded suffixes, then generated positions.
    attention = torch.zeros((batch, total), dtype=torch.long)
    attention[:, :prefix_len] = 1
    for i, s in enumerate(suffixes):  # left-pad the suffixes: every row's last id is at the end
        ids[i, width - len(s):] = torch.tensor(s)
        attention[i, prefix_len + width - len(s): prefix_len + width] = 1
    ids, attention = ids.to(device), attention.to(device)
    kv, _ = prefix_pass(model, torch.tensor(list(prompts[0][:prefix_len]), device=device))
    cache = static_cache_with_prefix(model, kv, batch, total)
    suffix_mask = attention[:, prefix_len:prefix_len + width]
    out = model(input_ids=ids, attention_mask=attention, position_ids=prefix_len + (suffix_mask.cumsum(1) - 1).clamp(min=0),
                past_key_values=cache, cache_position=torch.arange(prefix_len, prefix_len + width, device=device),
                use_cache=True)
    next_logits = out.logits[:, -1]
    positions = prefix_len + suffix_mask.sum(1) - 1
    stop = torch.tensor(list(stop_ids), dtype=torch.long, device=device)
    rows = list(range(batch))  # original index of each row still in the batch
    done = torch.zeros(batch, dtype=torch.bool, device=device)
    sampled = SampledTokens(batch, temperature, top_p, stop, seeds)
    for step in range(max_new_tokens):
        token, done = sampled.take(next_logits, done, rows, positions + 1)  # `positions`: each row's last id
        if bool(done.all()) or step == max_new_tokens - 1:
            break
        if int((~done).sum()) <= len(rows) // 2:
            # Drop finished rows once they are half the batch: the long tail of a few unfinished
            # rows then decodes at a small batch's cost.
            keep = torch.nonzero(~done).flatten()
            cache.reorder_cache(keep)
            rows = [rows[i] for i in keep.tolist()]
            token, done, attention, positions = token[keep], done[keep], attention[keep], positions[keep]
        token = torch.where(done, torch.full_like(token, pad_id), token)
        slot = prefix_len + width + step
        attention[:, slot] = 1
        positions = positions + 1
        out = model(input_ids=token.unsqueeze(1), attention_mask=attention, position_ids=positions.unsqueeze(1),
                    past_key_values=cache, cache_position=torch.tensor([slot], device=device), use_cache=True)
        next_logits = out.logits[:, -1]
    return sampled.result()


def batch_logprobs(
    model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, *, temperature: float = 1.0,
    with_entropy: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs of `input_ids[:, 1:]` ([B, L-1], right-padded rows; position t scores token t+1),
    sharing the rows' common prefix when it is long enough; entropies if asked. Positions past a
    row's end score 0. With an `output_head` the logits are never materialised (`head_token_stats`)."""
    temperature = temperature if temperature > 0 else 1.0
    head = output_head(model)
    rows = [r[: int(m.sum())] for r, m in zip(input_ids.tolist(), attention_mask)]
    prefix_len = common_prefix_length(rows)
    if head is not None and prefix_len >= MIN_SHARED_PREFIX and not recomputing(model):  # checkpointing drops the prefix's cache
        return shared_prefix_logprobs(model, input_ids, attention_mask, prefix_len, temperature=temperature,
                                      with_entropy=with_entropy)
    if head is not None:
        body, weight = head
        hidden = body(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).last_hidden_state
        return _head_stats(weight, hidden[:, :-1], input_ids[:, 1:], attention_mask[:, 1:].bool(), temperature,
                           with_entropy)
    logits = model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).logits[:, :-1]
    logp = token_logprobs(logits, input_ids[:, 1:], temperature) * attention_mask[:, 1:]
    return logp, (entropy_from_logits(logits, temperature) * attention_mask[:, 1:] if with_entropy else None)
