"""The drafter model's own paged KV: per-request block tables, catch-up plans and rollback.

A model-based drafter (``draft_model.DraftModelDrafter``) keeps a private ``KVCache`` and
``BlockManager``, apart from the target's. For each request it remembers which tokens'
KV it holds, without copying the request's buffer: the first ``known_len`` tokens of
``token_ids`` as seen at the previous step (checked by their count and last token; the
engine only ever appends) followed by the draft tokens it fed itself (``fed``).

Next step the target has accepted a prefix of that draft and appended one token of its
own. ``DrafterKV.prepare`` keeps the KV of the longest prefix the cache shares with the
new ``token_ids``, rolls the rest back with ``BlockManager.truncate`` (bookkeeping only:
stale slots are simply overwritten later, nothing is copied) and reserves slots for the
catch-up tokens plus the ``k - 1`` drafts that will be fed back. At least the last
token of ``token_ids`` is always re-run, because its logits give the first draft token.

Invariant (between calls): ``table.num_tokens == known_len + len(fed)`` and every one of
those positions holds computed KV. Prefix caching is off: drafter KV is private.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import torch

from mmserve.engine.kv_cache import BlockManager, BlockTable, KVCache


@dataclass
class DraftSeqState:
    """What the drafter's cache holds for one request (see the module docstring)."""

    table: BlockTable
    known_len: int = 0  # leading tokens of token_ids whose KV is cached
    known_last: int = -1  # token_ids[known_len - 1], the cheap "same history" check
    fed: list[int] | None = None  # draft tokens cached at positions known_len.. (None: none)


class CatchUp(NamedTuple):
    """The tokens a request must run before drafting: ``token_ids[start:]``."""

    start: int  # first position to run (KV before it is cached and kept)
    tokens: list[int]


class DrafterKV:
    """The drafter model's KV pool plus one block table per live request id."""

    def __init__(self, num_layers: int, num_kv_heads: int, head_dim: int, num_blocks: int,
                 block_size: int, dtype: torch.dtype, device: torch.device) -> None:
        self.cache = KVCache(num_layers, num_blocks, block_size, num_kv_heads, head_dim,
                             dtype, device)
        self.blocks = BlockManager(num_blocks, block_size, enable_prefix_caching=False)
        self._seqs: dict[str, DraftSeqState] = {}

    @property
    def block_size(self) -> int:
        return self.blocks.block_size

    def block_ids(self, request_id: str) -> list[int]:
        return self._seqs[request_id].table.block_ids

    def prepare(self, request_id: str, token_ids: Sequence[int], k: int) -> CatchUp | None:
        """Roll back to the shared prefix and reserve ``len(catch-up) + k - 1`` slots.

        None when the pool is out of blocks; the request's cache then stays valid (rolled
        back to the shared prefix) and it simply gets no draft this step.
        """
        assert k >= 1 and len(token_ids) >= 1
        state = self._seqs.get(request_id)
        if state is None:
            return self._prepare_new(request_id, token_ids, k)
        shared = min(_shared_len(state, token_ids), len(token_ids) - 1)
        self.blocks.truncate(state.table, shared)
        self._remember(state, token_ids, shared, None)
        if not self.blocks.append_slots(state.table, len(token_ids) - shared + k - 1):
            return None
        return CatchUp(shared, [int(t) for t in token_ids[shared:]])

    def commit(self, request_id: str, token_ids: Sequence[int], fed: list[int]) -> None:
        """Record that ``token_ids`` and then ``fed`` now have computed KV."""
        state = self._seqs[request_id]
        self._remember(state, token_ids, len(token_ids), fed)
        assert state.table.num_tokens == len(token_ids) + len(fed), "slots != computed KV"

    def release(self, request_id: str) -> None:
        state = self._seqs.pop(request_id, None)
        if state is not None:
            self.blocks.free(state.table)

    def _prepare_new(self, request_id: str, token_ids: Sequence[int], k: int) -> CatchUp | None:
        table = self.blocks.allocate(request_id, token_ids)  # no hashing: prefix caching off
        if table is None:
            return None
        if not self.blocks.append_slots(table, k - 1):
            self.blocks.free(table)
            return None
        self._seqs[request_id] = DraftSeqState(table)
        return CatchUp(0, [int(t) for t in token_ids])

    @staticmethod
    def _remember(state: DraftSeqState, token_ids: Sequence[int], known: int,
                  fed: list[int] | None) -> None:
        state.known_len = known
        state.known_last = int(token_ids[known - 1]) if known else -1
        state.fed = fed


def _shared_len(state: DraftSeqState, token_ids: Sequence[int]) -> int:
    """Length of the prefix the cached tokens share with ``token_ids`` (O(len(fed)))."""
    known = state.known_len
    if known == 0 or len(token_ids) < known or int(token_ids[known - 1]) != state.known_last:
        return 0  # a new or rewritten history: nothing cached is trusted
    shared = known
    for cached in state.fed or []:
        if shared >= len(token_ids) or int(token_ids[shared]) != cached:
            break
        shared += 1
    return shared
