"""Paged attention on CUDA in Triton: decode, verify and prefill chunks in one kernel.

Reference: :func:`mmserve.kernels.attention.paged_attention` (and
``reference_attention``); tests compare the two on random inputs.

Layout. The query rows of one (sequence, kv head) are its query tokens times the
``G = Hq / Hkv`` query heads that share the kv head, flattened as ``token * G + head``
(the reference's order). One program owns ``BLOCK_M`` such rows and walks the
sequence's keys in blocks of ``block_keys(head_dim)`` absolute positions, gathering them
through the block table.

Splits. The keys are cut into runs of ``split_keys(head_dim)`` keys aligned to absolute
positions; each is an online softmax of its own (max, denominator, weighted values), and
a row's output is the merge of its splits' states in ascending order (``merge_split``,
explicit FMAs), divided out. Here one program walks every split of its tile, the block
loop running on across split ends; the decode stack gives a long context's splits
programs of their own and merges their stored states in the same order: the same bits
either way. The split ends also cut the online softmax's chain of dependent steps, which
pays at long contexts and small grids (docs/performance.md).

Batch invariance. A row's result depends only on its own query, its sequence's
keys and its position: every tile has the same shape whatever the step holds, the
key blocks and splits are aligned to absolute positions and merged in one order, and a
key block a row cannot see (the tile runs to the reach of its last row) adds exact
zeros (``alpha = 1``, ``p = 0``), as does a split it cannot see (``a = 1``, ``b = 0``). So
a token's output is the same bits as a decode, as one of k+1 verify rows, inside a
prefill chunk, or next to any other sequences.

fp8 cache. With per-key scales (``k_scale``/``v_scale``, see :mod:`mmserve.kernels.fp8`)
the kernel loads e4m3 keys/values, converts them exactly to the query's dtype and
applies the scales per key: ``scores = dot(q, k8) * k_scale`` and ``p * v_scale`` before
the PV product (``l`` sums the unscaled ``p``). Scales are per key, so invariance holds;
without scales the code is the bf16 path unchanged (``FP8`` is a constexpr).
:func:`cuda_write_kv` quantises with the same float32 arithmetic as the CPU reference
(correctly rounded divisions, clamp, round-to-nearest-even), so both store the same bits.

Metadata. :class:`PagedMetadata` holds tensors only, so a step built from it can
be captured in a CUDA graph; :func:`paged_metadata` converts the CPU-path
:class:`~mmserve.kernels.attention.AttentionMetadata` once per step.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mmserve.kernels.settings import current
from mmserve.kernels.triton_pdl import pdl_args

try:  # Triton ships with CUDA builds of torch; the CPU path never needs it
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - CPU-only installs
    triton = None

BLOCK_M = 16  # query rows per program: the smallest tensor-core tile, one shape for all steps
# Keys per inner step (``block_keys``: at most a split), aligned to absolute positions. Part
# of the arithmetic like the split: with 64-dim heads a 128-key split is one block, a plain
# softmax over its keys before the ordered merge (64-key blocks made each split an online
# softmax over two, and slower). Heads of 128 dims and more keep 64 (their split).
BLOCK_N = 128
# Keys per split, aligned to absolute positions: a row's attention is the ordered merge of
# its splits' own online softmaxes, so a split can run in a program of its own (the decode
# stack spreads a long context's splits over its grid) with the same bits as here. Part of
# the arithmetic: changing it changes every attention output (consistently on all paths),
# so it is one value per head size (``split_keys``), the same on every path of a model.
# Heads of up to 64 dims: 128 keys; of 128 and more: 64 keys, which spread a small grid's
# contexts over twice the programs: faster for 128-dim heads, slower for 64-dim ones
# (docs/performance.md).
SPLIT = 128
SPLIT_WIDE_HEADS = 64


def split_keys(head_dim: int) -> int:
    """Keys per split for heads of ``head_dim`` dimensions."""
    return SPLIT_WIDE_HEADS if head_dim >= 128 else SPLIT


def block_keys(head_dim: int) -> int:
    """Keys per inner step for heads of ``head_dim`` dimensions (divides the split)."""
    return min(BLOCK_N, split_keys(head_dim))


# Launch options (speed only: the arithmetic and its order do not depend on them).
LAUNCH = {"num_warps": 4, "num_stages": 2}
# Grids of fewer programs than this prefetch the next key step's block ids, so a step waits
# for one round trip (keys and values), not two (ids, then keys); big grids (batch 64, a
# long prefill) run slower with it, so they keep the plain loop. The bits are the same.
PREFETCH_MAX_PROGRAMS = 128
# Such grids also load each step's keys and values during the step before (mode 2), so a
# step waits for the longer of its loads and its math, not both (an e4m3 cache keeps mode
# 1). Speed only: the same values meet the same arithmetic. (``KernelConfig.kv_ahead``
# off keeps mode 1, for comparisons.)
# Small grids (fewer (sequence, tile, kv head) groups than this) spread a long context's
# splits over programs of their own, as the decode stack does (``spread_programs``): at
# batch 1 the Llama-3-8B shape has 8 groups, each a chain of dependent key blocks in one
# program (``KernelConfig.spread``: off inside ``decode_stack.serial_splits``). ``runs``:
# launches so far; ``sms`` and ``counts``: per device, its SM count and the counters.
SPREAD_MAX_GROUPS = 64
SPREAD_MAX_PROGRAMS = 16
SPREAD: dict = {"runs": 0, "sms": {}, "counts": {}}


def prefetch_mode(fp8: bool) -> int:
    """``attention_rows``' PREFETCH for a small grid: 2 (block ids and keys/values a step
    ahead), or 1 (block ids only: an e4m3 cache, or ``KernelConfig.kv_ahead`` off)."""
    return 2 if current().kv_ahead and not fp8 else 1


def available() -> bool:
    return triton is not None and torch.cuda.is_available()


@dataclass
class PagedMetadata:
    """Attention metadata as fixed-shape tensors (graph-capturable).

    Sequence ``i`` owns query rows ``query_start[i] : query_start[i] + query_lens[i]`` of
    the flat batch, at positions ``context_lens[i] - query_lens[i] ..context_lens[i] - 1``.
    Padding sequences have ``query_lens == 0`` (nothing computed) and padding tokens a
    negative ``slot_mapping`` (nothing written).
    """

    slot_mapping: torch.Tensor  # (N,) int: flat cache slot of each new token's K/V; < 0: skip
    block_tables: torch.Tensor  # (B, max_blocks) int: cache block of each logical block
    context_lens: torch.Tensor  # (B,) int: cached + new tokens after this step
    query_start: torch.Tensor  # (B,) int: first query row of each sequence
    query_lens: torch.Tensor  # (B,) int
    max_query_len: int  # host-side bound that sizes the launch grid


def paged_metadata(meta, block_size: int) -> PagedMetadata:
    """``AttentionMetadata`` (per-sequence Python objects) -> tensors; cached on ``meta``.

    Every layer of a step shares ``meta``, so the conversion runs once per step.
    """
    if isinstance(meta, PagedMetadata):
        return meta
    cached = meta.__dict__.get("_paged")
    if cached is not None and cached[0] == block_size:
        return cached[1]
    dev = meta.slot_mapping.device
    seqs = meta.seqs
    slots = torch.nn.utils.rnn.pad_sequence([s.key_slots for s in seqs], batch_first=True)
    # key_slots[j * bs] is the first slot of logical block j: its block id times bs
    tables = torch.div(slots[:, ::block_size], block_size, rounding_mode="floor")
    host = torch.tensor([[s.start, s.num_queries, s.context_len] for s in seqs], dtype=torch.int32)
    host = host.to(dev, non_blocking=True)
    out = PagedMetadata(
        meta.slot_mapping,
        tables.to(torch.int32).contiguous(),
        host[:, 2].contiguous(),
        host[:, 0].contiguous(),
        host[:, 1].contiguous(),
        max(s.num_queries for s in seqs),
    )
    meta.__dict__["_paged"] = (block_size, out)
    return out


if triton is not None:
    from mmserve.kernels.triton_grid import prefetch_l1
    from mmserve.kernels.triton_pdl import wait_previous

    # Integer arguments that vary with the batch are not specialised on (1, divisible by
    # 16, or neither): each class is a compile of seconds, and the classes a batch reaches
    # depend on its shape (the block tables' width follows the longest sequence; PER and
    # SPLITS the number of groups and the context), so a step the start-up warm-up did
    # not shape exactly would compile while serving (an all-prefix-hit prefill of 8
    # voice streams had waited 1.8 s for its first token on a fresh H100).
    @triton.jit(do_not_specialize=["stride_bt"])
    def _paged_attention_kernel(
        q_ptr,
        k_ptr,
        v_ptr,
        o_ptr,
        tables_ptr,
        ctx_ptr,
        qstart_ptr,
        qlen_ptr,
        ks_ptr,
        vs_ptr,
        scale_log2,
        stride_qn,
        stride_qh,
        stride_on,
        stride_oh,
        stride_kb,
        stride_ks,
        stride_kh,
        stride_bt,
        stride_sb,
        stride_ss,
        G: tl.constexpr,
        D: tl.constexpr,
        PAGE: tl.constexpr,
        WINDOW: tl.constexpr,
        BM: tl.constexpr,
        BN: tl.constexpr,
        SPLIT: tl.constexpr,
        FP8: tl.constexpr,
        PREFETCH: tl.constexpr,
        PDL: tl.constexpr,
    ):
        wait_previous(PDL)  # before any exit: a grid never ends before its predecessor
        attention_rows(
            tl.program_id(0),
            tl.program_id(1),
            tl.program_id(2),
            q_ptr,
            k_ptr,
            v_ptr,
            o_ptr,
            tables_ptr,
            ctx_ptr,
            qstart_ptr,
            qlen_ptr,
            ks_ptr,
            vs_ptr,
            scale_log2,
            stride_qn,
            stride_qh,
            stride_on,
            stride_oh,
            stride_kb,
            stride_ks,
            stride_kh,
            stride_bt,
            stride_sb,
            stride_ss,
            G,
            D,
            PAGE,
            WINDOW,
            BM,
            BN,
            SPLIT,
            FP8,
            PREFETCH,
        )

    @triton.jit(do_not_specialize=["PER", "SPLITS", "stride_bt"])
    def _paged_attention_spread_kernel(
        q_ptr,
        k_ptr,
        v_ptr,
        o_ptr,
        tables_ptr,
        ctx_ptr,
        qstart_ptr,
        qlen_ptr,
        ks_ptr,
        vs_ptr,
        part_ptr,
        count_ptr,
        scale_log2,
        PER,
        SPLITS,
        stride_qn,
        stride_qh,
        stride_on,
        stride_oh,
        stride_kb,
        stride_ks,
        stride_kh,
        stride_bt,
        stride_sb,
        stride_ss,
        G: tl.constexpr,
        D: tl.constexpr,
        PAGE: tl.constexpr,
        WINDOW: tl.constexpr,
        BM: tl.constexpr,
        BN: tl.constexpr,
        SPLIT: tl.constexpr,
        FP8: tl.constexpr,
        PREFETCH: tl.constexpr,
        PDL: tl.constexpr,
    ):
        """``_paged_attention_kernel`` with ``PER`` programs a (sequence, tile, kv head)
        group: a context of several splits has them spread over the group's programs,
        each taking a run of consecutive splits and storing each split's state in
        ``part_ptr``; the last to count its run in (``count_ptr``, one a group, left at
        0 for the next launch) merges them all in order. One split: program 0 alone."""
        wait_previous(PDL)
        seq = tl.program_id(0)
        tile = tl.program_id(1)
        kvh = tl.program_id(2) // PER
        sub = tl.program_id(2) % PER
        row_ok, tok, head, qpos, lo, hi, qlen, _qs = tile_rows(
            seq, tile, kvh, qlen_ptr, ctx_ptr, qstart_ptr, G, BM, BN, WINDOW
        )
        first = lo // SPLIT
        last = tl.cdiv(hi, SPLIT)
        n = last - first
        table = tables_ptr + seq * stride_bt
        if tile * BM < qlen * G:
            if n == 1:  # nothing to spread: the whole tile here, as attention_rows
                if sub == 0:
                    q = load_queries(q_ptr, row_ok, tok, head, stride_qn, stride_qh, D)
                    _, den, acc = attend_keys(
                        q,
                        qpos,
                        table,
                        k_ptr,
                        v_ptr,
                        ks_ptr,
                        vs_ptr,
                        kvh,
                        lo,
                        hi,
                        scale_log2,
                        stride_kb,
                        stride_ks,
                        stride_sb,
                        stride_ss,
                        D,
                        PAGE,
                        WINDOW,
                        BM,
                        BN,
                        SPLIT,
                        FP8,
                        PREFETCH,
                        stride_kh,
                        ks_ptr,
                        False,
                    )
                    store_attention(o_ptr, den, acc, row_ok, tok, head, stride_on, stride_oh, D)
            else:
                run = tl.cdiv(n, PER)
                j0 = first + sub * run
                j1 = tl.minimum(j0 + run, last)
                if j0 < j1:
                    g = (seq * tl.num_programs(1) + tile) * (tl.num_programs(2) // PER) + kvh
                    part = part_ptr + g.to(tl.int64) * SPLITS * (2 * BM + BM * D)
                    q = load_queries(q_ptr, row_ok, tok, head, stride_qn, stride_qh, D)
                    attend_keys(
                        q,
                        qpos,
                        table,
                        k_ptr,
                        v_ptr,
                        ks_ptr,
                        vs_ptr,
                        kvh,
                        tl.maximum(lo, j0 * SPLIT),
                        tl.minimum(hi, j1 * SPLIT),
                        scale_log2,
                        stride_kb,
                        stride_ks,
                        stride_sb,
                        stride_ss,
                        D,
                        PAGE,
                        WINDOW,
                        BM,
                        BN,
                        SPLIT,
                        FP8,
                        PREFETCH,
                        stride_kh,
                        part,
                        True,
                    )
                    tl.debug_barrier()  # every thread's states stored, then counted
                    done = tl.atomic_add(count_ptr + g, j1 - j0, sem="acq_rel", scope="gpu")
                    if done + (j1 - j0) == n:  # the group's last run in: merge them all
                        tl.atomic_xchg(count_ptr + g, 0)  # every run has counted: reset
                        _, den, acc = merge_partials(part, first, last, BM, D, 4)
                        store_attention(o_ptr, den, acc, row_ok, tok, head, stride_on, stride_oh, D)

    @triton.jit
    def _kv_step(
        k_ptr,
        v_ptr,
        blk,
        kpos,
        hi,
        d,
        kvh,
        stride_kb,
        stride_ks,
        stride_kh,
        PAGE: tl.constexpr,
        V_L1: tl.constexpr = False,
        KT: tl.constexpr = False,
    ):
        """Keys and values (BN, D) at positions ``kpos`` of cache blocks ``blk`` (zeros
        from ``hi`` on). ``V_L1`` (speed only): the values' lines asked into L1 before the
        keys are loaded. Triton converts the keys to the QK operand's layout (through
        shared memory, behind CTA barriers) right after their load and issues the values'
        load only after that (sm_90 SASS of the kernel: the values' 8 ``LDG.128`` follow
        the keys' 4 rounds of ``BAR.SYNC``/``STS``/``LDSM``), so a block waits for two L2
        trips in a row; with the hint the second one is an L1 hit. ``KT`` (speed only): the
        keys loaded as (D, BN), the QK operand's own orientation, so their conversion is one
        shared-memory round like the values' and Triton issues both loads together (the
        SASS: the keys' and values' 16 ``LDG.128`` back to back, 4 ``BAR.SYNC`` fewer a
        block); the same values meet the same products."""
        k_in = (kpos < hi)[:, None]
        off = _kv_rows(blk, kpos, kvh, stride_kb, stride_ks, stride_kh, PAGE)
        if V_L1:
            _rows_l1(v_ptr, off, d.shape[0])
        if KT:
            k = tl.load(k_ptr + off[None, :] + d[:, None], mask=(kpos < hi)[None, :], other=0.0)
        else:
            k = tl.load(k_ptr + off[:, None] + d[None, :], mask=k_in, other=0.0)
        v = tl.load(v_ptr + off[:, None] + d[None, :], mask=k_in, other=0.0)
        return k, v

    @triton.jit
    def _block_update(
        q,
        k,
        v,
        kpos,
        k_in,
        qpos,
        m_i,
        l_i,
        acc,
        scale_log2,
        k_s,
        v_s,
        WINDOW: tl.constexpr,
        FP8: tl.constexpr,
        KT: tl.constexpr = False,
    ):
        """One key block (BN keys at ``kpos``) into a split's online softmax (``KT``: the
        keys come as (D, BN))."""
        kt = k if KT else tl.trans(k)
        if FP8:  # e4m3 -> q's dtype is exact; the per-key scale multiplies the scores
            s = tl.dot(q, kt.to(tl.float32).to(q.dtype)) * k_s[None, :]
        else:
            s = tl.dot(q, kt) * scale_log2  # (BM, BN) fp32, log2 units
        visible = (kpos[None, :] <= qpos[:, None]) & k_in[None, :]
        if WINDOW > 0:
            visible = visible & (qpos[:, None] - kpos[None, :] < WINDOW)
        s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # nothing seen yet
        alpha = tl.exp2(m_i - m_safe)
        p = tl.exp2(s - m_safe[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        if FP8:  # fold each value's scale into its weight: sum_j p_j * s_j * v8_j
            pv = (p * v_s[None, :]).to(q.dtype)
            acc = acc * alpha[:, None] + tl.dot(pv, v.to(tl.float32).to(q.dtype))
        else:
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        return m_new, l_i, acc

    @triton.jit
    def merge_split(m, den, acc, m_j, den_j, acc_j):
        """The running softmax (max, denominator, weighted values) with split j's merged in.
        Explicit FMAs: the same ops whichever kernel inlines it. Merged into the empty
        state (-inf, 0, 0) a split comes out as its own bits."""
        m_new = tl.maximum(m, m_j)
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        a = tl.exp2(m - m_safe)
        b = tl.exp2(m_j - m_safe)
        return m_new, tl.fma(den, a, den_j * b), tl.fma(acc, a[:, None], acc_j * b[:, None])

    @triton.jit
    def empty_softmax(BM: tl.constexpr, D: tl.constexpr):
        """The state before any key: (max -inf, denominator 0, weighted values 0)."""
        return (
            tl.full([BM], float("-inf"), tl.float32),
            tl.zeros([BM], tl.float32),
            tl.zeros([BM, D], tl.float32),
        )

    @triton.jit
    def seq_meta(seq, qlen_ptr, ctx_ptr, qstart_ptr):
        """Sequence ``seq``'s query count, context length and first flat row."""
        qlen = tl.load(qlen_ptr + seq)  # the three loads in flight together
        ctx = tl.load(ctx_ptr + seq)
        qstart = tl.load(qstart_ptr + seq)
        return qlen, ctx, qstart

    @triton.jit
    def tile_rows(
        seq,
        tile,
        kvh,
        qlen_ptr,
        ctx_ptr,
        qstart_ptr,
        G: tl.constexpr,
        BM: tl.constexpr,
        BN: tl.constexpr,
        WINDOW: tl.constexpr,
    ):
        """Query tile ``tile`` of (sequence ``seq``, kv head ``kvh``) -> (rows in use,
        their flat token rows, query heads and absolute positions, the first and the end
        key position the tile visits, the sequence's query count and first flat row)."""
        qlen, ctx, qstart = seq_meta(seq, qlen_ptr, ctx_ptr, qstart_ptr)
        rows = tile * BM + tl.arange(0, BM)
        tok = rows // G
        last_tok = tl.minimum(qlen - 1, ((tile + 1) * BM - 1) // G)
        hi = ctx - qlen + last_tok + 1  # keys the tile's last row can see
        lo = ctx * 0
        if WINDOW > 0:  # skip whole aligned blocks no row of the tile can see
            lo = tl.maximum(0, ctx - qlen + (tile * BM) // G - WINDOW + 1) // BN * BN
        return (
            rows < qlen * G,
            qstart + tok,
            kvh * G + rows % G,
            ctx - qlen + tok,
            lo,
            hi,
            qlen,
            qstart,
        )

    @triton.jit
    def _kv_rows(blk, kpos, kvh, stride_kb, stride_ks, stride_kh, PAGE: tl.constexpr):
        """The cache offsets of kv head ``kvh``'s rows at positions ``kpos`` (blocks ``blk``)."""
        return blk.to(tl.int64) * stride_kb + (kpos % PAGE) * stride_ks + kvh * stride_kh

    @triton.jit
    def _rows_l1(ptr, off, D: tl.constexpr):
        """Ask L1 for the rows of ``D`` elements at ``ptr + off``: a pointer a 128-byte line."""
        LV: tl.constexpr = max(1, D * ptr.dtype.element_ty.primitive_bitwidth // 1024)
        prefetch_l1(ptr + off[:, None] + (tl.arange(0, LV) * (D // LV))[None, :])

    @triton.jit
    def first_ids(table, k_lo, k_hi, BN: tl.constexpr, PAGE: tl.constexpr):
        """The cache block ids of the key step at ``k_lo`` (0 from ``k_hi`` on)."""
        kpos = k_lo + tl.arange(0, BN)
        return tl.load(table + kpos // PAGE, mask=kpos < k_hi, other=0)

    @triton.jit
    def attend_keys(
        q,
        qpos,
        table,
        k_ptr,
        v_ptr,
        ks_ptr,
        vs_ptr,
        kvh,
        k_lo,
        k_hi,
        scale_log2,
        stride_kb,
        stride_ks,
        stride_sb,
        stride_ss,
        D: tl.constexpr,
        PAGE: tl.constexpr,
        WINDOW: tl.constexpr,
        BM: tl.constexpr,
        BN: tl.constexpr,
        SPLIT: tl.constexpr,
        FP8: tl.constexpr,
        PREFETCH: tl.constexpr,
        stride_kh,
        part,
        STORE: tl.constexpr,
        STAGES: tl.constexpr = 0,
        V_L1: tl.constexpr = False,
        KT: tl.constexpr = False,
    ):
        """Keys ``k_lo .. k_hi - 1`` (block-aligned start) for the query tile ``q`` ->
        its softmax state, each ``SPLIT``-aligned run of keys an online softmax of its own,
        merged in ascending order (``merge_split``). ``STORE``: each split's own state goes
        to ``part`` instead (split j's max, denominator and weighted values at
        ``part + j * (2 BM + BM D)``, fp32), for a merge in order elsewhere. ``PREFETCH``
        (speed only, the same values meet the same math): 0 loads a key step's block ids,
        keys and values in the step; 1 loads the ids a step ahead; 2 the keys and values
        too (not with an e4m3 cache, whose scales are read with the step's own ids).
        ``STAGES``: the key loop's pipeline depth (0: the kernel's; speed only); ``V_L1``
        and ``KT``: ``_kv_step``'s (speed only)."""
        tl.static_assert(not (FP8 and PREFETCH == 2))
        tl.static_assert(SPLIT % BN == 0)
        d = tl.arange(0, D)
        m_r, l_r, acc_r = empty_softmax(BM, D)
        m_i, l_i, acc = empty_softmax(BM, D)
        k_s = tl.zeros([BN], tl.float32)
        v_s = k_s
        if PREFETCH > 0:  # the first step's cache blocks; each step then fetches the next's
            kpos = k_lo + tl.arange(0, BN)
            blk = first_ids(table, k_lo, k_hi, BN, PAGE)
            if PREFETCH == 2:  # and the first step's keys and values, then the next ids
                k_nx, v_nx = _kv_step(
                    k_ptr,
                    v_ptr,
                    blk,
                    kpos,
                    k_hi,
                    d,
                    kvh,
                    stride_kb,
                    stride_ks,
                    stride_kh,
                    PAGE,
                    V_L1,
                    KT,
                )
                blk = tl.load(table + (kpos + BN) // PAGE, mask=kpos + BN < k_hi, other=0)
        for start in tl.range(k_lo, k_hi, BN, num_stages=STAGES if STAGES > 0 else None):
            kpos = start + tl.arange(0, BN)
            k_in = kpos < k_hi
            if PREFETCH == 2:  # this step's keys and values arrived during the last
                # step's math; the next step's are asked for before this one's
                k, v = k_nx, v_nx
                k_nx, v_nx = _kv_step(
                    k_ptr,
                    v_ptr,
                    blk,
                    kpos + BN,
                    k_hi,
                    d,
                    kvh,
                    stride_kb,
                    stride_ks,
                    stride_kh,
                    PAGE,
                    V_L1,
                    KT,
                )
                nxt = kpos + 2 * BN
                blk = tl.load(table + nxt // PAGE, mask=nxt < k_hi, other=0)
            else:
                if PREFETCH == 0:
                    blk = tl.load(table + kpos // PAGE, mask=k_in, other=0)
                # keys and values in flight together (a decode step is a chain of waits)
                k, v = _kv_step(
                    k_ptr,
                    v_ptr,
                    blk,
                    kpos,
                    k_hi,
                    d,
                    kvh,
                    stride_kb,
                    stride_ks,
                    stride_kh,
                    PAGE,
                    V_L1,
                    KT,
                )
            if FP8:
                soff = blk.to(tl.int64) * stride_sb + (kpos % PAGE) * stride_ss + kvh
                k_s = tl.load(ks_ptr + soff, mask=k_in, other=0.0) * scale_log2  # (BN,)
                v_s = tl.load(vs_ptr + soff, mask=k_in, other=0.0)
            if PREFETCH == 1:
                nxt = kpos + BN
                blk = tl.load(table + nxt // PAGE, mask=nxt < k_hi, other=0)
            m_i, l_i, acc = _block_update(
                q, k, v, kpos, k_in, qpos, m_i, l_i, acc, scale_log2, k_s, v_s, WINDOW, FP8, KT
            )
            if ((start + BN) % SPLIT == 0) | (start + BN >= k_hi):  # a split ends
                if STORE:
                    store_split(part, start // SPLIT, m_i, l_i, acc, BM, D)
                else:
                    m_r, l_r, acc_r = merge_split(m_r, l_r, acc_r, m_i, l_i, acc)
                m_i, l_i, acc = empty_softmax(BM, D)
        return m_r, l_r, acc_r

    @triton.jit
    def split_state(part, j, BM: tl.constexpr, D: tl.constexpr):
        """The pointers of split j's state in ``part``: (max, denominator, weighted values)."""
        base = part + tl.cast(j, tl.int64) * (2 * BM + BM * D)  # (j: an int in the interpreter)
        r = tl.arange(0, BM)
        return base + r, base + BM + r, base + 2 * BM + r[:, None] * D + tl.arange(0, D)[None, :]

    @triton.jit
    def store_split(part, j, m, den, acc, BM: tl.constexpr, D: tl.constexpr):
        pm, pd, pa = split_state(part, j, BM, D)
        tl.store(pm, m)
        tl.store(pd, den)
        tl.store(pa, acc)

    @triton.jit
    def merge_partials(part, first, last, BM: tl.constexpr, D: tl.constexpr, CHUNK: tl.constexpr):
        """The split states ``first .. last - 1`` in ``part`` (written by other programs of
        the launch, read from L2) merged in ascending order from the empty state, as
        ``attend_keys`` merges them; ``CHUNK`` splits' loads in flight together."""
        m, den, acc = empty_softmax(BM, D)
        for j0 in range(first, last, CHUNK):
            for u in tl.static_range(CHUNK):
                j = j0 + u
                ok = j < last
                pm, pd, pa = split_state(part, j, BM, D)
                m_j = tl.load(pm, mask=ok, other=float("-inf"), cache_modifier=".cg")
                den_j = tl.load(pd, mask=ok, other=0.0, cache_modifier=".cg")
                acc_j = tl.load(pa, mask=ok, other=0.0, cache_modifier=".cg")
                m2, den2, acc2 = merge_split(m, den, acc, m_j, den_j, acc_j)
                m = tl.where(ok, m2, m)  # a split past the last one is not merged at all
                den = tl.where(ok, den2, den)
                acc = tl.where(ok, acc2, acc)
        return m, den, acc

    @triton.jit
    def store_attention(o_ptr, den, acc, row_ok, tok, head, stride_on, stride_oh, D: tl.constexpr):
        """The tile's rows ``acc / den`` in the output's dtype."""
        d = tl.arange(0, D)
        out = acc / tl.where(den == 0.0, 1.0, den)[:, None]
        tl.store(
            o_ptr + tok[:, None] * stride_on + head[:, None] * stride_oh + d[None, :],
            out.to(o_ptr.dtype.element_ty),
            mask=row_ok[:, None],
        )

    @triton.jit
    def load_queries(
        q_ptr, row_ok, tok, head, stride_qn, stride_qh, D: tl.constexpr, L2: tl.constexpr = False
    ):
        """The tile's query rows (BM, D) (``L2``: written by other programs of a
        persistent launch, read from L2)."""
        d = tl.arange(0, D)
        ptrs = q_ptr + tok[:, None] * stride_qn + head[:, None] * stride_qh + d[None, :]
        if L2:
            return tl.load(ptrs, mask=row_ok[:, None], other=0.0, cache_modifier=".cg")
        return tl.load(ptrs, mask=row_ok[:, None], other=0.0)

    @triton.jit
    def attention_rows(
        seq,
        tile,
        kvh,
        q_ptr,
        k_ptr,
        v_ptr,
        o_ptr,
        tables_ptr,
        ctx_ptr,
        qstart_ptr,
        qlen_ptr,
        ks_ptr,
        vs_ptr,
        scale_log2,
        stride_qn,
        stride_qh,
        stride_on,
        stride_oh,
        stride_kb,
        stride_ks,
        stride_kh,
        stride_bt,
        stride_sb,
        stride_ss,
        G: tl.constexpr,
        D: tl.constexpr,
        PAGE: tl.constexpr,
        WINDOW: tl.constexpr,
        BM: tl.constexpr,
        BN: tl.constexpr,
        SPLIT: tl.constexpr,
        FP8: tl.constexpr,
        PREFETCH: tl.constexpr,
    ):
        """Query rows ``tile`` of (sequence ``seq``, kv head ``kvh``): the kernel above, or
        one phase of a persistent kernel; every split of the tile's keys in this program,
        in order (``attend_keys``)."""
        # (Triton types a name once per scope: ``_`` below holds attend_keys' row maxima)
        row_ok, tok, head, qpos, lo, hi, qlen, _qs = tile_rows(
            seq, tile, kvh, qlen_ptr, ctx_ptr, qstart_ptr, G, BM, BN, WINDOW
        )
        if tile * BM < qlen * G:
            q = load_queries(q_ptr, row_ok, tok, head, stride_qn, stride_qh, D)
            _, den, acc = attend_keys(
                q,
                qpos,
                tables_ptr + seq * stride_bt,
                k_ptr,
                v_ptr,
                ks_ptr,
                vs_ptr,
                kvh,
                lo,
                hi,
                scale_log2,
                stride_kb,
                stride_ks,
                stride_sb,
                stride_ss,
                D,
                PAGE,
                WINDOW,
                BM,
                BN,
                SPLIT,
                FP8,
                PREFETCH,
                stride_kh,
                ks_ptr,
                False,
            )
            store_attention(o_ptr, den, acc, row_ok, tok, head, stride_on, stride_oh, D)

    @triton.jit
    def _write_kv_kernel(
        k_ptr,
        v_ptr,
        kc_ptr,
        vc_ptr,
        slot_ptr,
        stride_kn,
        stride_vn,
        ROW: tl.constexpr,
        BLOCK: tl.constexpr,
    ):
        n = tl.program_id(0)
        slot = tl.load(slot_ptr + n).to(tl.int64)
        if slot < 0:  # a padding token: write nothing
            return
        for c in tl.static_range(0, ROW, BLOCK):
            i = c + tl.arange(0, BLOCK)
            ok = i < ROW
            tl.store(kc_ptr + slot * ROW + i, tl.load(k_ptr + n * stride_kn + i, mask=ok), mask=ok)
            tl.store(vc_ptr + slot * ROW + i, tl.load(v_ptr + n * stride_vn + i, mask=ok), mask=ok)

    @triton.jit
    def _quantize_store(
        src_ptr,
        dst_ptr,
        scale_ptr,
        h,
        d,
        HKV: tl.constexpr,
        D: tl.constexpr,
        BH: tl.constexpr,
        BD: tl.constexpr,
    ):
        """One token's (HKV, D) vectors -> e4m3 at ``dst_ptr``, scales (HKV,) at ``scale_ptr``.

        The reference's arithmetic (``kernels.fp8.quantize_fp8``): ``div_rn`` is IEEE
        division (Triton's ``/`` is approximate); a float downcast rounds to nearest even.
        """
        ok = (h[:, None] < HKV) & (d[None, :] < D)
        x = tl.load(src_ptr + h[:, None] * D + d[None, :], mask=ok, other=0.0).to(tl.float32)
        amax = tl.max(tl.abs(x), 1)  # (BH,)
        scale = tl.math.div_rn(amax, tl.full([BH], 448.0, tl.float32))
        safe = tl.where(scale > 0.0, scale, 1.0)  # a zero vector stores zeros and scale 0
        y = tl.math.div_rn(x, tl.broadcast_to(safe[:, None], [BH, BD]))
        y = tl.minimum(tl.maximum(y, -448.0), 448.0)
        tl.store(dst_ptr + h[:, None] * D + d[None, :], y.to(dst_ptr.dtype.element_ty), mask=ok)
        tl.store(scale_ptr + h, scale, mask=h < HKV)

    @triton.jit
    def _write_kv_fp8_kernel(
        k_ptr,
        v_ptr,
        kc_ptr,
        vc_ptr,
        ks_ptr,
        vs_ptr,
        slot_ptr,
        stride_kn,
        stride_vn,
        HKV: tl.constexpr,
        D: tl.constexpr,
        BH: tl.constexpr,
        BD: tl.constexpr,
    ):
        n = tl.program_id(0)
        slot = tl.load(slot_ptr + n).to(tl.int64)
        if slot < 0:  # a padding token: write nothing
            return
        h = tl.arange(0, BH)
        d = tl.arange(0, BD)
        _quantize_store(
            k_ptr + n * stride_kn,
            kc_ptr + slot * (HKV * D),
            ks_ptr + slot * HKV,
            h,
            d,
            HKV,
            D,
            BH,
            BD,
        )
        _quantize_store(
            v_ptr + n * stride_vn,
            vc_ptr + slot * (HKV * D),
            vs_ptr + slot * HKV,
            h,
            d,
            HKV,
            D,
            BH,
            BD,
        )


def cuda_paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta,
    scale: float,
    window: int | None = None,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """q: (N, Hq, D) -> (N, Hq, D); caches (blocks, bs, Hkv, D). ``meta``: either form.

    ``k_scale``/``v_scale`` (blocks, bs, Hkv) float32: the caches hold e4m3 (fp8 path).
    """
    n, hq, d = q.shape
    _, page, hkv, dk = k_cache.shape
    assert dk == d and hq % hkv == 0 and d & (d - 1) == 0, "head_dim must be a power of two"
    assert q.stride(-1) == 1 and k_cache.stride(-1) == 1 and k_cache.stride() == v_cache.stride()
    fp8 = k_scale is not None
    if k_scale is None or v_scale is None:
        assert v_scale is None, "an fp8 cache has both scales"
        k_scale = v_scale = k_cache  # never read: FP8 is off
    else:
        assert k_scale.stride() == v_scale.stride() and k_scale.stride(-1) == 1
    pm = paged_metadata(meta, page)
    g = hq // hkv
    out = torch.empty_like(q)
    b = pm.context_lens.shape[0]
    if b == 0 or n == 0:
        return out
    tiles = -(-pm.max_query_len * g // BLOCK_M)
    groups = b * tiles * hkv
    prefetch = prefetch_mode(fp8) if groups < PREFETCH_MAX_PROGRAMS else 0
    strides = (
        q.stride(0),
        q.stride(1),
        out.stride(0),
        out.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        pm.block_tables.stride(0),
        k_scale.stride(0),
        k_scale.stride(1),
    )
    consts = dict(
        G=g,
        D=d,
        PAGE=page,
        WINDOW=window or 0,
        BM=BLOCK_M,
        BN=block_keys(d),
        SPLIT=split_keys(d),
        FP8=fp8,
        PREFETCH=prefetch,
        **pdl_args(q),
        **LAUNCH,
    )
    per = spread_programs(groups, q.device)
    counts = _spread_counts(q.device) if per > 1 else None
    if counts is None:
        _paged_attention_kernel[(b, tiles, hkv)](
            q,
            k_cache,
            v_cache,
            out,
            pm.block_tables,
            pm.context_lens,
            pm.query_start,
            pm.query_lens,
            k_scale,
            v_scale,
            scale * 1.4426950408889634,
            *strides,
            **consts,
        )
        return out
    SPREAD["runs"] += 1
    splits, part = split_states(groups, pm.block_tables, page, d, q.device)
    _paged_attention_spread_kernel[(b, tiles, hkv * per)](
        q,
        k_cache,
        v_cache,
        out,
        pm.block_tables,
        pm.context_lens,
        pm.query_start,
        pm.query_lens,
        k_scale,
        v_scale,
        part,
        counts,
        scale * 1.4426950408889634,
        per,
        splits,
        *strides,
        **consts,
    )
    return out


def split_states(
    groups: int, block_tables: torch.Tensor, page: int, d: int, device: torch.device
) -> tuple[int, torch.Tensor]:
    """The most splits a tile can have (what the block tables hold) and a scratch for every
    group's split states at that many (``split_state``'s layout, float32; one element
    for no groups, a pointer a kernel that never stores a state may still be given)."""
    splits = -(-block_tables.shape[1] * page // split_keys(d))
    return splits, torch.empty(
        max(1, groups * splits * (2 * BLOCK_M + BLOCK_M * d)), dtype=torch.float32, device=device
    )


def spread_programs(groups: int, device: torch.device) -> int:
    """Programs a (sequence, tile, kv head) group gets: 1 (each tile's splits in one
    program) unless spreading is on and the groups leave most of the GPU idle; then as
    many as fill it, up to ``SPREAD_MAX_PROGRAMS``. Speed only: the bits are the same."""
    if not current().spread or groups >= SPREAD_MAX_GROUPS:
        return 1
    sms = SPREAD["sms"].get(device.index)
    if sms is None:  # (the interpreter's CPU tensors: a small GPU's worth)
        sms = SPREAD["sms"][device.index] = (
            torch.cuda.get_device_properties(device).multi_processor_count
            if device.type == "cuda"
            else 8
        )
    return max(1, min(SPREAD_MAX_PROGRAMS, sms // groups))


def _spread_counts(device: torch.device) -> torch.Tensor | None:
    """The spread kernel's per-group counters: zeroed once, each reset by the program that
    merges its group (so no launch needs a memset before it). None while a CUDA graph is
    being captured before they exist (that launch keeps its splits in one program)."""
    counts = SPREAD["counts"].get(device.index)
    if counts is None:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            return None
        counts = SPREAD["counts"][device.index] = torch.zeros(
            SPREAD_MAX_GROUPS, dtype=torch.int32, device=device
        )
    return counts


def cuda_write_kv(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    slot_mapping: torch.Tensor,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> None:
    """Store k, v (N, Hkv, D) at their flat slots; negative slots (padding) are skipped.

    With ``k_scale``/``v_scale`` (blocks, bs, Hkv) float32 the caches are e4m3: each token's
    vectors are quantised per kv head, exactly as ``kernels.fp8.quantize_fp8`` does.
    """
    n, hkv, d = k.shape
    if n == 0:
        return
    assert k.stride(1) == d and k.stride(2) == 1 and v.stride(1) == d and v.stride(2) == 1
    assert k_cache.is_contiguous() and v_cache.is_contiguous()
    if k_scale is not None or v_scale is not None:
        assert k_scale is not None and v_scale is not None, "an fp8 cache has both scales"
        assert k_scale.is_contiguous() and v_scale.is_contiguous()
        _write_kv_fp8_kernel[(n,)](
            k,
            v,
            k_cache,
            v_cache,
            k_scale,
            v_scale,
            slot_mapping,
            k.stride(0),
            v.stride(0),
            HKV=hkv,
            D=d,
            BH=triton.next_power_of_2(hkv),
            BD=triton.next_power_of_2(d),
            num_warps=4,
        )
        return
    row = hkv * d
    block = min(1024, triton.next_power_of_2(row))
    _write_kv_kernel[(n,)](
        k,
        v,
        k_cache,
        v_cache,
        slot_mapping,
        k.stride(0),
        v.stride(0),
        ROW=row,
        BLOCK=block,
        num_warps=4,
    )
