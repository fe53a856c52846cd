"""Batched multi-turn sampling on `Qwen2Kernel`: a prefix tree for new prompts, each episode's KV
cache kept across its turns, finished rows dropped.

A GRPO step samples G episodes per task, and every prompt starts with the same system message. So
for rows without a cache (an episode's first turn) the common prefix of all distinct prompts is
run once, each distinct prompt's remainder once on top of it, and the result copied into the rows
asking for that prompt: the first turn needs no per-row prefill beyond the prompt's last token. A
later turn of an episode whose cache was kept (`EpisodeKV`) runs only the tokens appended since
(its last sampled token, the tool observation, the next assistant header). Decoding then works as
`prefix.sample_with_shared_prefix` does (same token choice, same log-probs, same random draws per
step, same rule for dropping finished rows), so what is sampled does not change.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import torch

from skyrl_tool_agent.policy.prefix import SampledTokens, common_prefix_length
from skyrl_tool_agent.policy.qwen2_kernel import KVCache, Qwen2Kernel, pad_rows


@dataclass
class _Kept:
    """One episode's cache after a turn: row `row` of `cache` holds the keys/values of `ids`."""

    cache: KVCache
    row: int
    ids: list[int]


class EpisodeKV:
    """The KV caches of the episodes of one collection, by episode key, between their turns.

    A cache is used only when the tokens it holds are a strict prefix of the episode's next prompt
    (anything else, e.g. a retried episode reusing its key, starts afresh), and is consumed by it.
    """

    def __init__(self) -> None:
        self._kept: dict[Hashable, _Kept] = {}

    def __len__(self) -> int:
        return len(self._kept)

    def keep(self, key: Hashable, cache: KVCache, row: int, ids: list[int]) -> None:
        self._kept[key] = _Kept(cache, row, ids)

    def drop(self, key: Hashable) -> None:
        """Forget the episode `key` (it has ended): a cache kept for a turn that never comes would
        otherwise hold its whole generation batch's KV until the collection ends."""
        self._kept.pop(key, None)

    def take(self, key: Hashable, prompt: Sequence[int]) -> _Kept | None:
        kept = self._kept.pop(key, None)
        if kept is None or len(kept.ids) >= len(prompt) or list(prompt[: len(kept.ids)]) != kept.ids:
            return None
        return kept


@dataclass
class _Row:
    source: KVCache  # where the row's first `length` positions come from
    source_row: int
    length: int
    pending: list[int]  # tokens to run before the first sampled one (at least the prompt's last)


def _prefix_tree(kernel: Qwen2Kernel, prompts: Sequence[Sequence[int]], pad_id: int) -> tuple[KVCache, list[int]]:
    """A cache with one row per distinct prompt holding all of it but its last token, and the
    index of each prompt's row. The distinct prompts' common prefix is run once and becomes the
    cache's root (kept once, not per row)."""
    distinct: dict[tuple[int, ...], int] = {}
    index = [distinct.setdefault(tuple(p), len(distinct)) for p in prompts]
    stems = [list(p[:-1]) for p in distinct]
    shared = common_prefix_length([list(p) for p in distinct]) if len(distinct) > 1 else len(stems[0])
    device = kernel.device
    root = None
    if shared:
        root = kernel.new_cache(1, shared)
        kernel.forward(root, torch.tensor([stems[0][:shared]], device=device), torch.zeros(1, dtype=torch.long, device=device))
    rests = [s[shared:] for s in stems]
    tree = kernel.new_cache(len(stems), max(len(r) for r in rests) + 1, root)
    if any(rests):  # an empty remainder gets a pad written past its row's length: harmless
        ids, _ = pad_rows([r or [pad_id] for r in rests], pad_id, device)
        kernel.forward(tree, ids, torch.full((len(stems),), shared, dtype=torch.long, device=device))
    return tree, index


def _gather(kernel: Qwen2Kernel, rows: Sequence[_Row], capacity: int) -> KVCache:
    """A cache with room for `capacity` positions per row, each row's first positions copied from
    its source. Rows whose sources all share one root keep it shared; otherwise each row gets its
    source's root copied in (a mix of first turns and continued episodes in one batch)."""
    roots = {id(r.source.root_keys): r.source for r in rows}
    shared_root = len(roots) == 1 and next(iter(roots.values())).root_keys is not None
    template = rows[0].source
    offset = template.root_len if shared_root else 0
    batch = kernel.new_cache(len(rows), capacity - offset)
    if shared_root:
        batch.root_keys, batch.root_values = template.root_keys, template.root_values
    by_source: dict[int, list[int]] = {}
    for i, row in enumerate(rows):
        by_source.setdefault(id(row.source), []).append(i)
    for members in by_source.values():
        source = rows[members[0]].source
        start = source.root_len - offset  # where the source's own part goes in the batch's rows
        length = max(rows[i].length for i in members) - source.root_len
        dst = torch.tensor(members, device=kernel.device)
        src = torch.tensor([rows[i].source_row for i in members], device=kernel.device)
        for layer in range(kernel.layers_n):
            for target, origin, root in ((batch.keys[layer], source.keys[layer], source.root_keys),
                                         (batch.values[layer], source.values[layer], source.root_values)):
                target[dst, :, start:start + length] = origin.index_select(0, src)[:, :, :length]
                if start:  # the source's root, copied into these rows
                    target[dst, :, :start] = root[layer].unsqueeze(0)  # type: ignore[index]
    return batch


@torch.no_grad()
def sample_episodes(
    kernel: Qwen2Kernel, prompts: Sequence[Sequence[int]], *, max_new_tokens: int, temperature: float, top_p: float,
    stop_ids: Sequence[int], pad_id: int, episode_keys: Sequence[Hashable | None] | None = None,
    episode_kv: EpisodeKV | None = None, seeds: Sequence[int] | None = None,
) -> tuple[list[list[int]], list[list[float]], list[bool]]:
    """Sample a continuation per prompt. Returns ids, their log-probs under softmax(logits /
    temperature) (before top-p truncation: what the trainer's ratio compares against), and whether
    each stopped on a stop id. With `episode_kv`, prompts whose `episode_keys[i]` has a kept cache
    continue from it, and every row's cache is kept under its key for the episode's next turn.
    `seeds` (one per prompt): counter-based draws keyed by (seed, position), see `SampledTokens`."""
    batch = len(prompts)
    keys = list(episode_keys) if episode_keys is not None else [None] * batch
    device = kernel.device
    kept = [episode_kv.take(k, p) if episode_kv is not None and k is not None else None for k, p in zip(keys, prompts)]
    fresh = [i for i in range(batch) if kept[i] is None]
    rows: list[_Row | None] = [None] * batch
    if fresh:
        tree, index = _prefix_tree(kernel, [prompts[i] for i in fresh], pad_id)
        for i, u in zip(fresh, index):
            rows[i] = _Row(tree, u, len(prompts[i]) - 1, [prompts[i][-1]])
    for i, k in enumerate(kept):
        if k is not None:
            rows[i] = _Row(k.cache, k.row, len(k.ids), list(prompts[i][len(k.ids):]))
    ready: list[_Row] = [r for r in rows if r is not None]
    starts = torch.tensor([r.length for r in ready], device=device)
    ids, last = pad_rows([r.pending for r in ready], pad_id, device)
    cache = _gather(kernel, ready, int(starts.max()) + ids.shape[1] + max_new_tokens)
    next_logits = kernel.forward(cache, ids, starts, last)
    positions = starts + last + 1  # where each row's next token goes

    stop = torch.tensor(list(stop_ids), dtype=torch.long, device=device)
    alive = list(range(batch))  # original index of each row still in the batch
    done = torch.zeros(batch, dtype=torch.bool, device=device)
    sampled = SampledTokens(batch, temperature, top_p, stop, seeds)

    def keep_rows(which: Sequence[int]) -> None:
        """Keep the cache of rows `which` (positions in the current batch) for their next turn:
        it holds the prompt and every sampled token but the last (never fed)."""
        if episode_kv is None:
            return
        for r in which:
            i = alive[r]
            if keys[i] is not None:
                episode_kv.keep(keys[i], cache, r, list(prompts[i]) + sampled.ids[i][:-1])

    for step in range(max_new_tokens):
        token, done = sampled.take(next_logits, done, alive, positions)
        if bool(done.all()) or step == max_new_tokens - 1:
            break
        if int((~done).sum()) <= len(alive) // 2:
            # The same rule as the HF-cache sampler (so the random draws per step match): drop
            # finished rows once they are half the batch, keeping their caches first.
            keep_rows(torch.nonzero(done).flatten().tolist())
            live = torch.nonzero(~done).flatten()
            cache = cache.select(live)
            alive = [alive[r] for r in live.tolist()]
            token, done, positions = token[live], done[live], positions[live]
        token = torch.where(done, torch.full_like(token, pad_id), token)
        next_logits = kernel.forward(cache, token.unsqueeze(1), positions)
        positions = positions + 1
    keep_rows(range(len(alive)))
    return sampled.result()
