"""Bookkeeping for the paged KV cache: free pool, refcounts, prefix cache, LRU eviction.

Pure Python, no torch: it hands out block ids; the tensor lives in ``kv_cache.KVCache``.
A sequence's KV for position ``p`` lives at slot
``table.block_ids[p // block_size] * block_size + p % block_size``.

Block states (every block is in exactly one):
  * free      -- refcount 0, not in the prefix cache, in ``_free``;
  * evictable -- refcount 0, in the prefix cache, in the LRU ``_evictable`` (still hittable);
  * used      -- refcount > 0 (cached or not).

Invariants enforced (asserted, and checked in full by ``check_invariants``):
  * Only *committed* blocks (full, KV computed and final) are in the prefix cache, and only
    committed blocks are ever shared, so a sequence never writes into a shared block.
  * A table's committed blocks are a prefix of it: ``len(block_hashes) * block_size <=
    num_tokens``. ``truncate`` may not cut into that prefix; it only drops speculative
    positions after the verified (committed) prefix, so dropped blocks are never cached.
  * ``allocate`` matches at most ``(len(prompt) - 1) // block_size`` blocks, so the block
    holding the last prompt token is always fresh: at least one prompt token is computed.
Every operation costs O(blocks touched); only ``check_invariants`` scans the pool.
"""

from __future__ import annotations

import hashlib
import struct
from collections import OrderedDict, deque
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field

ExtraKey = bytes | str | int | tuple | None  # tuples nest; anything else is a TypeError
ROOT_HASH = bytes(16)  # parent hash of a sequence's first block


def _encode_extra(key: object) -> bytes:
    """Deterministic, unambiguous (tagged, length-prefixed) bytes for an extra key."""
    if key is None:
        return b"n"
    if isinstance(key, tuple):
        return b"t" + struct.pack("<I", len(key)) + b"".join(_encode_extra(k) for k in key)
    if isinstance(key, int):
        tag, raw = b"i", str(int(key)).encode()
    elif isinstance(key, str):
        tag, raw = b"s", key.encode()
    elif isinstance(key, bytes):
        tag, raw = b"b", key
    else:
        raise TypeError(f"extra_key must be bytes, str, int, tuple or None, got {type(key)!r}")
    return tag + struct.pack("<I", len(raw)) + raw


def block_hash(parent: bytes, token_ids: Sequence[int], extra_key: ExtraKey = None) -> bytes:
    """128-bit blake2b of (parent hash, the block's token ids, extra key); process-independent."""
    h = hashlib.blake2b(digest_size=16)
    h.update(parent)
    h.update(struct.pack(f"<I{len(token_ids)}q", len(token_ids), *token_ids))
    h.update(_encode_extra(extra_key))
    return h.digest()


@dataclass
class BlockTable:
    """The blocks of one sequence. Created by ``BlockManager.allocate``; mutated only by it."""

    seq_key: Hashable
    block_ids: list[int]
    num_tokens: int  # tokens whose KV slots are allocated
    num_cached_tokens: int = 0  # prefix-cache hit at allocation; never the whole prompt
    # content hashes of the first len(block_hashes) blocks: full, KV computed (committed)
    block_hashes: list[bytes] = field(default_factory=list)


class BlockManager:
    """Hands out KV blocks to sequences, shares full blocks by prefix hash, evicts LRU."""

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True):
        if num_blocks < 1 or block_size < 1:
            raise ValueError(
                f"num_blocks and block_size must be >= 1, got {num_blocks}, {block_size}"
            )
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self._ref = [0] * num_blocks
        self._hash_of: list[bytes | None] = [None] * num_blocks  # set iff in the prefix cache
        self._free: deque[int] = deque(range(num_blocks))
        self._evictable: OrderedDict[int, None] = OrderedDict()  # oldest first
        self._cached: dict[bytes, int] = {}
        self._tables: dict[Hashable, BlockTable] = {}
        self.prefix_hits = 0  # prompt tokens served from the prefix cache
        self.prefix_queries = 0  # prompt tokens looked up

    # -- counters ----------------------------------------------------------------------
    @property
    def num_total_blocks(self) -> int:
        return len(self._ref)

    @property
    def num_free_blocks(self) -> int:
        """Blocks an allocation could take: the free pool plus evictable cached blocks."""
        return len(self._free) + len(self._evictable)

    @property
    def num_fresh_blocks(self) -> int:
        """Blocks of the free pool alone: taking them evicts no cached prefix."""
        return len(self._free)

    @property
    def num_used_blocks(self) -> int:
        return self.num_total_blocks - self.num_free_blocks

    @property
    def num_cached_blocks(self) -> int:
        return len(self._cached)

    def refcount(self, block_id: int) -> int:
        return self._ref[block_id]

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    # -- operations ----------------------------------------------------------------------
    def allocate(
        self,
        seq_key: Hashable,
        token_ids: Sequence[int],
        extra_keys: Sequence[ExtraKey] | None = None,
    ) -> BlockTable | None:
        """Blocks for a prompt, reusing the longest cached prefix; None (no change) if short.

        ``extra_keys[i]`` (optional, may be shorter than the block count) is mixed into
        block i's hash, e.g. a digest of the image embeddings overlapping that block.
        ``prefix_hits``/``prefix_queries`` count prompt tokens of successful calls only, so a
        scheduler that retries a waiting request does not inflate them.
        """
        assert seq_key not in self._tables, f"sequence {seq_key!r} already has blocks"
        assert len(token_ids) >= 1, "cannot allocate an empty prompt"
        matched, hashes = self._match_prefix(token_ids, extra_keys)
        num_fresh = self.blocks_for(len(token_ids)) - len(matched)
        num_revived = sum(1 for b in matched if self._ref[b] == 0)
        if num_fresh > self.num_free_blocks - num_revived:
            return None
        for b in matched:  # revive before taking fresh blocks so they are not evicted
            self._incref(b)
        fresh = [self._take() for _ in range(num_fresh)]
        table = BlockTable(
            seq_key, matched + fresh, len(token_ids), len(matched) * self.block_size, hashes
        )
        self._tables[seq_key] = table
        self.prefix_queries += len(token_ids)
        self.prefix_hits += table.num_cached_tokens
        return table

    def can_append(self, table: BlockTable, num_new_tokens: int) -> bool:
        need = self.blocks_for(table.num_tokens + num_new_tokens) - len(table.block_ids)
        return need <= self.num_free_blocks

    def append_slots(self, table: BlockTable, num_new_tokens: int) -> bool:
        """Room for ``num_new_tokens`` more tokens (decode, or k+1 verify); False: no change."""
        assert self._tables.get(table.seq_key) is table, "table is not live"
        # ``can_append``'s rule, inlined: this runs for every sequence of every decode
        # step, and most steps' tokens fit in the last block (need <= 0)
        need = -(-(table.num_tokens + num_new_tokens) // self.block_size) - len(table.block_ids)
        if need > 0:
            if need > self.num_free_blocks:
                return False
            table.block_ids.extend(self._take() for _ in range(need))
        table.num_tokens += num_new_tokens
        return True

    def commit_full_blocks(
        self,
        table: BlockTable,
        token_ids: Sequence[int],
        extra_keys: Sequence[ExtraKey] | None = None,
    ) -> None:
        """Register newly full blocks of ``token_ids`` (tokens whose KV is computed and final,
        prompt and generated alike) in the prefix cache so later requests can hit them.
        Once committed, a block can no longer be truncated away (see ``truncate``)."""
        assert self._tables.get(table.seq_key) is table, "table is not live"
        assert len(token_ids) <= table.num_tokens, "committing tokens without KV slots"
        if not self.enable_prefix_caching:
            return
        bs = self.block_size
        parent = table.block_hashes[-1] if table.block_hashes else ROOT_HASH
        for i in range(len(table.block_hashes), len(token_ids) // bs):
            parent = block_hash(parent, token_ids[i * bs : (i + 1) * bs], _extra(extra_keys, i))
            table.block_hashes.append(parent)
            b = table.block_ids[i]
            # a duplicate (same content computed concurrently) stays private, uncached
            if parent not in self._cached and self._hash_of[b] is None:
                self._cached[parent] = b
                self._hash_of[b] = parent

    def truncate(self, table: BlockTable, num_tokens: int) -> None:
        """Roll back to ``num_tokens`` (rejected speculative positions); frees whole blocks
        beyond the new length. Never cuts into the committed prefix (asserted)."""
        assert self._tables.get(table.seq_key) is table, "table is not live"
        assert 0 <= num_tokens <= table.num_tokens, "truncate can only shrink"
        assert num_tokens >= len(table.block_hashes) * self.block_size, (
            "truncate would cut into committed (prefix-cached) blocks"
        )
        keep = self.blocks_for(num_tokens)
        for b in reversed(table.block_ids[keep:]):
            self._decref(b)
        del table.block_ids[keep:]
        table.num_tokens = num_tokens

    def free(self, table: BlockTable) -> None:
        """Release every block; cached ones become evictable (tail blocks evicted first)."""
        assert self._tables.get(table.seq_key) is table, "double free or unknown table"
        del self._tables[table.seq_key]
        for b in reversed(table.block_ids):
            self._decref(b)
        table.block_ids = []
        table.num_tokens = 0

    def reset_prefix_cache(self) -> None:
        """Forget every cached hash (e.g. after weights change). Live tables keep working."""
        for b in self._cached.values():
            self._hash_of[b] = None
        self._free.extend(self._evictable)
        self._evictable.clear()
        self._cached.clear()

    def check_invariants(self) -> None:
        """Full consistency check, O(total blocks): for tests and debugging only."""
        bs, refs = self.block_size, [0] * self.num_total_blocks
        for t in self._tables.values():
            assert len(t.block_ids) == self.blocks_for(t.num_tokens)
            assert t.num_cached_tokens <= len(t.block_hashes) * bs <= t.num_tokens
            for b in t.block_ids:
                refs[b] += 1
            for b, h in zip(t.block_ids, t.block_hashes, strict=False):
                assert self._hash_of[b] in (None, h), "cached hash differs from content"
        assert refs == self._ref, "refcounts differ from table references"
        free, evictable = set(self._free), set(self._evictable)
        used = {b for b, r in enumerate(self._ref) if r > 0}
        assert len(free) == len(self._free) and not free & evictable and not used & free
        assert not used & evictable and len(free | evictable | used) == self.num_total_blocks
        assert all(self._hash_of[b] is None for b in free)
        assert all(self._hash_of[b] is not None for b in evictable)
        registered = {b: h for b, h in enumerate(self._hash_of) if h is not None}
        assert registered == {b: h for h, b in self._cached.items()}
        committed = {b for t in self._tables.values() for b in t.block_ids[: len(t.block_hashes)]}
        assert set(registered) <= committed | evictable, "a cached block is not full"

    # -- internals -----------------------------------------------------------------------
    def _match_prefix(
        self, token_ids: Sequence[int], extra_keys: Sequence[ExtraKey] | None
    ) -> tuple[list[int], list[bytes]]:
        """Cached blocks of the longest prefix that ends strictly before the last token."""
        if not self.enable_prefix_caching:
            return [], []
        bs, matched, hashes, parent = self.block_size, [], [], ROOT_HASH
        for i in range((len(token_ids) - 1) // bs):
            parent = block_hash(parent, token_ids[i * bs : (i + 1) * bs], _extra(extra_keys, i))
            b = self._cached.get(parent)
            if b is None:
                break
            matched.append(b)
            hashes.append(parent)
        return matched, hashes

    def _take(self) -> int:
        """A block with refcount 1: from the free pool, else by evicting the LRU cached one."""
        if self._free:
            b = self._free.popleft()
        else:
            b, _ = self._evictable.popitem(last=False)
            h = self._hash_of[b]
            assert h is not None
            del self._cached[h]
            self._hash_of[b] = None
        self._ref[b] = 1
        return b

    def _incref(self, b: int) -> None:
        if self._ref[b] == 0:
            del self._evictable[b]
        self._ref[b] += 1

    def _decref(self, b: int) -> None:
        assert self._ref[b] > 0, f"block {b} freed twice"
        self._ref[b] -= 1
        if self._ref[b] == 0:
            if self._hash_of[b] is not None:
                self._evictable[b] = None  # most recently used end
            else:
                self._free.append(b)


def _extra(extra_keys: Sequence[ExtraKey] | None, i: int) -> ExtraKey:
    return extra_keys[i] if extra_keys is not None and i < len(extra_keys) else None
