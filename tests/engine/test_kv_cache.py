"""Tests for the paged KV cache tensor and its block manager (refcounts, prefix cache, LRU)."""

from __future__ import annotations

import dataclasses
import os
import random
import subprocess
import sys

import pytest
import torch

from mmserve.engine.kv_cache import BlockManager, BlockTable, KVCache, block_hash

BS = 4


def must(table: BlockTable | None) -> BlockTable:
    assert table is not None, "allocation unexpectedly failed"
    return table


def snapshot(mgr: BlockManager, *tables: BlockTable) -> tuple:
    counters = (mgr.num_free_blocks, mgr.num_cached_blocks, mgr.prefix_hits, mgr.prefix_queries)
    refs = [mgr.refcount(b) for b in range(mgr.num_total_blocks)]
    return refs, counters, [dataclasses.astuple(t) for t in tables]  # deep copies


def test_allocate_free_returns_free_count_and_cached_blocks_revive() -> None:
    mgr = BlockManager(8, BS)
    a = must(mgr.allocate("a", list(range(10))))
    assert len(a.block_ids) == 3 and a.num_tokens == 10 and mgr.num_used_blocks == 3
    mgr.commit_full_blocks(a, list(range(10)))
    ids = list(a.block_ids)
    mgr.free(a)
    assert mgr.num_free_blocks == 8 and mgr.num_used_blocks == 0
    assert mgr.num_cached_blocks == 2 and mgr.refcount(ids[0]) == 0  # evictable, hittable
    b = must(mgr.allocate("b", list(range(10))))  # revived from the LRU list
    assert b.block_ids[:2] == ids[:2] and b.num_cached_tokens == 8
    assert mgr.refcount(ids[0]) == 1 and mgr.num_free_blocks == 5
    mgr.check_invariants()


def test_prefix_sharing_and_last_token_rule() -> None:
    mgr = BlockManager(16, BS)
    prompt = list(range(100, 110))  # 2 full blocks + 2 tokens
    a = must(mgr.allocate("a", prompt))
    mgr.commit_full_blocks(a, prompt)
    b = must(mgr.allocate("b", prompt))
    assert (a.num_cached_tokens, b.num_cached_tokens) == (0, 8)
    assert b.block_ids[:2] == a.block_ids[:2]
    assert [mgr.refcount(x) for x in b.block_ids] == [2, 2, 1]  # last block fresh
    # a prompt that is exactly the cached blocks: the block of its last token is recomputed
    c = must(mgr.allocate("c", prompt[:8]))
    assert c.num_cached_tokens == 4 and c.block_ids[0] == a.block_ids[0]
    assert c.block_ids[1] not in a.block_ids
    # last token alone in a fresh block: 8 cached
    assert must(mgr.allocate("d", prompt[:9])).num_cached_tokens == 8
    assert mgr.prefix_hits == 20 and mgr.prefix_queries == 37
    mgr.check_invariants()


def test_different_extra_keys_do_not_share() -> None:
    mgr = BlockManager(16, BS)
    prompt = [7] * 9
    a = must(mgr.allocate("a", prompt, extra_keys=[b"img-1", b"img-1"]))
    mgr.commit_full_blocks(a, prompt, extra_keys=[b"img-1", b"img-1"])
    assert must(mgr.allocate("b", prompt, extra_keys=[b"img-2"])).num_cached_tokens == 0
    c = must(mgr.allocate("c", prompt, extra_keys=[b"img-1", b"img-2"]))
    assert c.num_cached_tokens == 4  # first block matches, second not
    assert must(mgr.allocate("d", prompt)).num_cached_tokens == 0


def test_block_hash_is_deterministic_and_unambiguous() -> None:
    root = bytes(16)
    code = f"from {block_hash.__module__} import *; print(block_hash(ROOT_HASH, [1], 'x').hex())"
    other = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, "PYTHONHASHSEED": "7"},
        capture_output=True,
        text=True,
        check=True,
    )
    assert other.stdout.strip() == block_hash(root, [1], "x").hex()  # not salted per process
    keys = [None, 1, "1", b"1", ("1",), ("a", "b"), ("ab",), (("a",), "b"), True]
    assert len({block_hash(root, [1], k) for k in keys}) == len(keys) - 1  # True == 1
    assert block_hash(root, [1, 2]) != block_hash(block_hash(root, [1]), [2])
    with pytest.raises(TypeError):
        block_hash(root, [1], 1.5)  # type: ignore[arg-type]


def _cached_then_freed(mgr: BlockManager, key: str, tokens: list[int]) -> list[int]:
    t = must(mgr.allocate(key, tokens))
    mgr.commit_full_blocks(t, tokens)
    ids = list(t.block_ids)
    mgr.free(t)
    return ids


def test_lru_eviction_order_prefers_free_pool() -> None:
    mgr = BlockManager(4, 2)
    x_ids = _cached_then_freed(mgr, "x", [1, 1, 1])
    y_ids = _cached_then_freed(mgr, "y", [2, 2, 2])  # x's cached block is older than y's
    assert mgr.num_free_blocks == 4 and mgr.num_cached_blocks == 2
    z = must(mgr.allocate("z", [3, 3, 3]))  # 2 blocks, both from the free pool
    assert mgr.num_cached_blocks == 2 and set(z.block_ids) == {x_ids[1], y_ids[1]}
    w = must(mgr.allocate("w", [4, 4, 4]))  # evicts both cached blocks, least recent first
    assert w.block_ids == [x_ids[0], y_ids[0]] and mgr.num_cached_blocks == 0
    mgr.check_invariants()


def test_eviction_removes_hash_and_lru_is_touched_on_hit() -> None:
    mgr = BlockManager(4, 2)
    _cached_then_freed(mgr, "x", [1, 1, 1])
    _cached_then_freed(mgr, "y", [2, 2, 2])
    _cached_then_freed(mgr, "x", [1, 1, 1])  # hit on x: x becomes most recently used
    z = must(mgr.allocate("z", [3] * 5))  # 3 blocks: 2 free + evict the LRU one (y's)
    assert mgr.num_cached_blocks == 1
    assert mgr.allocate("y2", [2, 2, 2]) is None  # 1 block left, 2 needed
    mgr.free(z)
    assert must(mgr.allocate("y2", [2, 2, 2])).num_cached_tokens == 0  # y's was evicted
    assert must(mgr.allocate("x2", [1, 1, 1])).num_cached_tokens == 2
    mgr.check_invariants()


def test_failed_allocate_changes_nothing() -> None:
    mgr = BlockManager(3, BS)
    ids = _cached_then_freed(mgr, "a", list(range(6)))  # block ids[0] evictable
    held = must(mgr.allocate("h", [9]))  # 1 block: 2 left, one of them the cached block
    assert ids[0] not in held.block_ids
    before = snapshot(mgr, held)
    # needs 3 blocks; reviving the cached one leaves 1 free for 2 fresh: must fail
    assert mgr.allocate("b", list(range(9))) is None
    assert snapshot(mgr, held) == before
    assert mgr.allocate("b", list(range(5))) is not None  # 1 revived + 1 fresh fits
    mgr.check_invariants()


def test_append_slots_grows_and_failing_changes_nothing() -> None:
    mgr = BlockManager(3, BS)
    t = must(mgr.allocate("a", list(range(3))))
    assert mgr.append_slots(t, 1) and len(t.block_ids) == 1 and t.num_tokens == 4
    assert mgr.append_slots(t, 5) and len(t.block_ids) == 3 and t.num_tokens == 9
    before = snapshot(mgr, t)
    assert not mgr.can_append(t, 4) and not mgr.append_slots(t, 4)
    assert snapshot(mgr, t) == before
    assert mgr.append_slots(t, 3) and t.num_tokens == 12


def test_truncate_frees_exactly_blocks_beyond() -> None:
    mgr = BlockManager(8, BS)
    t = must(mgr.allocate("a", list(range(6))))
    mgr.commit_full_blocks(t, list(range(6)))  # block 0 committed
    assert mgr.append_slots(t, 9)  # 15 tokens: 4 blocks (speculative verify)
    ids = list(t.block_ids)
    mgr.truncate(t, 9)  # keeps ceil(9/4) = 3 blocks
    assert t.block_ids == ids[:3] and t.num_tokens == 9 and mgr.refcount(ids[3]) == 0
    mgr.truncate(t, 8)  # exact boundary: block 2 goes
    assert t.block_ids == ids[:2] and mgr.num_free_blocks == 6
    with pytest.raises(AssertionError):
        mgr.truncate(t, 3)  # would cut into the committed block
    mgr.truncate(t, 4)
    assert t.block_ids == ids[:1]
    mgr.check_invariants()


def test_commit_includes_generated_tokens_and_duplicates_stay_private() -> None:
    mgr = BlockManager(16, BS)
    a = must(mgr.allocate("a", [1, 2, 3]))
    assert mgr.append_slots(a, 6)
    seq = [1, 2, 3, 4, 5, 6, 7, 8, 9]  # prompt + 6 generated
    mgr.commit_full_blocks(a, seq)
    assert len(a.block_hashes) == 2 and mgr.num_cached_blocks == 2
    assert must(mgr.allocate("b", seq + [10])).num_cached_tokens == 8
    c = must(mgr.allocate("c", [50] * 5))  # computed concurrently with d, same content
    d = must(mgr.allocate("d", [50] * 5))
    assert d.num_cached_tokens == 0
    mgr.commit_full_blocks(c, [50] * 5)
    mgr.commit_full_blocks(d, [50] * 5)  # duplicate: not registered, freed straight back
    assert mgr.num_cached_blocks == 3 and len(d.block_hashes) == 1
    mgr.free(d)
    mgr.check_invariants()


def test_reset_prefix_cache_keeps_live_tables() -> None:
    mgr = BlockManager(8, BS)
    _cached_then_freed(mgr, "a", list(range(9)))
    assert must(mgr.allocate("b", list(range(9)))).num_cached_tokens == 8
    mgr.reset_prefix_cache()  # "b" stays live and valid
    assert mgr.num_cached_blocks == 0
    assert must(mgr.allocate("c", list(range(9)))).num_cached_tokens == 0
    mgr.check_invariants()


class _Sim:
    """Engine-like random driver. ``kv[slot]`` is what a model would have written there (the
    token prefix and extra keys the KV depends on): prefix hits must read exactly what the
    prompt implies, and no write may land in a shared or committed block."""

    def __init__(self, rng: random.Random, num_blocks: int, caching: bool) -> None:
        self.rng, self.mgr = rng, BlockManager(num_blocks, BS, caching)
        self.kv: dict[int, tuple] = {}
        self.seqs: dict[int, tuple[BlockTable, list[int], list]] = {}  # key -> table, toks, eks
        self.next_key, self.bases = 0, [[rng.randrange(3) for _ in range(12)] for _ in range(3)]

    def content(self, toks: list[int], eks: list, p: int) -> tuple:
        return tuple(toks[: p + 1]), tuple(eks[: p // BS + 1])

    def write(self, key: int, start: int, end: int) -> None:
        t, toks, eks = self.seqs[key]
        for p in range(start, end):
            b = t.block_ids[p // BS]
            assert self.mgr.refcount(b) == 1 and p >= len(t.block_hashes) * BS
            self.kv[b * BS + p % BS] = self.content(toks, eks, p)

    def op_allocate(self) -> None:
        rng = self.rng
        toks = rng.choice(self.bases)[: rng.randrange(1, 13)] + [
            rng.randrange(3) for _ in range(rng.randrange(0, 6))
        ]
        eks = [rng.choice([None, None, b"img"]) for _ in range(16)]
        t = self.mgr.allocate(self.next_key, toks, eks)
        if t is None:
            return
        assert t.num_cached_tokens < len(toks) and t.num_cached_tokens % BS == 0
        for p in range(t.num_cached_tokens):
            assert self.kv[t.block_ids[p // BS] * BS + p % BS] == self.content(toks, eks, p)
        self.seqs[self.next_key] = (t, toks, eks)
        self.write(self.next_key, t.num_cached_tokens, len(toks))  # prefill writes the rest
        self.next_key += 1

    def op_commit(self, key: int) -> None:  # every written token is accepted as final
        t, toks, eks = self.seqs[key]
        self.mgr.commit_full_blocks(t, toks, eks)

    def op_append(self, key: int) -> None:  # decode / verify of k+1 drafted tokens
        t, toks, _ = self.seqs[key]
        k = self.rng.randrange(1, 6)
        if self.mgr.append_slots(t, k):
            toks.extend(self.rng.randrange(3) for _ in range(k))
            self.write(key, len(toks) - k, len(toks))

    def op_truncate(self, key: int) -> None:  # rejected positions roll back
        t, toks, _ = self.seqs[key]
        n = self.rng.randrange(len(t.block_hashes) * BS, len(toks) + 1)
        self.mgr.truncate(t, n)
        del toks[n:]

    def op_free(self, key: int) -> None:
        self.mgr.free(self.seqs.pop(key)[0])

    def check(self) -> None:
        mgr, refs = self.mgr, [0] * self.mgr.num_total_blocks
        for t, toks, _ in self.seqs.values():
            assert t.num_tokens == len(toks) and len(t.block_ids) == -(-len(toks) // BS)
            for b in t.block_ids:
                refs[b] += 1
        assert refs == [mgr.refcount(b) for b in range(mgr.num_total_blocks)]
        used = sum(r > 0 for r in refs)
        assert mgr.num_used_blocks == used == mgr.num_total_blocks - mgr.num_free_blocks
        mgr.check_invariants()

    def step(self) -> None:
        ops = [self.op_commit, self.op_append, self.op_truncate, self.op_free]
        if not self.seqs or self.rng.random() < 0.25:
            self.op_allocate()
        else:
            self.rng.choice(ops)(self.rng.choice(list(self.seqs)))
        self.check()


@pytest.mark.parametrize("seed", range(6))
def test_random_interleavings_keep_invariants(seed: int) -> None:
    sim = _Sim(random.Random(seed), num_blocks=24, caching=seed != 0)
    for _ in range(2000):
        sim.step()
    for key in list(sim.seqs):
        sim.op_free(key)
        sim.check()
    assert sim.mgr.num_free_blocks == 24 and sim.mgr.num_used_blocks == 0
    assert (sim.mgr.prefix_hits > 0) == (seed != 0)  # the workload did exercise sharing


def test_kv_cache_sizing_from_budget() -> None:
    per_block = KVCache.bytes_per_block(2, BS, 2, 8, torch.float32)
    assert per_block == 2 * 2 * BS * 2 * 8 * 4
    assert KVCache.blocks_for_budget(10 * per_block + 5, 2, BS, 2, 8, torch.float32) == 10
    assert KVCache.blocks_for_budget(10 * per_block, 2, BS, 2, 8, torch.bfloat16) == 20
    with pytest.raises(ValueError, match="at least 2"):
        KVCache.blocks_for_budget(per_block, 2, BS, 2, 8, torch.float32)
    cache = KVCache.from_budget(10 * per_block, 2, BS, 2, 8)
    assert cache.data.shape == (2, 2, 10, BS, 2, 8) and cache.nbytes == 10 * per_block


def test_layer_views_alias_the_one_tensor() -> None:
    cache = KVCache(3, 5, BS, 2, 8)
    k, v = cache.layer(1)[:2]
    assert k.shape == v.shape == (5, BS, 2, 8) and k._base is cache.data
    k[2, 3] = 1.0
    assert cache.data[1, 0, 2, 3].eq(1.0).all() and cache.data.sum() == 2 * 8
    new_v = torch.randn(3, 2, 8)
    slots = torch.tensor([0, 2 * BS + 1, 4 * BS + 3])  # (block 0, 0), (2, 1), (4, 3)
    v.view(-1, 2, 8).index_copy_(0, slots, new_v)  # how models write: by flat slot
    assert torch.equal(cache.data[1, 1, 2, 1], new_v[1]) and torch.equal(v[4, 3], new_v[2])
    assert cache.data[0].abs().sum() == 0 and cache.data[2].abs().sum() == 0
