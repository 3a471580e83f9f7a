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
# ``KernelConfig.spread``.
NORM_ROUND_MAX = 16  # norm chunks a round at most (registers: each is a (16, 64) fp32 tile)
KV_ROWS = 64  # cache positions a program asks L2 for per round (the next layer's keys/values)
# Rows a step may have: one 16-row GEMM tile, so a step of up to 16 tokens (decodes of 16
# sequences, a verify block of 16, a short prompt chunk) costs the GEMM phases what one
# token does.
MAX_ROWS = 16


if triton is not None:
    from mmserve.kernels.triton_fused import fused_tile, pair_sum, qkv_rope_tile
    from mmserve.kernels.triton_grid import grid_sync, prefetch_l2, prefetch_share
    from mmserve.kernels.triton_pdl import launch_next, wait_only
    from mmserve.kernels.triton_rope_attention import attend_group

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
    ):
        """Phase B on programs 0 .. P_ATT - 1. Each (sequence, kv head, query tile) group
        gets ``P_ATT // groups`` programs, each taking a run of the tile's ``SPLIT``-key
        splits: rope and cache write of what the run reads, then each split's own online
        softmax, its state to ``part_ptr``; the last program to finish a run of the group's
        splits (``count_ptr``, per layer and group) merges them all in order. A group with
        one program or one split runs whole, in order. Either way ``attention_rows``'
        arithmetic."""
        groups, per = _att_split(B, att_tiles, HKV, P_ATT, SPREAD)
        if per <= 1:  # each group whole in one program
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
        DEFER: tl.constexpr,
        G: tl.constexpr,
        GP: tl.constexpr,
        KS: tl.constexpr,
        ATT_STAGES: tl.constexpr,
        V_L1: tl.constexpr,
        KT: tl.constexpr,
        QKV_HOIST: tl.constexpr,
        PDL: tl.constexpr,
        POLL: tl.constexpr,
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
                        DEFER,
                        psi_ptr + lw * M * G,
                        G,
                        GP,
                        KS,
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
            if pid < P - WORKERS:
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
                    2 * DEFER,
                    ysm_ptr + lw * M * H,
                    n2_ptr + lw * H,
                    psm_ptr + lw * M * G,
                    G,
                    GP,
                    KS,
                )
            phase = _phase_done(counter_ptr, timing_ptr, phase, pid, P, TIMING, POLL)
            # D: act = silu(gate) * up of rms_norm(mid) @ Wgu.T (DEFER: from the operand and
            # subtree sums phase C handed over)
            a_gu = ysm_ptr + lw * M * H if DEFER else mid
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
                    not DEFER,
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
                    DEFER,
                    act,
                    act,
                    psm_ptr + lw * M * G,
                    G,
                    GP,
                    KS,
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
    (after the attention's residual), ``act`` (silu * up)); for debugging tools and tests.
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
    # zeroed by the input kernel (with "defer"; else here)
    counts = (torch.empty if defer else torch.zeros)(
        1 + n_layers * groups, dtype=torch.int32, device=dev
    )
    counter = counts[:1]  # the grid barrier's
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
        BKQ=k_step(heads * d, tuning.bk),
        DEFER=defer,
        G=groups_h,
        GP=triton.next_power_of_2(max(groups_h, 2)),
        KS=tuning.gemm_stages or 0,
        ATT_STAGES=tuning.att_stages or 0,
        V_L1=_serial_only(tuning.v_l1),
        KT=_serial_only(tuning.k_t),
        QKV_HOIST=tuning.qkv_hoist,
        POLL=_poll(x, spread),
        num_warps=4,
        **pdl,
        num_stages=tuning.num_stages,
    )
    return xs[n_layers]
