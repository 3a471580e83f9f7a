"""A Llama decoder stack for a step of up to 16 tokens in one persistent Triton launch.

At batch 1 a small model's step is a chain of short kernels, each bound by its own
critical path (SmolLM2-135M: tens of microseconds a layer over six launches). Here a
fixed grid of at most one program per SM runs every layer; the six launches of a layer
become five phases separated by grid barriers (:mod:`mmserve.kernels.triton_grid`, about
a microsecond each):

A. RMSNorm + QKV product, tiles over the QKV columns, and in the epilogue the rope of q
   (into ``qrot``) and k and the cache write of k and v (``qkv_rope_tile``, the layered
   path's ``qkv_rope``; ``StackTuning.qkv_rope`` off: the plain product, ``fused_tile``,
   and phase B's programs rotate and write what they read, the write and the read then
   needing only a barrier of their threads);
B. per (sequence, kv head, 16-row query tile): attention over the cache in splits of
   ``split_keys`` keys (``attend_keys``), a long context's splits spread over programs
   of their own and merged in order by the last to finish;
C. o product + residual; D. RMSNorm + gate/up product + silu * up; E. down product +
   residual (``fused_tile``).

The rows are any step's of at most ``MAX_ROWS`` tokens, laid out as the paged-attention
metadata say: decodes of up to 16 sequences, a verify block (the last token and its
drafts, causal inside the block), a short prompt chunk, or a mix. Every GEMM phase runs
one 16-row tile whatever the row count, as the layered kernels' thin tiles do.

Bits. Every phase calls the device functions of the layered kernels
(:mod:`mmserve.kernels.triton_fused`, :mod:`mmserve.kernels.triton_attention`) with the
same arithmetic, so the stack's output equals the six-launch layer's bit for bit (tests
on the GPU); the tile shape differs, which the GEMM's invariance covers. So greedy
outputs do not depend on which path ran a step.

Every intermediate has its own buffer per layer (written once per launch), and values
another program wrote are read through L2 (``.cg``), never a stale L1 line.

Prefetch. The weights (~7 MB a layer at SmolLM2-135M) and the cache stream from HBM, so
each phase's first loads waited on HBM latency. While phase B runs, the last ``WORKERS``
programs (past any step's phase-B items) ask L2 for the next layer's weights, norm
weights and cached keys and values (``prefetch.global.L2``: no register waits for it).
Issued by every program at a layer's start instead, the asking costs the QKV phase more
than it saves (docs/performance.md). A hint moves no bits.
"""

from __future__ import annotations

import os

import torch

from mmserve.kernels.settings import current
from mmserve.kernels.triton_attention import BLOCK_M as BLOCK_M_ATT
from mmserve.kernels.triton_attention import block_keys, split_keys, split_states
from mmserve.kernels.triton_fused import NORM_CHUNK, _round_mode
from mmserve.kernels.triton_grid import poll_asm
from mmserve.kernels.triton_pdl import pdl_args

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - CPU-only installs
    triton = None

BN = 16  # output columns per GEMM tile (weight streaming at M=1: many thin tiles)
# Speed only (the bits do not depend on them; the attention phase needs 4 warps to keep
# the layered kernel's row-sum order), unless a key says otherwise. Each setting was
# decided by the engine's batch-1 step (``benchmarks/step_ab.py``: graphs recaptured,
# variants alternated in rounds), not by the stack's replay alone, which is no guide at a
# few microseconds; settings do not add. Figures and the settings measured and left off:
# docs/performance.md. All bits equal the default's for every setting (GPU tests).
#
# "unroll": norm chunks loaded a round (None: ``norm_rounds``, the row in as few rounds of
#   at most NORM_ROUND_MAX chunks as it takes). "num_stages", "bk", "bk_gated": pipeline
#   stages and the K step of the plain and the gated products.
# "prefetch": the next layer into L2 during phase B. "att_prefetch": attention_rows'
#   PREFETCH mode; 1 (block ids a step ahead), since 2 (keys and values too) is slower here.
# "spread": a tile's key splits over programs of their own (off: each tile in one program).
# "gated_one_dot": gate and up rows as one 32-row weight tile (``fused_tile``'s ONE_DOT).
# "qkv_rope": the rope of q and k and the cache write in the QKV phase's epilogue
#   (``qkv_rope_tile``), so phase B only loads its queries and the cache (off: phase B
#   rotates its tile's queries into ``qrot``, writes the keys and values it reads, then
#   loads them back after its threads' barrier: two more dependent round trips). Phase B
#   must not keep rotated queries in registers (joined with tl.join/permute/reshape): that
#   tile layout takes another summation order in the QK product, so a step's tokens would
#   depend on the path.
# "early": the o and down phases ask for their residual, and the QKV phase for its cache
#   slots, before the product instead of after it (a round trip off the critical path).
# "bk_exact": K steps that divide K (``k_step``): K = 576 in steps of 64, not 256 (whose
#   last step would run 12 of its 16 k16 products on zeros).
# "defer": the normed phases' operand and sums of squares handed over by the phases that
#   write their rows (``fused_tile``'s DEFER: phase C for D, phase E for the next layer's
#   A, ``_stack_input_kernel`` for layer 0's), so their K loops are the plain loop and
#   their prologue a load of G subtree sums (off: each normed program norms from the row
#   itself; the same bits, by the fused norm's tree).
# "gemm_stages": the GEMM phases' K loops' pipeline depth (``tl.range``'s; None: the
#   kernel's "num_stages", which the attention loop keeps: deeper, it is slower).
# "att_stages": the attention phase's key loop's pipeline depth (None: the kernel's); 1
#   (unpipelined) halves its shared memory and removes its spills with 128-key blocks.
# "qkv_hoist": phase A's rows' positions and cache slots loaded once before the layer loop
#   (``qkv_rope_tile``'s PRE_ROWS), so the rope's cos/sin loads do not wait on the
#   positions' trip. "k_t": the keys loaded in the QK operand's orientation
#   (``triton_attention._kv_step``'s KT). "v_l1": the values asked into L1 before the
#   keys' load (``_kv_step``'s V_L1). "serial" for these two: on in the serial kernel only
#   (``_serial_only``); the spread kernel spills with them.
# "pdl": the stack launched by programmatic dependent launch, the input kernel letting it
#   launch at its own start, so the stack's prologue (the step's metadata, layer 0's
#   prefetch) overlaps it, then ``wait_only``.
# "poll": the grid barrier's wait (``triton_grid.poll_asm``'s (loads in flight, cycles
#   between them, acquire)): one relaxed load by thread 0 at a time instead of the acquire
#   loop, which empties the SM's L1 at every poll (sound here: every read of another
#   program's writes is ".cg"); not in the kernel compiled with the spread attention,
#   whose step it made slower.
# These are the fields of ``settings.StackTuning`` (``KernelConfig.stack``); "spread" is
# ``KernelConfig.spread``. The kernel's TWICE and NO_C (timing probes), ATT_HOIST,
# LATE_RSTD and SEGO / OFUSE / O_REGS (the o product by kv-head group) lost and are
# launched off.
NORM_ROUND_MAX = 16  # norm chunks a round at most (registers: each is a (16, 64) fp32 tile)
KV_ROWS = 64  # cache positions a program asks L2 for per round (the next layer's keys/values)
# Rows a step may have: one 16-row GEMM tile, so a step of up to 16 tokens (decodes of 16
# sequences, a verify block of 16, a short prompt chunk) costs the GEMM phases what one
# token does.
MAX_ROWS = 16
# The o product's output columns an item of the attention phase takes when phase C runs
# in it ("o_fuse"): SmolLM2-135M's 576 in 9 tiles, 27 items with its 3 kv heads
O_COLS = 64


if triton is not None:
    from mmserve.kernels.triton_attention import (
        attend_keys,
        load_queries,
        store_attention,
        tile_rows,
    )
    from mmserve.kernels.triton_fused import (
        _round,
        _silu,
        _tile_products,
        fused_tile,
        norm_partials,
        pair_sum,
        qkv_rope_tile,
        rstd_of,
        tree_fold,
        tree_push,
    )
    from mmserve.kernels.triton_grid import grid_sync, prefetch_l2, prefetch_share
    from mmserve.kernels.triton_pdl import launch_next, wait_only
    from mmserve.kernels.triton_rope_attention import attend_group, group_pre, rope_write_tile

    @triton.jit
    def _prefetch_layer(
        lw,
        wqkv_ptr,
        wo_ptr,
        wgu_ptr,
        wd_ptr,
        n1_ptr,
        n2_ptr,
        worker,
        workers,
        H: tl.constexpr,
        Q: tl.constexpr,
        QKV: tl.constexpr,
        INTER: tl.constexpr,
        LINE: tl.constexpr,
        LQKV: tl.constexpr,
        LO: tl.constexpr,
        LGU: tl.constexpr,
        LD: tl.constexpr,
        LN: tl.constexpr,
    ):
        """Layer ``lw``'s weights into L2, ``worker``'s share of their lines."""
        prefetch_share(n1_ptr + lw * H, H, worker, workers, LINE, LN)
        prefetch_share(n2_ptr + lw * H, H, worker, workers, LINE, LN)
        prefetch_share(wqkv_ptr + lw * QKV * H, QKV * H, worker, workers, LINE, LQKV)
        prefetch_share(wo_ptr + lw * H * Q, H * Q, worker, workers, LINE, LO)
        prefetch_share(wgu_ptr + lw * 2 * INTER * H, 2 * INTER * H, worker, workers, LINE, LGU)
        prefetch_share(wd_ptr + lw * H * INTER, H * INTER, worker, workers, LINE, LD)

    @triton.jit
    def _prefetch_kv(
        kc,
        vc,
        tables_ptr,
        ctx_ptr,
        B,
        worker,
        workers,
        stride_kb,
        stride_ks,
        stride_bt,
        ROW: tl.constexpr,
        PAGE: tl.constexpr,
        LINE: tl.constexpr,
        ROWS: tl.constexpr,
        LINES: tl.constexpr,
    ):
        """A layer's cached keys and values of the B sequences (every kv head: ``ROW``
        elements a position) into L2. Each sequence has ``workers // B`` workers of its
        own (with fewer workers than sequences, a worker takes every ``workers``-th), each
        taking every such run of ``ROWS`` positions: a worker's chain of dependent loads
        is one sequence's, not every sequence's."""
        c = tl.minimum(tl.arange(0, LINES) * LINE, ROW - 1)
        subs = tl.maximum(workers // B, 1)
        sub = worker // B
        if sub < subs:
            for b in range(worker % B, B, workers):
                n_ctx = tl.load(ctx_ptr + b)
                table = tables_ptr + b * stride_bt
                for base in range(sub * ROWS, n_ctx, subs * ROWS):
                    j = tl.minimum(base + tl.arange(0, ROWS), n_ctx - 1)
                    blk = tl.load(table + j // PAGE).to(tl.int64)
                    off = (blk * stride_kb + (j % PAGE) * stride_ks)[:, None] + c[None, :]
                    prefetch_l2(kc + off)
                    prefetch_l2(vc + off)

    @triton.jit
    def _attention_phase(
        pid,
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
        B,
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
        P_ATT: tl.constexpr,
        BM: tl.constexpr,
        BN: tl.constexpr,
        SPLIT: tl.constexpr,
        TK: tl.constexpr,
        ROUND: tl.constexpr,
        ATT_PREFETCH: tl.constexpr,
        SPREAD: tl.constexpr,
        ROPED: tl.constexpr,
        ATT_STAGES: tl.constexpr,
        V_L1: tl.constexpr,
        KT: tl.constexpr,
        HOIST: tl.constexpr,
        pre_qlen,
        pre_ctx,
        pre_qstart,
        pre_blk,
    ):
        """Phase B on programs 0 .. P_ATT - 1. Each (sequence, kv head, query tile) group
        gets ``P_ATT // groups`` programs, each taking a run of the tile's ``SPLIT``-key
        splits: rope and cache write of what the run reads, then each split's own online
        softmax, its state to ``part_ptr``; the last program to finish a run of the group's
        splits (``count_ptr``, per layer and group) merges them all in order. A group with
        one program or one split runs whole, in order. Either way ``attention_rows``'
        arithmetic. ``HOIST`` (``attend_group``'s ``PRE``): the program's first group's
        metadata and first block ids (``pre_*``, ``group_pre``'s, loaded before the layer
        loop) are used, not loaded; 2: and its first keys and values asked into L1."""
        groups, per = _att_split(B, att_tiles, HKV, P_ATT, SPREAD)
        if (HOIST > 0) & (per <= 1):  # each group whole in one program, the first from
            # ``pre_*`` (without HOIST the plain loop below: written as one loop, its compiled
            # code and spills are those measured, 48 B against 12 B in this form)
            if pid < groups:
                attend_group(
                    pid,
                    0,
                    1,
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
                    HQ,
                    HKV,
                    D,
                    PAGE,
                    BM,
                    BN,
                    SPLIT,
                    TK,
                    ROUND,
                    ATT_PREFETCH,
                    False,
                    ROPED,
                    ATT_STAGES,
                    V_L1,
                    KT,
                    HOIST,
                    pre_qlen,
                    pre_ctx,
                    pre_qstart,
                    pre_blk,
                )
            for g in range(pid + P_ATT, groups, P_ATT):  # then every P_ATT-th after it
                attend_group(
                    g,
                    0,
                    1,
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
                    HQ,
                    HKV,
                    D,
                    PAGE,
                    BM,
                    BN,
                    SPLIT,
                    TK,
                    ROUND,
                    ATT_PREFETCH,
                    False,
                    ROPED,
                    ATT_STAGES,
                    V_L1,
                    KT,
                )
        elif per <= 1:  # each group whole in one program
            for g in range(pid, groups, P_ATT):
                attend_group(
                    g,
                    0,
                    1,
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
                    HQ,
                    HKV,
                    D,
                    PAGE,
                    BM,
                    BN,
                    SPLIT,
                    TK,
                    ROUND,
                    ATT_PREFETCH,
                    False,
                    ROPED,
                    ATT_STAGES,
                    V_L1,
                    KT,
                )
        elif pid < groups * per:  # the group's splits spread over its programs
            attend_group(
                pid // per,
                pid % per,
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
                HQ,
                HKV,
                D,
                PAGE,
                BM,
                BN,
                SPLIT,
                TK,
                ROUND,
                ATT_PREFETCH,
                False,
                ROPED,
                ATT_STAGES,
                V_L1,
                KT,
                HOIST,
                pre_qlen,
                pre_ctx,
                pre_qstart,
                pre_blk,
            )

    @triton.jit
    def _attention_o_phase(
        pid,
        layer,
        lw,
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
        att_tiles,
        SPLITS,
        scale_log2,
        stride_kb,
        stride_ks,
        stride_kh,
        stride_bt,
        x_in,
        mid,
        wo,
        po_ptr,
        co_ptr,
        ysm,
        g_ptr,
        psm,
        M,
        G,
        HQ: tl.constexpr,
        HKV: tl.constexpr,
        D: tl.constexpr,
        H: tl.constexpr,
        PAGE: tl.constexpr,
        P_ATT: tl.constexpr,
        BM: tl.constexpr,
        BN: tl.constexpr,
        SPLIT: tl.constexpr,
        TK: tl.constexpr,
        ROUND: tl.constexpr,
        ATT_PREFETCH: tl.constexpr,
        ROPED: tl.constexpr,
        ATT_STAGES: tl.constexpr,
        V_L1: tl.constexpr,
        KT: tl.constexpr,
        SEGO: tl.constexpr,
        BNO: tl.constexpr,
        BKO: tl.constexpr,
        KS: tl.constexpr,
        DEFER: tl.constexpr,
        SUM_IN_D: tl.constexpr = False,
        REGS: tl.constexpr = False,
    ):
        """Phases B and C as one, for a step of one sequence whose queries fit one tile
        (the o product summed by kv-head group, ``SEGO`` = its K a group). Item (h, j) of
        ``HKV`` x ``H // BNO``: kv head h's attention (``attend_group``, whole in order;
        every item of h computes the same rows, the same bits), then that group's chain
        of the o product for output columns j (its ``SEGO`` attention columns times those
        o columns, from zero) to ``po_ptr``; the last of the HKV items of j to count
        (``co_ptr``, per layer and j) adds the groups' chains in head order
        (``_tile_products``' SEG arithmetic), rounds, adds the residual and stores ``mid``
        (DEFER: and phase D's operand and subtree sums), as phase C's ``fused_tile``.
        ``SUM_IN_D``: no item sums; phase D adds the chains itself (``_gate_up_from_chains``;
        the count is still kept, never waited on: tests read it). ``REGS`` (speed only):
        the chain's operand taken from the attention's registers (each query head's rows
        gathered, the attention's rounding), not read back from ``attn`` after a thread
        barrier (an L2 trip); the attention is ``attend_group``'s whole-tile path."""
        NT: tl.constexpr = H // BNO
        ITEMS: tl.constexpr = HKV * (H // BNO)
        Q: tl.constexpr = HQ * D
        rm = tl.arange(0, TK)
        row_ok = rm < M
        for it in range(pid, ITEMS, P_ATT):
            h = it // NT
            j = it % NT
            rn = j * BNO + tl.arange(0, BNO)
            w_rows = wo + rn.to(tl.int64)[:, None] * Q + h * SEGO
            if REGS:  # attend_group's whole tile (one sequence: seq 0, tile 0), inline
                GQ: tl.constexpr = HQ // HKV
                tl.static_assert(SEGO == GQ * D)
                row_ok_a, tok, head, qpos, lo, hi, qlen, qstart = tile_rows(
                    0, 0, h, qlen_ptr, ctx_ptr, qstart_ptr, GQ, BM, BN, 0
                )
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
                        0,
                        h,
                        lo,
                        hi,
                        HQ,
                        HKV,
                        D,
                        GQ,
                        BM,
                        TK,
                        ROUND,
                    )
                    tl.debug_barrier()
                q = load_queries(qrot, row_ok_a, tok, head, Q, D, D, ROPED)
                _, den, o = attend_keys(
                    q,
                    qpos,
                    tables_ptr,
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
                    ATT_STAGES,
                    V_L1,
                    KT,
                    0,
                    0,
                )
                store_attention(attn, den, o, row_ok_a, tok, head, Q, D, D)
                o = (o / tl.where(den == 0.0, 1.0, den)[:, None]).to(attn.dtype.element_ty)
                acc = tl.zeros([TK, BNO], dtype=tl.float32)
                d = tl.arange(0, D)
                # query head g's rows: row t * GQ + g of o is token t (the step's one
                # sequence starts at row 0: qstart 0), the chain's row t
                for g in tl.static_range(GQ):
                    src = tl.minimum(rm * GQ + g, BM - 1)
                    a = tl.gather(o, tl.broadcast_to(src[:, None], (TK, D)), 0)
                    w = tl.load(w_rows + g * D + d[None, :])
                    acc = tl.dot(a, tl.trans(w), acc)
            else:
                attend_group(
                    h,
                    0,
                    1,
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
                    HKV,
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
                    ATT_PREFETCH,
                    False,
                    ROPED,
                    ATT_STAGES,
                    V_L1,
                    KT,
                )
                tl.debug_barrier()  # the program's own attention rows, read back below
                a_rows = attn + rm.to(tl.int64)[:, None] * Q + h * SEGO
                acc, _ = _tile_products(
                    a_rows,
                    w_rows,
                    w_rows,
                    row_ok,
                    rn,
                    H,
                    SEGO,
                    wo,
                    0.0,
                    False,
                    False,
                    TK,
                    BNO,
                    BKO,
                    ".cg",
                    KS,
                )
            po = po_ptr + (lw * HKV * TK) * H
            tl.store(
                po + (h * TK + rm.to(tl.int64))[:, None] * H + rn[None, :],
                acc,
                mask=row_ok[:, None],
            )
            tl.debug_barrier()  # every thread's chain stored, then counted
            if SUM_IN_D:
                tl.atomic_add(co_ptr + layer * NT + j, 1, sem="relaxed", scope="gpu")
            else:
                done = tl.atomic_add(co_ptr + layer * NT + j, 1, sem="acq_rel", scope="gpu")
                if done == HKV - 1:  # the column tile's last group: the sum and the epilogue
                    for c in tl.static_range(BNO // 16):
                        cols = j * BNO + c * 16 + tl.arange(0, 16)
                        ok = row_ok[:, None] & (cols[None, :] < H)
                        gw = tl.load(g_ptr + cols)
                        r = tl.load(
                            x_in + rm.to(tl.int64)[:, None] * H + cols[None, :],
                            mask=ok,
                            other=0.0,
                            cache_modifier=".cg",
                        )
                        tot = tl.zeros([TK, 16], dtype=tl.float32)
                        for h2 in tl.static_range(HKV):
                            tot = tot + tl.load(
                                po + (h2 * TK + rm.to(tl.int64))[:, None] * H + cols[None, :],
                                mask=ok,
                                other=0.0,
                                cache_modifier=".cg",
                            )
                        out = (_round(tot, ROUND) + r.to(tl.float32)).to(mid.dtype.element_ty)
                        tl.store(mid + rm.to(tl.int64)[:, None] * H + cols[None, :], out, mask=ok)
                        if DEFER:
                            norm_partials(
                                out.to(tl.float32),
                                ysm,
                                gw,
                                psm,
                                rm,
                                cols,
                                row_ok,
                                ok,
                                j * (BNO // 16) + c,
                                G,
                                H,
                                0.0,
                            )

    @triton.jit
    def _gate_up_from_chains(
        t,
        po_ptr,
        x_in,
        mid,
        nw_ptr,
        w_ptr,
        act,
        M,
        eps,
        H: tl.constexpr,
        INTER: tl.constexpr,
        HKV: tl.constexpr,
        TK: tl.constexpr,
        BN: tl.constexpr,
        BK: tl.constexpr,
        KS: tl.constexpr,
        ROUND: tl.constexpr,
    ):
        """Phase D's tile ``t`` (``BN`` gate and as many up columns, one product) from the o
        product's kv-head chains at ``po_ptr`` (``_attention_o_phase`` with SUM_IN_D): each
        K step adds the step's columns of the chains in head order, rounds, adds the
        residual ``x_in`` (so ``mid``, which tile ``t`` stores for step ``t``), pushes the
        step's squares into the norm's pairwise tree (``row_sumsq``'s counter, chunks of
        BK) and multiplies by the norm weight, rounded: the operand phase C hands over, and
        after the loop 1 / rms on the accumulator (``partials_rstd``'s tree: the same
        bits), then silu(gate) * up as ``fused_tile``'s gated epilogue."""
        # the counter's eight levels hold up to 255 chunks; pair_sum takes up to 128
        # columns; tile t stores mid's chunk t, so every chunk needs a tile
        tl.static_assert((H + BK - 1) // BK < 256 and BK <= 128)
        tl.static_assert((INTER + BN - 1) // BN >= (H + BK - 1) // BK)
        rm = tl.arange(0, TK)
        row_ok = rm < M
        rm64 = rm.to(tl.int64)
        rk = tl.arange(0, BK)
        j = tl.arange(0, 2 * BN)
        rn_w = t * BN + j % BN  # the gate columns, then the same up columns
        w_rows = w_ptr + (rn_w + (j // BN) * INTER).to(tl.int64)[:, None] * H
        acc2 = tl.zeros([TK, 2 * BN], dtype=tl.float32)
        s0 = tl.zeros([TK], tl.float32)
        s1 = s0
        s2 = s0
        s3 = s0
        s4 = s0
        s5 = s0
        s6 = s0
        s7 = s0
        for k in tl.range(0, H, BK, num_stages=KS if KS > 0 else None):
            kk = k + rk
            ok = row_ok[:, None] & (kk[None, :] < H)
            r = tl.load(
                x_in + rm64[:, None] * H + kk[None, :], mask=ok, other=0.0, cache_modifier=".cg"
            )
            tot = tl.zeros([TK, BK], dtype=tl.float32)
            for h in tl.static_range(HKV):
                tot = tot + tl.load(
                    po_ptr + (h * TK + rm64)[:, None] * H + kk[None, :],
                    mask=ok,
                    other=0.0,
                    cache_modifier=".cg",
                )
            m = (_round(tot, ROUND) + r.to(tl.float32)).to(mid.dtype.element_ty)
            tl.store(mid + rm64[:, None] * H + kk[None, :], m, mask=ok & (k // BK == t))
            mf = m.to(tl.float32)
            s0, s1, s2, s3, s4, s5, s6, s7 = tree_push(
                pair_sum(mf * mf, BK), k // BK, s0, s1, s2, s3, s4, s5, s6, s7
            )
            g = tl.load(nw_ptr + kk, mask=kk < H, other=0.0).to(tl.float32)
            a = (mf * g[None, :]).to(mid.dtype.element_ty)
            w = tl.load(
                w_rows + kk[None, :], mask=(rn_w[:, None] < INTER) & (kk[None, :] < H), other=0.0
            )
            acc2 = tl.dot(a, tl.trans(w), acc2)
        n = (H + BK - 1) // BK  # subtrees pushed, folded as ``row_sumsq`` folds them
        rstd = rstd_of(tree_fold(n, s0, s1, s2, s3, s4, s5, s6, s7), H, eps)
        acc, acc_u = tl.split(tl.permute(tl.reshape(acc2, [TK, 2, BN]), (0, 2, 1)))
        acc = acc * rstd[:, None]
        acc_u = acc_u * rstd[:, None]
        gate = tl.where(row_ok[:, None], _round(acc, ROUND), 1.0)
        out = _round(_silu(gate), ROUND) * _round(acc_u, ROUND)
        cols = t * BN + tl.arange(0, BN)
        tl.store(
            act + rm64[:, None] * INTER + cols[None, :],
            out.to(act.dtype.element_ty),
            mask=row_ok[:, None] & (cols[None, :] < INTER),
        )

    @triton.jit
    def _att_split(B, att_tiles, HKV: tl.constexpr, P_ATT: tl.constexpr, SPREAD: tl.constexpr):
        """Phase B's (sequence, kv head, query tile) groups and the programs each gets."""
        groups = B * HKV * att_tiles
        per = P_ATT // groups  # programs a group
        if not SPREAD:
            per = 1
        return groups, per

    @triton.jit
    def _stamp(timing_ptr, idx, pid, TIMING: tl.constexpr, NS: tl.constexpr = False):
        """The program records its SM clock (cycles; ``NS``: the global timer, ns) at slot
        ``idx`` of its own row (``timing_ptr`` already offset to it; phase timing)."""
        if TIMING:
            if NS:
                t = tl.inline_asm_elementwise(
                    "mov.u64 $0, %globaltimer;",
                    "=l,r",
                    [pid],
                    dtype=tl.int64,
                    is_pure=False,
                    pack=1,
                )
            else:
                t = tl.inline_asm_elementwise(
                    "mov.u64 $0, %clock64;", "=l,r", [pid], dtype=tl.int64, is_pure=False, pack=1
                )
            tl.store(timing_ptr + idx, t)

    @triton.jit
    def _phase_done(
        counter_ptr, timing_ptr, phase, pid, P, TIMING: tl.constexpr, POLL: tl.constexpr
    ):
        """End phase number ``phase`` (0, 1, ...): the grid barrier after it (``POLL``:
        ``grid_sync``'s), the program's clock stamped before (its work done) and after
        (every program arrived) -> the next phase's number."""
        _stamp(timing_ptr, 2 * phase, pid, TIMING)
        grid_sync(counter_ptr, phase + 1, P, POLL)
        _stamp(timing_ptr, 2 * phase + 3, pid, TIMING)
        return phase + 1

    @triton.jit
    def _stack_input_kernel(
        x_ptr,
        ids_ptr,
        xs_ptr,
        y_ptr,
        ps_ptr,
        nw_ptr,
        zero_ptr,
        H,
        G,
        stride_x,
        n_zero,
        GP: tl.constexpr,
        IDS: tl.constexpr,
        ZB: tl.constexpr,
        TRIGGER: tl.constexpr,
    ):
        """Row ``program_id`` of the stack's input x: copied into the residual stream, and
        handed to layer 0's phase A as phase E hands a layer's output to the next
        (``norm_partials``' arithmetic): times the first input norm's weight, rounded, and
        its 16-column subtree sums of squares. ``IDS``: x is row ``ids[row]`` of the
        embedding table at ``x_ptr`` (the gather folded in: one launch fewer a step).
        Program 0 also zeroes the ``n_zero`` int32 counters at ``zero_ptr`` (the grid
        barrier's and phase B's; a memset launch fewer). ``TRIGGER``: the stack (launched
        with PDL) may launch at once: its programs' start and their loads of the step's
        metadata overlap this kernel, and they wait for it before reading what it writes.
        (This kernel itself is launched plainly: it reads the last kernel's token ids.)"""
        launch_next(TRIGGER)
        row = tl.program_id(0).to(tl.int64)
        if row == 0:
            for z in range(0, n_zero, ZB):
                zi = z + tl.arange(0, ZB)
                tl.store(zero_ptr + zi, tl.zeros([ZB], tl.int32), mask=zi < n_zero)
        src = tl.load(ids_ptr + row).to(tl.int64) if IDS else row
        col = tl.arange(0, GP)[:, None] * 16 + tl.arange(0, 16)[None, :]
        ok = col < H
        x = tl.load(x_ptr + src * stride_x + col, mask=ok, other=0.0)
        tl.store(xs_ptr + row * H + col, x, mask=ok)
        xf = x.to(tl.float32)
        g = tl.load(nw_ptr + col, mask=ok, other=0.0).to(tl.float32)
        tl.store(y_ptr + row * H + col, (xf * g).to(y_ptr.dtype.element_ty), mask=ok)
        gi = tl.arange(0, GP)
        tl.store(ps_ptr + row * G + gi, pair_sum(xf * xf, 16), mask=gi < G)

    # one compiled kernel for every step shape: Triton would otherwise compile a variant
    # for each of these equal to 1 or divisible by 16
    @triton.jit(do_not_specialize=["L", "M", "B", "att_tiles", "SPLITS"])
    def _decode_stack_kernel(
        xs_ptr,
        mids_ptr,
        qkv_ptr,
        qrot_ptr,
        attn_ptr,
        act_ptr,
        wqkv_ptr,
        wo_ptr,
        wgu_ptr,
        wd_ptr,
        n1_ptr,
        n2_ptr,
        kv_ptr,
        cos_ptr,
        sin_ptr,
        pos_ptr,
        slot_ptr,
        tables_ptr,
        ctx_ptr,
        qstart_ptr,
        qlen_ptr,
        counter_ptr,
        timing_ptr,
        part_ptr,
        count_ptr,
        ysi_ptr,
        ysm_ptr,
        psi_ptr,
        psm_ptr,
        po_ptr,
        co_ptr,
        L,
        M,
        B,
        att_tiles,
        SPLITS,
        eps,
        scale_log2,
        stride_kvl,
        stride_kv2,
        stride_kb,
        stride_ks,
        stride_kh,
        stride_bt,
        H: tl.constexpr,
        HQ: tl.constexpr,
        HKV: tl.constexpr,
        D: tl.constexpr,
        INTER: tl.constexpr,
        PAGE: tl.constexpr,
        P: tl.constexpr,
        BN: tl.constexpr,
        BK: tl.constexpr,
        BKG: tl.constexpr,
        CH: tl.constexpr,
        UNROLL: tl.constexpr,
        ROUND: tl.constexpr,
        TK: tl.constexpr,
        ATT_BM: tl.constexpr,
        ATT_BN: tl.constexpr,
        SPLIT: tl.constexpr,
        TIMING: tl.constexpr,
        WORKERS: tl.constexpr,
        LINE: tl.constexpr,
        LQKV: tl.constexpr,
        LO: tl.constexpr,
        LGU: tl.constexpr,
        LD: tl.constexpr,
        LN: tl.constexpr,
        KV_ROWS: tl.constexpr,
        KV_LINES: tl.constexpr,
        ATT_PREFETCH: tl.constexpr,
        SPREAD: tl.constexpr,
        ONE_DOT: tl.constexpr,
        QKV_ROPE: tl.constexpr,
        EARLY: tl.constexpr,
        BKH: tl.constexpr,
        BKQ: tl.constexpr,
        TWICE: tl.constexpr,
        DEFER: tl.constexpr,
        G: tl.constexpr,
        GP: tl.constexpr,
        KS: tl.constexpr,
        ATT_STAGES: tl.constexpr,
        V_L1: tl.constexpr,
        KT: tl.constexpr,
        ATT_HOIST: tl.constexpr,
        LATE_RSTD: tl.constexpr,
        QKV_HOIST: tl.constexpr,
        PDL: tl.constexpr,
        POLL: tl.constexpr,
        NO_C: tl.constexpr = 0,
        SEGO: tl.constexpr = 0,
        OFUSE: tl.constexpr = 0,
        BNO: tl.constexpr = 64,
        BKO: tl.constexpr = 64,
        BKC: tl.constexpr = 64,
        O_REGS: tl.constexpr = False,
    ):
        pid = tl.program_id(0)
        if TIMING:  # each program its own row of 4 + 10 L stamps
            timing_ptr += pid * (4 + 10 * L)
        _stamp(timing_ptr, 1, pid, TIMING)
        _stamp(timing_ptr, 2 + 10 * L, pid, TIMING, True)
        Q: tl.constexpr = HQ * D
        QKV: tl.constexpr = (HQ + 2 * HKV) * D
        phase = 0
        # weights and cache stream from HBM: the last WORKERS programs (never given phase
        # B's work) ask L2 for the next layer's while the attention phase runs (issued at a
        # layer's start by every program instead, the asking cost the QKV phase 0.7 us)
        worker = pid - (P - WORKERS)
        # ATT_HOIST: what phase B's first group loads before its keys is the same every
        # layer (the step's metadata and block tables), so it is loaded once, here
        groups, per = _att_split(B, att_tiles, HKV, P - WORKERS, SPREAD)
        per1 = tl.maximum(per, 1)
        pre_qlen, pre_ctx, pre_qstart, pre_blk = group_pre(
            tl.minimum(pid // per1, groups - 1),
            pid % per1,
            per1,
            tables_ptr,
            ctx_ptr,
            qstart_ptr,
            qlen_ptr,
            att_tiles,
            stride_bt,
            HQ,
            HKV,
            PAGE,
            ATT_BM,
            ATT_BN,
            SPLIT,
        )
        # QKV_HOIST: phase A's rows (the step's first TK) have the same positions and cache
        # slots every layer
        rows = tl.arange(0, TK)
        pre_pos = tl.load(pos_ptr + rows, mask=rows < M, other=0)
        pre_slot = tl.load(slot_ptr + rows, mask=rows < M, other=-1)
        if WORKERS > 0:
            if worker >= 0:
                _prefetch_layer(
                    tl.cast(0, tl.int64),
                    wqkv_ptr,
                    wo_ptr,
                    wgu_ptr,
                    wd_ptr,
                    n1_ptr,
                    n2_ptr,
                    worker,
                    WORKERS,
                    H,
                    Q,
                    QKV,
                    INTER,
                    LINE,
                    LQKV,
                    LO,
                    LGU,
                    LD,
                    LN,
                )
        # PDL: launched while the input kernel runs; what is read above (the step's
        # metadata, the weights) was written before it, what is read below (the inputs,
        # the zeroed counters) by it
        wait_only(PDL)
        for layer in range(L):
            lw = tl.cast(layer, tl.int64)
            x_in = xs_ptr + lw * M * H  # (M, H) rows of each buffer, one buffer a layer
            mid = mids_ptr + lw * M * H
            qkv = qkv_ptr + lw * M * QKV
            qrot = qrot_ptr + lw * M * Q
            attn = attn_ptr + lw * M * Q
            act = act_ptr + lw * M * INTER
            kc = kv_ptr + lw * stride_kvl
            vc = kc + stride_kv2
            # A: qkv = rms_norm(x) @ Wqkv.T; QKV_ROPE: and in the epilogue, the rope of q
            # (into qrot) and of k, and k and v written to the cache
            # (DEFER: from the rows and subtree sums the previous phase E, or the input
            # kernel, handed over; else the norm from the rows themselves: the same bits)
            a_qkv = ysi_ptr + lw * M * H if DEFER else x_in
            for t in range(pid, (QKV + BN - 1) // BN, P):
                if QKV_ROPE:
                    qkv_rope_tile(
                        t,
                        a_qkv,
                        wqkv_ptr + lw * QKV * H,
                        x_in,
                        n1_ptr + lw * H,
                        qrot,
                        kc,
                        vc,
                        cos_ptr,
                        sin_ptr,
                        pos_ptr,
                        slot_ptr,
                        M,
                        H,
                        H,
                        H,
                        eps,
                        0.0,
                        HQ,
                        HKV,
                        D,
                        not DEFER,
                        False,
                        ROUND,
                        16,
                        BN,
                        BKH,
                        8,
                        CH,
                        UNROLL,
                        ".cg",
                        EARLY,
                        TWICE,
                        DEFER,
                        psi_ptr + lw * M * G,
                        G,
                        GP,
                        KS,
                        LATE_RSTD,
                        QKV_HOIST,
                        pre_pos,
                        pre_slot,
                    )
                else:
                    fused_tile(
                        t,
                        a_qkv,
                        wqkv_ptr + lw * QKV * H,
                        qkv,
                        qkv,
                        qkv,
                        n1_ptr + lw * H,
                        M,
                        QKV,
                        H,
                        QKV,
                        H,
                        H,
                        QKV,
                        QKV,
                        eps,
                        0.0,
                        not DEFER,
                        False,
                        False,
                        False,
                        ROUND,
                        16,
                        BN,
                        BKH,
                        8,
                        CH,
                        UNROLL,
                        ".cg",
                        False,
                        False,
                        TWICE,
                        DEFER,
                        qkv,
                        qkv,
                        psi_ptr + lw * M * G,
                        G,
                        GP,
                        KS,
                    )
            phase = _phase_done(counter_ptr, timing_ptr, phase, pid, P, TIMING, POLL)
            # B: per (sequence, kv head, query tile): attention over the cache, a long
            # context's splits spread over the group's programs; without QKV_ROPE first the
            # rope of the tile's queries and the rope + cache write of the keys and values
            # it reads (the write and the read then need only a barrier of the program's
            # own threads)
            # OFUSE: a step of one sequence in one query tile runs phase C in phase B
            # (``_attention_o_phase``: one barrier fewer a layer)
            if OFUSE:
                ofuse = B * att_tiles == 1
            else:
                ofuse = False
            if pid < P - WORKERS:
                if ofuse:
                    _attention_o_phase(
                        pid,
                        layer,
                        lw,
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
                        att_tiles,
                        SPLITS,
                        scale_log2,
                        stride_kb,
                        stride_ks,
                        stride_kh,
                        stride_bt,
                        x_in,
                        mid,
                        wo_ptr + lw * H * Q,
                        po_ptr,
                        co_ptr,
                        ysm_ptr + lw * M * H,
                        n2_ptr + lw * H,
                        psm_ptr + lw * M * G,
                        M,
                        G,
                        HQ,
                        HKV,
                        D,
                        H,
                        PAGE,
                        P - WORKERS,
                        ATT_BM,
                        ATT_BN,
                        SPLIT,
                        TK,
                        ROUND,
                        ATT_PREFETCH,
                        QKV_ROPE,
                        ATT_STAGES,
                        V_L1,
                        KT,
                        SEGO,
                        BNO,
                        BKO,
                        KS,
                        DEFER,
                        OFUSE == 2,
                        O_REGS,
                    )
                else:
                    _attention_phase(
                        pid,
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
                        B,
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
                        P - WORKERS,
                        ATT_BM,
                        ATT_BN,
                        SPLIT,
                        TK,
                        ROUND,
                        ATT_PREFETCH,
                        SPREAD,
                        QKV_ROPE,
                        ATT_STAGES,
                        V_L1,
                        KT,
                        ATT_HOIST,
                        pre_qlen,
                        pre_ctx,
                        pre_qstart,
                        pre_blk,
                    )
            if WORKERS > 0:
                if worker >= 0:
                    if layer + 1 < L:
                        _prefetch_layer(
                            lw + 1,
                            wqkv_ptr,
                            wo_ptr,
                            wgu_ptr,
                            wd_ptr,
                            n1_ptr,
                            n2_ptr,
                            worker,
                            WORKERS,
                            H,
                            Q,
                            QKV,
                            INTER,
                            LINE,
                            LQKV,
                            LO,
                            LGU,
                            LD,
                            LN,
                        )
                        _prefetch_kv(
                            kc + stride_kvl,
                            vc + stride_kvl,
                            tables_ptr,
                            ctx_ptr,
                            B,
                            worker,
                            WORKERS,
                            stride_kb,
                            stride_ks,
                            stride_bt,
                            HKV * D,
                            PAGE,
                            LINE,
                            KV_ROWS,
                            KV_LINES,
                        )
            phase = _phase_done(counter_ptr, timing_ptr, phase, pid, P, TIMING, POLL)
            # C: mid = x + attn @ Wo.T (DEFER: and phase D's operand and subtree sums)
            # (NO_C, a timing probe with wrong bits: phase C and its barrier skipped)
            # (SEGO: the product's K summed by kv-head group, ``_tile_products``' SEG)
            if (NO_C == 0) and not ofuse:
                for t in range(pid, (H + BN - 1) // BN, P):
                    fused_tile(
                        t,
                        attn,
                        wo_ptr + lw * H * Q,
                        mid,
                        mid,
                        x_in,
                        mid,
                        M,
                        H,
                        Q,
                        H,
                        Q,
                        Q,
                        H,
                        H,
                        eps,
                        0.0,
                        False,
                        False,
                        True,
                        False,
                        ROUND,
                        16,
                        BN,
                        BKQ,
                        8,
                        CH,
                        UNROLL,
                        ".cg",
                        False,
                        EARLY,
                        TWICE,
                        2 * DEFER,
                        ysm_ptr + lw * M * H,
                        n2_ptr + lw * H,
                        psm_ptr + lw * M * G,
                        G,
                        GP,
                        KS,
                        SEG=SEGO,
                    )
                phase = _phase_done(counter_ptr, timing_ptr, phase, pid, P, TIMING, POLL)
            # D: act = silu(gate) * up of rms_norm(mid) @ Wgu.T (NO_C 2: the norm from
            # the row itself, as a phase D summing the o product's partials would)
            # (OFUSE 2 at a fused step: the o product's chains added here, phase C's sum)
            D_DEFER: tl.constexpr = DEFER and NO_C < 2
            a_gu = ysm_ptr + lw * M * H if D_DEFER else mid
            if OFUSE == 2:
                chains = ofuse
            else:
                chains = False
            if chains:
                for t in range(pid, (INTER + BN - 1) // BN, P):
                    _gate_up_from_chains(
                        t,
                        po_ptr + (lw * HKV * TK) * H,
                        x_in,
                        mid,
                        n2_ptr + lw * H,
                        wgu_ptr + lw * 2 * INTER * H,
                        act,
                        M,
                        eps,
                        H,
                        INTER,
                        HKV,
                        TK,
                        BN,
                        BKC,
                        KS,
                        ROUND,
                    )
            else:
                for t in range(pid, (INTER + BN - 1) // BN, P):
                    fused_tile(
                        t,
                        a_gu,
                        wgu_ptr + lw * 2 * INTER * H,
                        act,
                        act,
                        act,
                        n2_ptr + lw * H,
                        M,
                        INTER,
                        H,
                        INTER,
                        H,
                        H,
                        INTER,
                        INTER,
                        eps,
                        0.0,
                        not D_DEFER,
                        False,
                        False,
                        True,
                        ROUND,
                        16,
                        BN,
                        BKG,
                        8,
                        CH,
                        UNROLL,
                        ".cg",
                        ONE_DOT,
                        False,
                        TWICE,
                        D_DEFER,
                        act,
                        act,
                        psm_ptr + lw * M * G,
                        G,
                        GP,
                        KS,
                        LATE_RSTD,
                    )
            phase = _phase_done(counter_ptr, timing_ptr, phase, pid, P, TIMING, POLL)
            # E: x_next = mid + act @ Wd.T (DEFER: and the next phase A's operand and subtree
            # sums; after the last layer unread, made with its own norm weight)
            for t in range(pid, (H + BN - 1) // BN, P):
                fused_tile(
                    t,
                    act,
                    wd_ptr + lw * H * INTER,
                    x_in + M * H,
                    x_in,
                    mid,
                    x_in,
                    M,
                    H,
                    INTER,
                    H,
                    INTER,
                    INTER,
                    H,
                    H,
                    eps,
                    0.0,
                    False,
                    False,
                    True,
                    False,
                    ROUND,
                    16,
                    BN,
                    BK,
                    8,
                    CH,
                    UNROLL,
                    ".cg",
                    False,
                    EARLY,
                    TWICE,
                    2 * DEFER,
                    ysi_ptr + (lw + 1) * M * H,
                    n1_ptr + tl.minimum(lw + 1, L - 1) * H,
                    psi_ptr + (lw + 1) * M * G,
                    G,
                    GP,
                    KS,
                )
            phase = _phase_done(counter_ptr, timing_ptr, phase, pid, P, TIMING, POLL)
        _stamp(timing_ptr, 3 + 10 * L, pid, TIMING, True)


def _serial_only(value) -> bool:
    """A switch of ``StackTuning`` that may also be "serial": on in the kernel compiled
    without the spread attention path only."""
    return bool(value) and (value != "serial" or not current().spread)


def _poll(x: torch.Tensor, spread: bool) -> str:
    """The grid barrier's wait (``StackTuning.poll``: (loads in flight, cycles between them,
    acquire loads[, cycles before a load is issued again]), ``triton_grid.poll_asm``; not
    in the kernel compiled with the spread attention path (``spread``); "": acquire loads
    one at a time, the only form the interpreter runs)."""
    poll = current().stack.poll
    if not poll or spread or not x.is_cuda or os.environ.get("TRITON_INTERPRET") == "1":
        return ""
    polls, spacing, acquire, *gap = poll
    return poll_asm(int(polls), int(spacing), bool(acquire), int(gap[0]) if gap else 0)


def norm_rounds(hidden: int) -> int:
    """Norm chunks a program loads a round (``StackTuning.unroll``, or the fewest rounds of
    at most ``NORM_ROUND_MAX`` chunks, split evenly)."""
    unroll = current().stack.unroll
    if unroll is not None:
        return int(unroll)
    chunks = -(-hidden // NORM_CHUNK)
    rounds = -(-chunks // NORM_ROUND_MAX)
    return -(-chunks // rounds)


def k_step(k: int, bk: int) -> int:
    """A product's K step: ``bk``, or with ``StackTuning.bk_exact`` the widest power of two
    up to ``bk`` that divides ``k`` (no masked tail: K = 576 in steps of 256 runs 48 k16
    products, 12 of them on zeros; in steps of 64, 36)."""
    if not current().stack.bk_exact:
        return bk
    step = bk
    while step > 16 and k % step:
        step //= 2
    return step


def attention_items(rows: int, kv_heads: int, group: int) -> int:
    """Most (sequence, kv head, query tile) items phase B can have in a step of ``rows``
    query rows (each tile holds at least one token of its sequence)."""
    return rows * kv_heads * -(-group // BLOCK_M_ATT)


def widest_phase(hidden: int, qkv: int, inter: int, kv_heads: int) -> int:
    """The most tiles any GEMM phase of a layer has (phase B's items are spread over
    whatever grid this gives)."""
    return max(-(-qkv // BN), -(-hidden // BN), -(-inter // BN), kv_heads)


def stack_programs(hidden: int, qkv: int, inter: int, kv_heads: int, sms: int) -> int:
    """Grid size: enough programs for the widest phase, at most one per SM."""
    return max(1, min(sms, widest_phase(hidden, qkv, inter, kv_heads)))


def default_programs(weights: dict[str, torch.Tensor], kv_heads: int, device: torch.device) -> int:
    """The stack's grid for stacked ``weights`` on ``device`` (``stack_programs``)."""
    _, qkv_n, hidden = weights["qkv"].shape
    sms = (
        torch.cuda.get_device_properties(device).multi_processor_count
        if device.type == "cuda"
        else 1
    )
    return stack_programs(hidden, qkv_n, weights["down"].shape[-1], kv_heads, sms)


def decode_stack(
    x: torch.Tensor,
    weights: dict[str, torch.Tensor],
    kv: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    positions: torch.Tensor,
    slot_mapping: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    query_start: torch.Tensor,
    query_lens: torch.Tensor,
    max_query_len: int,
    *,
    heads: int,
    kv_heads: int,
    eps: float,
    scale: float,
    programs: int | None = None,
    timing: torch.Tensor | None = None,
    scratch: dict[str, torch.Tensor] | None = None,
    ids: torch.Tensor | None = None,
) -> torch.Tensor:
    """Every layer for a step of at most ``MAX_ROWS`` tokens: x (N, H) -> the residual
    stream after the last layer (N, H). ``ids``: the step's (N,) token ids, and x the
    embedding table (V, H) whose rows ``x[ids]`` are the input (gathered by the stack's
    input kernel: no launch of its own).

    ``weights``: ``qkv`` (L, (Hq + 2 Hkv) D, H), ``o`` (L, H, Hq D), ``gate_up``
    (L, 2 I, H), ``down`` (L, H, I), ``input_norm``/``post_norm`` (L, H), contiguous.
    ``kv``: the whole cache (L, 2, blocks, block_size, Hkv, D), contiguous, x's dtype.
    The metadata are the paged-attention tensors of the step (``PagedMetadata``'s: any
    number of sequences, each with its rows, e.g. decodes, verify blocks or a short
    prompt chunk; padding rows and sequences as the CUDA graphs lay them out), and
    ``max_query_len`` the most rows a sequence has.
    ``programs``: the grid (tests; default one per SM up to the widest phase).
    ``timing``: int64 (programs, 4 + 10 L): each program's clock at the start (slot 1),
    after phase i's work (slot 2 i) and after the barrier after it (slot 2 i + 3), in its
    SM's cycles (SMs' clocks run at one rate but from different origins), and the global
    timer (ns) at its start and end (the last two slots); for benchmarks.
    ``scratch``: a dict that receives every layer's intermediates (``xs`` (L + 1, N, H):
    the residual stream before each layer and after the last; ``qkv``, ``attn``, ``mids``
    (after the attention's residual), ``act`` (silu * up); where phase C runs in phase B,
    ``o_counts`` (L, H / O_COLS): the attention items each o column tile counted); for
    debugging tools and tests.
    """
    n_layers, _, hidden = weights["qkv"].shape
    d = kv.shape[-1]
    inter = weights["down"].shape[-1]
    qkv_n = (heads + 2 * kv_heads) * d
    n = x.shape[0] if ids is None else ids.shape[0]
    assert 0 < n <= MAX_ROWS and x.shape[1] == hidden and max_query_len <= n
    assert ids is None or (ids.dim() == 1 and ids.is_contiguous())
    assert x.stride(1) == 1
    assert kv.is_contiguous() and kv.dtype == x.dtype
    assert all(w.is_contiguous() for w in weights.values())
    dev, dt = x.device, x.dtype
    tuning, spread = current().stack, current().spread
    xs = torch.empty(n_layers + 1, n, hidden, dtype=dt, device=dev)
    # the norm handed over between phases (StackTuning.defer): 16-column subtrees
    defer = tuning.defer and hidden % BN == 0
    groups_h = hidden // BN
    if defer:  # per layer: phase A's and D's operands and their rows' subtree sums
        ysi = torch.empty(n_layers + 1, n, hidden, dtype=dt, device=dev)
        ysm = torch.empty(n_layers, n, hidden, dtype=dt, device=dev)
        psi = torch.empty(n_layers + 1, n, groups_h, dtype=torch.float32, device=dev)
        psm = torch.empty(n_layers, n, groups_h, dtype=torch.float32, device=dev)
    else:
        xs[0].copy_(x if ids is None else x[ids])
        ysi = ysm = psi = psm = xs  # never read
    mids = torch.empty(n_layers, n, hidden, dtype=dt, device=dev)
    # rope in phase A's epilogue (qkv_rope; a q or k tile holds pairs of a head's dims,
    # so the tile's columns divide the head)
    roped = tuning.qkv_rope and d % BN == 0
    qrot = torch.empty(n_layers, n, heads * d, dtype=dt, device=dev)  # the rotated queries
    # the plain product's output: only without qkv_rope (else never touched)
    qkv = qrot if roped else torch.empty(n_layers, n, qkv_n, dtype=dt, device=dev)
    attn = torch.empty(n_layers, n, heads * d, dtype=dt, device=dev)
    act = torch.empty(n_layers, n, inter, dtype=dt, device=dev)
    if scratch is not None:
        scratch.update(xs=xs, attn=attn, mids=mids, act=act)
        scratch["qrot" if roped else "qkv"] = qrot if roped else qkv
    if programs is None:
        programs = default_programs(weights, kv_heads, dev)
    group = heads // kv_heads
    # the prefetching programs: those past every step's phase-B items (one compiled
    # kernel for every step shape)
    workers = programs - attention_items(MAX_ROWS, kv_heads, group)
    workers = workers if tuning.prefetch and workers > 0 else 0
    att_tiles = -(-max_query_len * group // BLOCK_M_ATT)
    groups = context_lens.shape[0] * kv_heads * att_tiles
    # phase B spreads a group's splits over its programs when it has more than one: their
    # states meet in ``part``, the last to arrive (a count per layer and group) merges
    shared = spread and (programs - workers) // groups > 1
    splits, part = split_states(groups if shared else 0, block_tables, kv.shape[3], d, dev)
    # the stack launched by PDL (StackTuning.pdl): while the input kernel runs
    pdl = pdl_args(x) if tuning.pdl else {"PDL": False, "launch_pdl": False}
    # the o product in one chain (no kv-head groups: ``SEGO`` 0), phase C on its own
    sego = ofuse = o_tiles = 0
    o_step = k_step(heads * d, tuning.bk)  # the o product's K step
    po = xs  # never read
    # zeroed by the input kernel (with "defer"; else here)
    counts = (torch.empty if defer else torch.zeros)(
        1 + n_layers * groups + n_layers * o_tiles, dtype=torch.int32, device=dev
    )
    counter = counts[:1]  # the grid barrier's
    if scratch is not None and ofuse:  # after the launch: the items each o tile counted
        scratch["o_counts"] = counts[1 + n_layers * groups :].view(n_layers, o_tiles)
    if defer:
        _stack_input_kernel[(n,)](
            x,
            ids if ids is not None else counts,
            xs,
            ysi,
            psi,
            weights["input_norm"],
            counts,
            hidden,
            groups_h,
            x.stride(0),
            counts.numel(),
            GP=triton.next_power_of_2(groups_h),
            IDS=ids is not None,
            ZB=256,
            TRIGGER=pdl["PDL"],
        )
    line = 128 // x.element_size()  # elements a 128-byte L2 line holds

    def lines(numel: int) -> int:  # a prefetching program's share of a matrix's lines
        return triton.next_power_of_2(triton.cdiv(triton.cdiv(numel, line), max(1, workers)))

    _decode_stack_kernel[(programs,)](
        xs,
        mids,
        qkv,
        qrot,
        attn,
        act,
        weights["qkv"],
        weights["o"],
        weights["gate_up"],
        weights["down"],
        weights["input_norm"],
        weights["post_norm"],
        kv,
        cos,
        sin,
        positions,
        slot_mapping,
        block_tables,
        context_lens,
        query_start,
        query_lens,
        counter,
        timing if timing is not None else counter,
        part,
        counts[1:],
        ysi,
        ysm,
        psi,
        psm,
        po,
        counts[1 + n_layers * groups :],
        n_layers,
        n,
        context_lens.shape[0],
        att_tiles,
        splits,
        eps,
        scale * 1.4426950408889634,
        kv.stride(0),
        kv.stride(1),
        kv.stride(2),
        kv.stride(3),
        kv.stride(4),
        block_tables.stride(0),
        H=hidden,
        HQ=heads,
        HKV=kv_heads,
        D=d,
        INTER=inter,
        PAGE=kv.shape[3],
        P=programs,
        BN=BN,
        BK=k_step(inter, tuning.bk),
        BKG=k_step(hidden, tuning.bk_gated),
        CH=NORM_CHUNK,
        UNROLL=norm_rounds(hidden),
        ROUND=_round_mode(dt),
        TK=MAX_ROWS,
        ATT_BM=BLOCK_M_ATT,
        ATT_BN=block_keys(d),
        SPLIT=split_keys(d),
        TIMING=timing is not None,
        WORKERS=workers,
        LINE=line,
        LQKV=lines(qkv_n * hidden),
        LO=lines(hidden * heads * d),
        LGU=lines(2 * inter * hidden),
        LD=lines(hidden * inter),
        LN=lines(hidden),
        KV_ROWS=KV_ROWS,
        KV_LINES=triton.next_power_of_2(triton.cdiv(kv_heads * d, line)),
        ATT_PREFETCH=tuning.att_prefetch,
        SPREAD=spread,
        ONE_DOT=tuning.gated_one_dot,
        QKV_ROPE=roped,
        EARLY=tuning.early,
        BKH=k_step(hidden, tuning.bk),
        BKQ=o_step,
        TWICE=0,
        DEFER=defer,
        G=groups_h,
        GP=triton.next_power_of_2(max(groups_h, 2)),
        KS=tuning.gemm_stages or 0,
        ATT_STAGES=tuning.att_stages or 0,
        V_L1=_serial_only(tuning.v_l1),
        KT=_serial_only(tuning.k_t),
        ATT_HOIST=0,
        LATE_RSTD=False,
        QKV_HOIST=tuning.qkv_hoist,
        POLL=_poll(x, spread),
        NO_C=0,
        SEGO=sego,
        OFUSE=ofuse,
        BNO=O_COLS,
        BKO=o_step,
        BKC=min(k_step(hidden, tuning.bk_gated), 128),
        O_REGS=False,
        num_warps=4,
        **pdl,
        num_stages=tuning.num_stages,
    )
    return xs[n_layers]
