"""The drafter model's own paged KV: per-request block tables, catch-up plans and rollback.

A model-based drafter (``draft_model.DraftModelDrafter``) keeps a private paged KV tensor
(the ``(L, 2, blocks, block_size, Hkv, D)`` layout every model reads, see
``kernels.attention.kv_layer``) and a ``BlockPool``, apart from the target's. For each
request it remembers which tokens' KV it holds, without copying the request's buffer:
the first ``known_len`` tokens of ``token_ids`` as seen at the previous step (checked by
their count and last token; the engine only ever appends) followed by the draft tokens
it fed itself (``fed``).

Next step the target has accepted a prefix of that draft and appended one token of its
own. ``DrafterKV.prepare`` keeps the KV of the longest prefix the cache shares with the
new ``token_ids``, rolls the rest back with ``BlockPool.truncate`` (bookkeeping only:
stale slots are simply overwritten later, nothing is copied) and reserves slots for the
catch-up tokens plus the ``k - 1`` drafts that will be fed back. At least the last
token of ``token_ids`` is always re-run, because its logits give the first draft token.

Invariant (between calls): ``table.num_tokens == known_len + len(fed)`` and every one of
those positions holds computed KV. Drafter KV is private: no prefix cache, no sharing, so
its pool is a free list of whole blocks (the engine's ``BlockManager`` adds refcounts and
prefix hashing on top of the same slot arithmetic).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

import torch


@dataclass
class BlockTable:
    """One request's blocks: position ``p`` lives at slot
    ``block_ids[p // block_size] * block_size + p % block_size``."""

    block_ids: list[int] = field(default_factory=list)
    num_tokens: int = 0  # slots reserved (computed KV or about to be)


class BlockPool:
    """Whole blocks handed out from a free list; every operation is all-or-nothing.

    Invariant: every block is either free (in ``_free``, once) or used by one table."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError(
                f"the drafter's KV needs >= 1 block of >= 1 token, got "
                f"{num_blocks} blocks of {block_size}"
            )
        self.num_total_blocks, self.block_size = num_blocks, block_size
        self._free: deque[int] = deque(range(num_blocks))
        self._used: set[int] = set()

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def allocate(self, num_tokens: int) -> BlockTable | None:
        """A table with room for ``num_tokens``; None (no change) when the pool is short."""
        table = BlockTable()
        return table if self.append_slots(table, num_tokens) else None

    def append_slots(self, table: BlockTable, num_new_tokens: int) -> bool:
        """Room for ``num_new_tokens`` more tokens; False: no change."""
        need = self.blocks_for(table.num_tokens + num_new_tokens) - len(table.block_ids)
        if need > len(self._free):
            return False
        for _ in range(need):
            table.block_ids.append(b := self._free.popleft())
            self._used.add(b)
        table.num_tokens += num_new_tokens
        return True

    def truncate(self, table: BlockTable, num_tokens: int) -> None:
        """Roll back to ``num_tokens``; whole blocks beyond it go back to the pool."""
        assert 0 <= num_tokens <= table.num_tokens, "truncate can only shrink"
        keep = self.blocks_for(num_tokens)
        for b in reversed(table.block_ids[keep:]):
            assert b in self._used, f"block {b} freed twice"
            self._used.remove(b)
            self._free.append(b)
        del table.block_ids[keep:]
        table.num_tokens = num_tokens

    def free(self, table: BlockTable) -> None:
        self.truncate(table, 0)

    def check_invariants(self) -> None:
        """Full consistency check, O(total blocks): for tests and debugging only."""
        free = set(self._free)
        assert len(free) == len(self._free), "a block is free twice"
        assert not free & self._used and len(free | self._used) == self.num_total_blocks


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

    def __init__(
        self,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        num_blocks: int,
        block_size: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        self.blocks = BlockPool(num_blocks, block_size)
        # (L, 2, N, B, Hkv, D); zeros, not empty: padded reads must never see NaN garbage
        self.cache = torch.zeros(
            num_layers,
            2,
            num_blocks,
            block_size,
            num_kv_heads,
            head_dim,
            dtype=dtype,
            device=device,
        )
        self._seqs: dict[str, DraftSeqState] = {}

    @property
    def block_size(self) -> int:
        return self.blocks.block_size

    def block_ids(self, request_id: str) -> list[int]:
        return self._seqs[request_id].table.block_ids

    def num_slots(self, request_id: str) -> int:
        """Slots the request's table holds (computed KV, or reserved for this call)."""
        return self._seqs[request_id].table.num_tokens

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
        table = self.blocks.allocate(len(token_ids))
        if table is None:
            return None
        if not self.blocks.append_slots(table, k - 1):
            self.blocks.free(table)
            return None
        self._seqs[request_id] = DraftSeqState(table)
        return CatchUp(0, [int(t) for t in token_ids])

    @staticmethod
    def _remember(
        state: DraftSeqState, token_ids: Sequence[int], known: int, fed: list[int] | None
    ) -> None:
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
