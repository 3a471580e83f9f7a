"""Rope, the KV-cache write and paged attention of a step's tokens as device functions
(``attend_group``), for steps of up to ``TK`` (16) tokens a sequence (decodes, verify
blocks, short chunks; CUDA): the persistent decode stack's attention phase.

Each (sequence, kv head, query tile) program rotates its query rows and the keys it
reads, stores the keys and values of the step's tokens in their cache slots, waits for
its own threads, and attends over the cache, a long context's splits spread over
programs of their own as the layered kernel spreads them (the last program of a group
merges and leaves its counter at 0). ``rope_attention`` launches that phase alone, so
tests hold it to the layered path's two kernels bit for bit; no serving path calls it
(the layered path runs the two kernels: one launch was no faster, docs/performance.md).

Reference: ``triton_fused.rope_write_kv`` then ``cuda_paged_attention``.
"""

from __future__ import annotations

import torch

from mmserve.kernels.triton_attention import (
    BLOCK_M,
    LAUNCH,
    PREFETCH_MAX_PROGRAMS,
    _spread_counts,
    block_keys,
    paged_metadata,
    prefetch_mode,
    split_keys,
    split_states,
    spread_programs,
)
from mmserve.kernels.triton_fused import _round_mode
from mmserve.kernels.triton_pdl import pdl_args

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - CPU-only installs
    triton = None

TK = 16  # most tokens a sequence may have in a step: a tile writes its sequence's up to it


if triton is not None:
    from mmserve.kernels.triton_attention import (
        attend_keys,
        load_queries,
        merge_partials,
        store_attention,
        tile_rows,
    )
    from mmserve.kernels.triton_fused import _rotated_at, rope_rows, store_halves_at
    from mmserve.kernels.triton_pdl import wait_previous

    @triton.jit
    def rope_write_tile(
        qkv,
        qrot,
        kc,
        vc,
        cos_ptr,
        sin_ptr,
        pos_ptr,
        slot_ptr,
        qstart,
        qlen,
        tile,
        h,
        k_lo,
        k_hi,
        HQ: tl.constexpr,
        HKV: tl.constexpr,
        D: tl.constexpr,
        G: tl.constexpr,
        BM: tl.constexpr,
        TK: tl.constexpr,
        ROUND: tl.constexpr,
    ):
        """What attention tile ``tile`` of kv head ``h`` reads of keys ``k_lo .. k_hi - 1``,
        for the sequence of ``qlen`` tokens from flat row ``qstart``: its ``BM`` query rows
        (``attention_rows``' layout, row = token * G + head) rotated into ``qrot``; the keys
        of its tokens in that range (up to its last row's) rotated into their cache slots,
        the values copied there. All in one pass, so a block of tokens waits for memory as
        one token does; another tile's
        program writes the same bytes for the tokens they share. ``_rope_write_kv_kernel``'s
        elementwise math, so the bits do not depend on the tiling; a negative slot writes
        no key or value."""
        HALF: tl.constexpr = D // 2
        QKV: tl.constexpr = (HQ + 2 * HKV) * D
        rows = tile * BM + tl.arange(0, BM)
        ok_q = rows < qlen * G
        tq = qstart + rows // G
        head = h * G + rows % G
        pos = tl.load(pos_ptr + tq, mask=ok_q, other=0)[:, None]
        c1, s1, c2, s2 = rope_rows(cos_ptr, sin_ptr, pos, HALF, HALF, ROUND)
        o1, o2 = _rotated_at(
            qkv + (tq * QKV + head * D)[:, None], ok_q[:, None], c1, s1, c2, s2, HALF, ROUND, ".cg"
        )
        store_halves_at(qrot + (tq * (HQ * D) + head * D)[:, None], o1, o2, ok_q[:, None], HALF)
        t = tl.arange(0, TK)
        ok_t = t <= tl.minimum(qlen - 1, ((tile + 1) * BM - 1) // G)
        tk = qstart + t
        slot = tl.load(slot_ptr + tk, mask=ok_t, other=-1).to(tl.int64)
        pos = tl.load(pos_ptr + tk, mask=ok_t, other=0)
        ok_k = ((slot >= 0) & (pos >= k_lo) & (pos < k_hi))[:, None]
        c1, s1, c2, s2 = rope_rows(cos_ptr, sin_ptr, pos[:, None], HALF, HALF, ROUND)
        src = qkv + (tk * QKV + HQ * D + h * D)[:, None]
        o1, o2 = _rotated_at(src, ok_k, c1, s1, c2, s2, HALF, ROUND, ".cg")
        row = (slot * HKV * D + h * D)[:, None]
        store_halves_at(kc + row, o1, o2, ok_k, HALF)
        d = tl.arange(0, D)[None, :]
        tl.store(
            vc + row + d, tl.load(src + HKV * D + d, mask=ok_k, cache_modifier=".cg"), mask=ok_k
        )

    @triton.jit
    def split_run(lo, hi, sub, per, SPLIT: tl.constexpr):
        """Program ``sub`` of ``per`` on a tile visiting keys ``lo .. hi - 1`` -> (the
        tile's first and end split, whether the program runs the whole tile (one program
        or one split), its run of splits ``j0 .. j1 - 1`` and their keys ``k_lo .. k_hi - 1``
        (the tile's own when whole))."""
        first = lo // SPLIT
        last = tl.cdiv(hi, SPLIT)
        n = last - first
        run = tl.cdiv(n, per)
        j0 = first + sub * run
        j1 = tl.minimum(j0 + run, last)
        whole = (per == 1) | (n == 1)
        k_lo = tl.where(whole, lo, tl.maximum(lo, j0 * SPLIT))
        k_hi = tl.where(whole, hi, tl.minimum(hi, j1 * SPLIT))
        return first, last, whole, j0, j1, k_lo, k_hi

    @triton.jit
    def attend_group(
        g,
        sub,
        per,
        layer,
        qkv,
        qrot,
        attn,
        kc,
        vc,
        cos_ptr,
        sin_ptr,
        pos_ptr,
        slot_ptr,
        tables_ptr,
        ctx_ptr,
        qstart_ptr,
        qlen_ptr,
        part_ptr,
        count_ptr,
        groups,
        att_tiles,
        SPLITS,
        scale_log2,
        stride_kb,
        stride_ks,
        stride_kh,
        stride_bt,
        HQ: tl.constexpr,
        HKV: tl.constexpr,
        D: tl.constexpr,
        PAGE: tl.constexpr,
        BM: tl.constexpr,
        BN: tl.constexpr,
        SPLIT: tl.constexpr,
        TK: tl.constexpr,
        ROUND: tl.constexpr,
        ATT_PREFETCH: tl.constexpr,
        RESET: tl.constexpr,
        ROPED: tl.constexpr = False,
        STAGES: tl.constexpr = 0,
        V_L1: tl.constexpr = False,
        KT: tl.constexpr = False,
    ):
        """Program ``sub`` of ``per`` on group ``g``: with one program or one split, the
        whole tile in order; else a run of consecutive splits (the block loop goes on
        across them, each split's state to ``part_ptr``), and the program that finishes
        the group's last run merges them all in order (``RESET``: and zeroes the group's
        counter, for a launch that does not zero them first). ``ROPED``: an earlier phase
        of the launch rotated the queries into ``qrot`` and wrote the keys and values to
        the cache (``triton_fused.qkv_rope_tile``): only the attention here (its queries
        and cache read from L2); else the program first rotates the tile's queries into
        ``qrot`` and writes what it reads of the cache (``rope_write_tile``). ``STAGES``: the
        key loop's pipeline depth (0: the kernel's; speed only); ``V_L1``, ``KT``:
        ``attend_keys``'."""
        G: tl.constexpr = HQ // HKV
        Q: tl.constexpr = HQ * D
        seq = g // (HKV * att_tiles)
        h = g // att_tiles % HKV
        tile = g % att_tiles
        row_ok, tok, head, qpos, lo, hi, qlen, qstart = tile_rows(
            seq, tile, h, qlen_ptr, ctx_ptr, qstart_ptr, G, BM, BN, 0
        )
        table = tables_ptr + seq * stride_bt
        first, last, whole, j0, j1, k_lo, k_hi = split_run(lo, hi, sub, per, SPLIT)
        if tile * BM < qlen * G:
            if whole:  # every split here, merged in order
                if sub == 0:
                    if not ROPED:
                        rope_write_tile(
                            qkv,
                            qrot,
                            kc,
                            vc,
                            cos_ptr,
                            sin_ptr,
                            pos_ptr,
                            slot_ptr,
                            qstart,
                            qlen,
                            tile,
                            h,
                            lo,
                            hi,
                            HQ,
                            HKV,
                            D,
                            G,
                            BM,
                            TK,
                            ROUND,
                        )
                        tl.debug_barrier()  # the program's own writes, read back below
                    q = load_queries(qrot, row_ok, tok, head, Q, D, D, ROPED)
                    _, den, acc = attend_keys(
                        q,
                        qpos,
                        table,
                        kc,
                        vc,
                        kc,
                        vc,
                        h,
                        lo,
                        hi,
                        scale_log2,
                        stride_kb,
                        stride_ks,
                        0,
                        0,
                        D,
                        PAGE,
                        0,
                        BM,
                        BN,
                        SPLIT,
                        False,
                        ATT_PREFETCH,
                        stride_kh,
                        part_ptr,
                        False,
                        STAGES,
                        V_L1,
                        KT,
                    )
                    store_attention(attn, den, acc, row_ok, tok, head, Q, D, D)
            else:  # a run of consecutive splits a program, each split's state to ``part``
                if j0 < j1:
                    if not ROPED:
                        rope_write_tile(
                            qkv,
                            qrot,
                            kc,
                            vc,
                            cos_ptr,
                            sin_ptr,
                            pos_ptr,
                            slot_ptr,
                            qstart,
                            qlen,
                            tile,
                            h,
                            k_lo,
                            k_hi,
                            HQ,
                            HKV,
                            D,
                            G,
                            BM,
                            TK,
                            ROUND,
                        )
                        tl.debug_barrier()
                    q = load_queries(qrot, row_ok, tok, head, Q, D, D, ROPED)
                    part = part_ptr + g.to(tl.int64) * SPLITS * (2 * BM + BM * D)
                    attend_keys(
                        q,
                        qpos,
                        table,
                        kc,
                        vc,
                        kc,
                        vc,
                        h,
                        k_lo,
                        k_hi,
                        scale_log2,
                        stride_kb,
                        stride_ks,
                        0,
                        0,
                        D,
                        PAGE,
                        0,
                        BM,
                        BN,
                        SPLIT,
                        False,
                        ATT_PREFETCH,
                        stride_kh,
                        part,
                        True,
                        STAGES,
                        V_L1,
                        KT,
                    )
                    tl.debug_barrier()  # every thread's states stored, then counted
                    done = tl.atomic_add(
                        count_ptr + layer * groups + g, j1 - j0, sem="acq_rel", scope="gpu"
                    )
                    if done + (j1 - j0) == last - first:  # the group's last run: merge all
                        if RESET:  # the counter left at 0 for the next launch
                            tl.atomic_xchg(count_ptr + layer * groups + g, 0)
                        _, den, acc = merge_partials(part, first, last, BM, D, 4)
                        store_attention(attn, den, acc, row_ok, tok, head, Q, D, D)

    @triton.jit(do_not_specialize=["stride_bt"])  # as triton_attention's kernels
    def _rope_attention_kernel(
        qkv_ptr,
        qrot_ptr,
        o_ptr,
        kc_ptr,
        vc_ptr,
        cos_ptr,
        sin_ptr,
        pos_ptr,
        slot_ptr,
        tables_ptr,
        ctx_ptr,
        qstart_ptr,
        qlen_ptr,
        part_ptr,
        count_ptr,
        groups,
        att_tiles,
        PER,
        SPLITS,
        scale_log2,
        stride_kb,
        stride_ks,
        stride_kh,
        stride_bt,
        HQ: tl.constexpr,
        HKV: tl.constexpr,
        D: tl.constexpr,
        PAGE: tl.constexpr,
        BM: tl.constexpr,
        BN: tl.constexpr,
        SPLIT: tl.constexpr,
        TK: tl.constexpr,
        ROUND: tl.constexpr,
        PREFETCH: tl.constexpr,
        PDL: tl.constexpr,
    ):
        """Program ``sub`` of ``PER`` on group ``g`` (``attend_group``)."""
        wait_previous(PDL)  # before any exit: a grid never ends before its predecessor
        pid = tl.program_id(0)
        attend_group(
            pid // PER,
            pid % PER,
            PER,
            0,
            qkv_ptr,
            qrot_ptr,
            o_ptr,
            kc_ptr,
            vc_ptr,
            cos_ptr,
            sin_ptr,
            pos_ptr,
            slot_ptr,
            tables_ptr,
            ctx_ptr,
            qstart_ptr,
            qlen_ptr,
            part_ptr,
            count_ptr,
            groups,
            att_tiles,
            SPLITS,
            scale_log2,
            stride_kb,
            stride_ks,
            stride_kh,
            stride_bt,
            HQ,
            HKV,
            D,
            PAGE,
            BM,
            BN,
            SPLIT,
            TK,
            ROUND,
            PREFETCH,
            True,
        )


def rope_attention(
    qkv: torch.Tensor,
    heads: int,
    kv_heads: int,
    positions: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta,
    scale: float,
) -> torch.Tensor:
    """qkv (N, (Hq + 2 Hkv) D) contiguous, bf16 caches (blocks, bs, Hkv, D) -> attention
    output (N, Hq D), the step's keys and values stored at ``meta``'s slots: the bits of
    ``rope_write_kv`` then ``cuda_paged_attention`` (no window, at most ``TK`` tokens a
    sequence: ``applies``)."""
    n = qkv.shape[0]
    _, page, hkv, d = k_cache.shape
    assert hkv == kv_heads and qkv.shape[1] == (heads + 2 * kv_heads) * d and qkv.is_contiguous()
    assert k_cache.is_contiguous() and k_cache.stride() == v_cache.stride()
    pm = paged_metadata(meta, page)
    assert pm.max_query_len <= TK
    out = torch.empty(n, heads * d, dtype=qkv.dtype, device=qkv.device)
    b = pm.context_lens.shape[0]
    if b == 0 or n == 0:
        return out
    qrot = torch.empty_like(out)
    att_tiles = -(-pm.max_query_len * (heads // kv_heads) // BLOCK_M)
    groups = b * att_tiles * kv_heads
    per = spread_programs(groups, qkv.device)
    counts = _spread_counts(qkv.device) if per > 1 else None
    if counts is None:
        per = 1
    splits, part = split_states(groups if per > 1 else 0, pm.block_tables, page, d, qkv.device)
    prefetch = prefetch_mode(False) if groups < PREFETCH_MAX_PROGRAMS else 0
    _rope_attention_kernel[(groups * per,)](
        qkv,
        qrot,
        out,
        k_cache,
        v_cache,
        cos,
        sin,
        positions,
        pm.slot_mapping,
        pm.block_tables,
        pm.context_lens,
        pm.query_start,
        pm.query_lens,
        part,
        counts if counts is not None else torch.empty(1, dtype=torch.int32, device=qkv.device),
        groups,
        att_tiles,
        per,
        splits,
        scale * 1.4426950408889634,
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        pm.block_tables.stride(0),
        HQ=heads,
        HKV=kv_heads,
        D=d,
        PAGE=page,
        BM=BLOCK_M,
        BN=block_keys(d),
        SPLIT=split_keys(d),
        TK=TK,
        ROUND=_round_mode(qkv.dtype),
        PREFETCH=prefetch,
        **pdl_args(qkv),
        **LAUNCH,
    )
    return out
