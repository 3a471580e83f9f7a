"""Fused decoder-layer kernels on CUDA in Triton: fewer launches per layer, same invariance.

References (tests compare on random inputs): :mod:`mmserve.kernels.fused`'s unfused
compositions of ``rms_norm``, ``linear``, ``F.silu``, ``RotaryTable.rotate`` and ``write_kv``.

The GEMMs are :mod:`mmserve.kernels.triton_matmul`'s: every output element is one chain
of tensor-core k16 steps over K in ascending order, accumulated in fp32, no split-K,
tile shape by row count (``pick_config``), so an element's arithmetic never depends on
M or the tile shape. The fusions keep that true:

- RMSNorm (hidden <= ``fused.FUSE_MAX_HIDDEN``, so every GPU path of such a model runs
  this arithmetic): ``out = rstd * (round(x * (offset + w)) @
  W.T)``, the scale applied to the fp32 accumulator before the bias and every rounding.
  The K loop rounds ``x * (offset + w)`` (fp32) to the activation dtype with no per-row
  factor, so the phase that writes x can hand that operand over ready (the decode
  stack). ``rstd = rsqrt(T / K + eps)``, T the perfect pairwise tree of adjacent ``x * x``
  over K padded with zeros to a power of two: ``pair_sum`` of each ``NORM_CHUNK`` chunk,
  the chunks' sums by a binary counter (``_tree_level``). That order is fixed by
  construction (a level adds pairs), whatever the tile, and it is the same sum as
  16-column subtrees added by a tree, which is how the decode stack's producers hand it
  over (``norm_partials``).
- Residual epilogue: the accumulator is rounded to the output dtype, then the residual
  is added in fp32 and rounded once more: the bits of torch's ``residual + linear(x, W)``
  (a half-precision add computes in fp32 and rounds).
- Gated epilogue: a program owns gate columns ``n`` and the matching up columns
  ``n + inter``; it rounds both, applies silu in fp32 with torch's arithmetic (precise
  expf, IEEE division), rounds, multiplies and rounds, as the unfused
  ``F.silu(gate) * up`` does: the same bits as that product of the fused norm GEMM.
- ``rope_write_kv``: one program per token rotates its q and k heads with the rounding
  of :mod:`mmserve.kernels.triton_rope` (bit-identical for bf16), stores the rotated k
  and v at the token's cache slot (a negative slot is padding: nothing written) and
  the rotated q to a new tensor.

Roundings to bf16 are done on the bits (``round_bf16``) so no compiler rewrite can drop one.
"""

from __future__ import annotations

import os

import torch

from mmserve.kernels.triton_matmul import TileConfig, overridden, pick_config
from mmserve.kernels.triton_pdl import gemm_pdl_args, pdl_args

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - CPU-only installs
    triton = None

NORM_CHUNK = 64  # columns a chunk of the norm's sum of squares (speed only: the tree is fixed)
NORM_LEVELS = 8  # the binary counter's levels in _row_rstd: at most 2**8 chunks pushed
NORM_MAX_K = 8192  # the fused norm's widest row (K <= 2**7 chunks, so a round's padding fits)
ROUND_NONE, ROUND_BF16, ROUND_FP16 = 0, 1, 2


def norm_unroll(bm: int) -> int:
    """Norm chunks loaded per round of the prologue (speed only; the bits do not move).

    Thin tiles (decode) wait on memory latency: 8 loads a round. Wider tiles keep one:
    unrolling them was slower (docs/performance.md)."""
    return 8 if bm <= 16 else 1


def _round_mode(dtype: torch.dtype) -> int:
    return {torch.bfloat16: ROUND_BF16, torch.float16: ROUND_FP16}.get(dtype, ROUND_NONE)


def fused_config(m: int, n: int, gated: bool) -> TileConfig:
    """``pick_config`` (for the gate_up width when gated), narrowed where the norm's fp32
    tile or a second accumulator would spill registers (ptxas, sm_90). Speed only: an
    element's bits do not depend on the tile shape."""
    cfg = pick_config(m, 2 * n if gated else n)
    if gated:
        return cfg._replace(bn=max(16, min(cfg.bn // 2, 8192 // cfg.bm)), bk=max(32, cfg.bk // 2))
    return cfg._replace(bk=cfg.bk // 2) if cfg.bm >= 64 else cfg


# Pipeline stages of the thin residual GEMMs (o and down of a wide model) by K: (min K,
# stages). A thin program's weight stream is bound by the bytes it has in flight, and at
# 16x16x256 each stage is 8 kB of weights. Deeper than these (8 stages) was slower; the
# QKV GEMM (K 4,096, after a norm) keeps 4, since its programs run in two waves
# (docs/performance.md). Speed only: the bits do not depend on the stages.
RESIDUAL_STAGES = ((8192, 7), (4096, 6))
_DEEP: dict[int, bool] = {}


def residual_config(m: int, n: int, k: int, device: torch.device) -> TileConfig:
    """``pick_config`` for ``residual + x @ W.T``, with a deeper weight pipeline for thin
    tiles of a long K where two programs of it still fit an SM's shared memory (sm_90 and
    sm_100: 228 kB; 7 stages of 16x16x256 take 96 kB), unless a bench set the tile."""
    cfg = pick_config(m, n)
    if cfg[:4] != (16, 16, 256, 2) or overridden(m) or device.type != "cuda":
        return cfg  # the stages were measured for this thin tile only
    deep = _DEEP.get(device.index or 0)
    if deep is None:
        deep = _DEEP[device.index or 0] = torch.cuda.get_device_capability(device)[0] in (9, 10)
    if deep:
        for min_k, stages in RESIDUAL_STAGES:
            if k >= min_k:
                return cfg._replace(stages=stages)
    return cfg


if triton is not None:
    from triton.language.extra import libdevice

    from mmserve.kernels.triton_attention import _quantize_store
    from mmserve.kernels.triton_matmul import tile_ids, tile_rows_cols
    from mmserve.kernels.triton_pdl import launch_next, wait_only, wait_previous
    from mmserve.kernels.triton_rope import round_bf16

    @triton.jit
    def _round(f, MODE: tl.constexpr):
        """fp32 -> the activation dtype's value, kept as fp32 (MODE: ROUND_*)."""
        if MODE == 1:
            return round_bf16(f)
        elif MODE == 2:
            return f.to(tl.float16).to(tl.float32)
        else:
            return f

    if os.environ.get("TRITON_INTERPRET") == "1":  # no libdevice there; numpy's exp is exact

        @triton.jit
        def _silu(g):
            return g / (1.0 + tl.exp(-g))
    else:

        @triton.jit
        def _silu(g):
            """torch's CUDA silu of fp32 ``g``: ``g / (1 + expf(-g))`` with the precise expf
            and an IEEE division (``tl.exp`` is ex2.approx and Triton's ``/`` approximate),
            so the gated epilogue's bits equal ``F.silu(gate) * up``'s (tests)."""
            return tl.math.div_rn(g, 1.0 + libdevice.exp(-g))

    @triton.jit
    def pair_sum(x, N: tl.constexpr):
        """(R, N) -> (R,): each row's sum as a perfect pairwise tree of adjacent elements
        (N a power of two, 2 to 128), so the order is fixed by construction (``tl.sum``
        over N follows the register layout, so the tile shape and the warp count). A level
        sums an axis of size 2: one add whichever thread holds which element (a warp
        shuffle where they differ). ``tl.split`` of the reshape gives the same sums through
        layout conversions in shared memory (many more CTA barriers, about twice the
        stack's replay time)."""
        tl.static_assert(N >= 2 and N <= 128)
        R: tl.constexpr = x.shape[0]
        W: tl.constexpr = N // 2
        x = tl.sum(tl.reshape(x, [R, W, 2]), 2)  # a sum of two: the one add, in any order
        if N >= 4:
            x = tl.sum(tl.reshape(x, [R, W // 2, 2]), 2)
        if N >= 8:
            x = tl.sum(tl.reshape(x, [R, W // 4, 2]), 2)
        if N >= 16:
            x = tl.sum(tl.reshape(x, [R, W // 8, 2]), 2)
        if N >= 32:
            x = tl.sum(tl.reshape(x, [R, W // 16, 2]), 2)
        if N >= 64:
            x = tl.sum(tl.reshape(x, [R, W // 32, 2]), 2)
        if N >= 128:
            x = tl.sum(tl.reshape(x, [R, W // 64, 2]), 2)
        return tl.reshape(x, [R])

    @triton.jit
    def _tree_level(s, carry, i, LEVEL: tl.constexpr):
        """Level ``LEVEL`` of pushing subtree ``i`` (0, 1, ...; sum ``carry``) onto a binary
        counter of perfect subtrees (``s``: the level's pending subtree of 2**LEVEL leaves,
        held while bit LEVEL of the count is set) -> (carry, s). The carry reaches the level
        when the bits below are all set in ``i``; there it merges with the pending subtree
        (left + right) when the level's bit is set, else it becomes the pending one."""
        reached = ((i + 1) & ((1 << LEVEL) - 1)) == 0
        bit = (i >> LEVEL) & 1
        return (
            tl.where(reached & (bit == 1), s + carry, carry),
            tl.where(reached & (bit == 0), carry, s),
        )

    @triton.jit
    def tree_push(c, i, s0, s1, s2, s3, s4, s5, s6, s7):
        """Subtree ``i`` (sum ``c``) pushed onto the counter's eight levels (``_tree_level``)."""
        c, s0 = _tree_level(s0, c, i, 0)
        c, s1 = _tree_level(s1, c, i, 1)
        c, s2 = _tree_level(s2, c, i, 2)
        c, s3 = _tree_level(s3, c, i, 3)
        c, s4 = _tree_level(s4, c, i, 4)
        c, s5 = _tree_level(s5, c, i, 5)
        c, s6 = _tree_level(s6, c, i, 6)
        c, s7 = _tree_level(s7, c, i, 7)
        return s0, s1, s2, s3, s4, s5, s6, s7

    @triton.jit
    def tree_fold(n, s0, s1, s2, s3, s4, s5, s6, s7):
        """The counter's total after ``n`` pushes (< 256), smallest subtree first (the
        tree's right spine)."""
        t = tl.where((n & 1) != 0, s0, 0.0)
        t = tl.where((n & 2) != 0, s1 + t, t)
        t = tl.where((n & 4) != 0, s2 + t, t)
        t = tl.where((n & 8) != 0, s3 + t, t)
        t = tl.where((n & 16) != 0, s4 + t, t)
        t = tl.where((n & 32) != 0, s5 + t, t)
        t = tl.where((n & 64) != 0, s6 + t, t)
        return tl.where((n & 128) != 0, s7 + t, t)

    @triton.jit
    def rstd_of(total, K, eps):
        """(R,) sums of squares over K -> 1 / rms (one expression for every path)."""
        return tl.rsqrt(total / K + eps)

    @triton.jit
    def _row_rstd(
        a_rows,
        row_ok,
        K,
        eps,
        BM: tl.constexpr,
        CH: tl.constexpr,
        UNROLL: tl.constexpr,
        ACT_CACHE: tl.constexpr,
    ):
        """The RMSNorm prologue: (BM,) 1 / rms of the rows (``row_sumsq``)."""
        return rstd_of(row_sumsq(a_rows, row_ok, K, BM, CH, UNROLL, ACT_CACHE), K, eps)

    @triton.jit
    def row_sumsq(
        a_rows,
        row_ok,
        K,
        BM: tl.constexpr,
        CH: tl.constexpr,
        UNROLL: tl.constexpr,
        ACT_CACHE: tl.constexpr,
    ):
        """(BM,) the rows' squares summed by the perfect pairwise tree over K padded to a
        power of two: a chunk of CH columns (a power of two) by ``pair_sum``, the chunks by a
        binary counter of ``NORM_LEVELS`` levels, folded smallest subtree first (the tree's
        right spine; the padding's zeros add exactly)."""
        ck = tl.arange(0, CH)
        s0 = tl.zeros([BM], tl.float32)
        s1 = s0
        s2 = s0
        s3 = s0
        s4 = s0
        s5 = s0
        s6 = s0
        s7 = s0
        # UNROLL chunks a round: their loads are independent, so a round waits for
        # memory once, not UNROLL times (K=4096 was 64 dependent L2 round trips a
        # program); a round's masked chunks push zeros, which the tree adds exactly, so
        # the bits do not depend on UNROLL
        for k in range(0, K, CH * UNROLL):
            for u in tl.static_range(UNROLL):
                kk = k + u * CH + ck
                x = tl.load(
                    a_rows + kk[None, :],
                    mask=row_ok[:, None] & (kk[None, :] < K),
                    other=0.0,
                    cache_modifier=ACT_CACHE,
                ).to(tl.float32)
                s0, s1, s2, s3, s4, s5, s6, s7 = tree_push(
                    pair_sum(x * x, CH), k // CH + u, s0, s1, s2, s3, s4, s5, s6, s7
                )
        n = tl.cdiv(K, CH * UNROLL) * UNROLL  # subtrees pushed
        return tree_fold(n, s0, s1, s2, s3, s4, s5, s6, s7)

    @triton.jit
    def partials_rstd(ps_ptr, rm, row_ok, G, K, eps, GP: tl.constexpr, CACHE: tl.constexpr):
        """(BM,) 1 / rms of rows ``rm`` from their ``G`` 16-column subtree sums of squares
        (``norm_partials``, row stride G), added by ``pair_sum`` over G padded to GP: the
        same tree, so the same bits, as ``_row_rstd`` from the row."""
        return rstd_of(pair_sum(partials_load(ps_ptr, rm, row_ok, G, GP, CACHE), GP), K, eps)

    @triton.jit
    def partials_load(ps_ptr, rm, row_ok, G, GP: tl.constexpr, CACHE: tl.constexpr):
        """Rows ``rm``'s ``G`` subtree sums (BM, GP), zeros past G (``partials_rstd``'s)."""
        gi = tl.arange(0, GP)
        return tl.load(
            ps_ptr + rm.to(tl.int64)[:, None] * G + gi[None, :],
            mask=row_ok[:, None] & (gi[None, :] < G),
            other=0.0,
            cache_modifier=CACHE,
        )

    @triton.jit
    def norm_partials(xo, y_ptr, gw, ps_ptr, rm, rn, row_ok, out_ok, group, G, stride_ym, offset):
        """A producer's hand-over to the next normed product: its 16 stored columns ``xo``
        (BM, 16) (fp32 holding the stored values) times the next norm's weight ``gw`` (16,),
        rounded as the K loop rounds its operand, to ``y_ptr`` (row stride ``stride_ym``), and
        the 16-column subtree of their squares to ``ps_ptr`` (row stride G) at ``group``."""
        g = offset + gw.to(tl.float32)
        tl.store(
            y_ptr + rm.to(tl.int64)[:, None] * stride_ym + rn[None, :],
            (xo * g[None, :]).to(y_ptr.dtype.element_ty),
            mask=out_ok,
        )
        tl.store(ps_ptr + rm.to(tl.int64) * G + group, pair_sum(xo * xo, 16), mask=row_ok)

    # M (a step's rows) is not specialised on divisibility by 16: a variant for each
    # (tile config, M % 16 == 0) pair would compile at the first step that reaches it,
    # which the start-up warm-up cannot cover for every row count.
    @triton.jit(do_not_specialize=["M"])
    def _fused_gemm_kernel(
        a_ptr,
        w_ptr,
        o_ptr,
        bias_ptr,
        res_ptr,
        nw_ptr,
        M,
        N,
        K,
        UP,
        stride_am,
        stride_wn,
        stride_om,
        stride_rm,
        eps,
        offset,
        NORM: tl.constexpr,
        HAS_BIAS: tl.constexpr,
        RESIDUAL: tl.constexpr,
        GATED: tl.constexpr,
        ROUND: tl.constexpr,
        BM: tl.constexpr,
        BN: tl.constexpr,
        BK: tl.constexpr,
        GROUP_M: tl.constexpr,
        CH: tl.constexpr,
        UNROLL: tl.constexpr,
        PDL: tl.constexpr,
        LATE: tl.constexpr,
    ):
        wait_only(PDL)
        if not LATE:  # else the next kernel launches once this program's tile is done
            launch_next(PDL)
        fused_tile(
            tl.program_id(0),
            a_ptr,
            w_ptr,
            o_ptr,
            bias_ptr,
            res_ptr,
            nw_ptr,
            M,
            N,
            K,
            UP,
            stride_am,
            stride_wn,
            stride_om,
            stride_rm,
            eps,
            offset,
            NORM,
            HAS_BIAS,
            RESIDUAL,
            GATED,
            ROUND,
            BM,
            BN,
            BK,
            GROUP_M,
            CH,
            UNROLL,
            "",
        )
        if LATE:
            launch_next(PDL)

    @triton.jit
    def _silu_mul_kernel(
        x_ptr,
        o_ptr,
        INTER,
        stride_x,
        stride_o,
        ROUND: tl.constexpr,
        BLOCK: tl.constexpr,
        PDL: tl.constexpr,
    ):
        """``F.silu(gate) * up`` of one row's ``BLOCK`` columns, gate/up the row's halves."""
        wait_previous(PDL)
        row = tl.program_id(0).to(tl.int64)
        col = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        ok = col < INTER
        g = tl.load(x_ptr + row * stride_x + col, mask=ok, other=0.0).to(tl.float32)
        u = tl.load(x_ptr + row * stride_x + INTER + col, mask=ok, other=0.0).to(tl.float32)
        tl.store(
            o_ptr + row * stride_o + col,
            (_round(_silu(g), ROUND) * u).to(o_ptr.dtype.element_ty),
            mask=ok,
        )

    @triton.jit
    def _tile_products(
        a_rows,
        w_rows,
        u_rows,
        row_ok,
        rn,
        N,
        K,
        nw_ptr,
        offset,
        NORM: tl.constexpr,
        GATED: tl.constexpr,
        BM: tl.constexpr,
        BN: tl.constexpr,
        BK: tl.constexpr,
        ACT_CACHE: tl.constexpr,
        STAGES: tl.constexpr = 0,
    ):
        """The K loop of a tile: (BM, BN) fp32 products of the rows at ``a_rows`` (with
        NORM times ``offset`` + the norm weight, rounded to the activations' dtype; the
        row's 1 / rms is the caller's, on the accumulator) with the weight rows at
        ``w_rows`` (and ``u_rows`` when GATED), one chain of k16 steps in ascending order.
        ``rn`` (BN,): the weight rows' indices below ``N`` (the rows the tile may read).
        ``STAGES``: the loop's pipeline depth (0: the kernel's; speed only)."""
        rk = tl.arange(0, BK)
        acc = tl.zeros([BM, BN], dtype=tl.float32)
        acc_u = tl.zeros([BM, BN], dtype=tl.float32)
        for k in tl.range(0, K, BK, num_stages=STAGES if STAGES > 0 else None):
            kk = k + rk
            k_ok = kk < K
            a = tl.load(
                a_rows + kk[None, :],
                mask=row_ok[:, None] & k_ok[None, :],
                other=0.0,
                cache_modifier=ACT_CACHE,
            )
            if NORM:  # the operand norm_partials hands over: round(x * (offset + w))
                nw = tl.load(nw_ptr + kk, mask=k_ok, other=0.0).to(tl.float32)
                a = (a.to(tl.float32) * (offset + nw)[None, :]).to(a_rows.dtype.element_ty)
            w_ok = (rn[:, None] < N) & k_ok[None, :]
            w = tl.load(w_rows + kk[None, :], mask=w_ok, other=0.0)
            acc = tl.dot(a, tl.trans(w), acc)
            if GATED:
                u = tl.load(u_rows + kk[None, :], mask=w_ok, other=0.0)
                acc_u = tl.dot(a, tl.trans(u), acc_u)
        return acc, acc_u

    @triton.jit
    def _load_tile(ptr, rm, rn, stride_m, ok, CACHE: tl.constexpr):
        """Rows ``rm`` and columns ``rn`` of a row-major matrix (zeros where not ``ok``)."""
        return tl.load(
            ptr + rm.to(tl.int64)[:, None] * stride_m + rn[None, :],
            mask=ok,
            other=0.0,
            cache_modifier=CACHE,
        )

    @triton.jit
    def _tile_rstd(
        a_rows,
        ps_ptr,
        rm,
        row_ok,
        K,
        G,
        eps,
        NORM: tl.constexpr,
        DEFER: tl.constexpr,
        BM: tl.constexpr,
        CH: tl.constexpr,
        UNROLL: tl.constexpr,
        GP: tl.constexpr,
        ACT_CACHE: tl.constexpr,
    ):
        """The rows' 1 / rms for the accumulator: NORM from the rows (``_row_rstd``), DEFER
        1 from their producers' subtree sums (``partials_rstd``, the same bits), else ones."""
        if NORM:
            rstd = _row_rstd(a_rows, row_ok, K, eps, BM, CH, UNROLL, ACT_CACHE)
        elif DEFER == 1:
            rstd = partials_rstd(ps_ptr, rm, row_ok, G, K, eps, GP, ACT_CACHE)
        else:
            rstd = tl.full([BM], 1.0, tl.float32)
        return rstd

    @triton.jit
    def fused_tile(
        pid,
        a_ptr,
        w_ptr,
        o_ptr,
        bias_ptr,
        res_ptr,
        nw_ptr,
        M,
        N,
        K,
        UP,
        stride_am,
        stride_wn,
        stride_om,
        stride_rm,
        eps,
        offset,
        NORM: tl.constexpr,
        HAS_BIAS: tl.constexpr,
        RESIDUAL: tl.constexpr,
        GATED: tl.constexpr,
        ROUND: tl.constexpr,
        BM: tl.constexpr,
        BN: tl.constexpr,
        BK: tl.constexpr,
        GROUP_M: tl.constexpr,
        CH: tl.constexpr,
        UNROLL: tl.constexpr,
        ACT_CACHE: tl.constexpr,
        ONE_DOT: tl.constexpr = False,
        EARLY: tl.constexpr = False,
        DEFER: tl.constexpr = 0,
        y_ptr=None,
        g_ptr=None,
        ps_ptr=None,
        G=1,
        GP: tl.constexpr = 64,
        STAGES: tl.constexpr = 0,
    ):
        """Output tile ``pid`` of the fused GEMM (the kernel above, or one phase of a
        persistent kernel: ``ACT_CACHE=".cg"`` reads the activations and the residual,
        written by other programs of the launch, from L2). ``ONE_DOT`` (GATED): the gate
        and up rows as one (2 BN)-row weight tile in one product, split after the K loop
        (the same chains, so the same bits; fewer loads and operand fetches a step).
        ``EARLY`` (RESIDUAL): the residual asked for before the product, not after it (its
        round trip off the tile's critical path; its registers held across the K loop).
        ``DEFER`` (the decode stack's norm
        hand-over, the same bits as NORM from the rows): 1 the rows at ``a_ptr`` are the
        normed product's operand ``round(x * (offset + w))`` and ``ps_ptr`` their 16-column
        subtree sums of squares (G a row, ``partials_rstd``); 2 (BN = 16, no NORM) the
        stored tile also handed to the next normed product: times its norm weight at
        ``g_ptr`` into ``y_ptr`` (row stride ``stride_om``), its subtree into ``ps_ptr``.
        ``STAGES``: ``_tile_products``'."""
        rm, rn = tile_rows_cols(pid, M, N, BM, BN, GROUP_M)
        row_ok = rm < M
        out_ok = row_ok[:, None] & (rn[None, :] < N)
        a_rows = a_ptr + rm.to(tl.int64)[:, None] * stride_am
        if RESIDUAL and EARLY:
            r = _load_tile(res_ptr, rm, rn, stride_rm, out_ok, ACT_CACHE)
        if DEFER == 2:  # the next norm's weight, asked for before the product
            tl.static_assert(BN == 16 and not NORM)
            gw = tl.load(g_ptr + rn, mask=rn < N, other=0.0)
        rstd = _tile_rstd(
            a_rows, ps_ptr, rm, row_ok, K, G, eps, NORM, DEFER, BM, CH, UNROLL, GP, ACT_CACHE
        )
        if GATED and ONE_DOT:
            _, pid_n = tile_ids(pid, M, N, BM, BN, GROUP_M)
            j = tl.arange(0, 2 * BN)
            rn_w = pid_n * BN + j % BN  # the gate columns, then the same up columns
            w_rows = w_ptr + (rn_w + (j // BN) * UP).to(tl.int64)[:, None] * stride_wn
            u_rows = w_rows
        else:
            rn_w = rn
            w_rows = w_ptr + rn.to(tl.int64)[:, None] * stride_wn
            u_rows = w_ptr + (rn + UP).to(tl.int64)[:, None] * stride_wn  # GATED: up rows
        WN: tl.constexpr = 2 * BN if GATED and ONE_DOT else BN  # the weight tile's rows
        if GATED and ONE_DOT:
            acc2, _ = _tile_products(
                a_rows,
                w_rows,
                w_rows,
                row_ok,
                rn_w,
                N,
                K,
                nw_ptr,
                offset,
                NORM,
                False,
                BM,
                WN,
                BK,
                ACT_CACHE,
                STAGES,
            )
            acc, acc_u = tl.split(tl.permute(tl.reshape(acc2, [BM, 2, BN]), (0, 2, 1)))
        else:
            acc, acc_u = _tile_products(
                a_rows,
                w_rows,
                u_rows,
                row_ok,
                rn,
                N,
                K,
                nw_ptr,
                offset,
                NORM,
                GATED,
                BM,
                BN,
                BK,
                ACT_CACHE,
                STAGES,
            )
        if NORM or DEFER == 1:  # the norm's 1 / rms, before the bias and every rounding
            acc = acc * rstd[:, None]
            acc_u = acc_u * rstd[:, None]
        if HAS_BIAS:
            acc += tl.load(bias_ptr + rn, mask=rn < N, other=0.0).to(tl.float32)[None, :]
        if RESIDUAL:  # round as linear's output, then torch's half add: fp32 add, round
            if not EARLY:
                r = _load_tile(res_ptr, rm, rn, stride_rm, out_ok, ACT_CACHE)
            acc = _round(acc, ROUND) + r.to(tl.float32)
        if GATED:  # F.silu(gate) * up on the rounded gate and up, each op rounded; rows
            # past M (never stored) get a gate of 1: their 0 / 2 took the IEEE division's
            # slow path (a called subroutine) in every warp of a thin tile
            g = tl.where(row_ok[:, None], _round(acc, ROUND), 1.0)
            acc = _round(_silu(g), ROUND) * _round(acc_u, ROUND)
        out = acc.to(o_ptr.dtype.element_ty)
        tl.store(o_ptr + rm.to(tl.int64)[:, None] * stride_om + rn[None, :], out, mask=out_ok)
        if DEFER == 2:
            _, pid_n = tile_ids(pid, M, N, BM, BN, GROUP_M)
            norm_partials(
                out.to(tl.float32),
                y_ptr,
                gw,
                ps_ptr,
                rm,
                rn,
                row_ok,
                out_ok,
                pid_n,
                G,
                stride_om,
                offset,
            )

    @triton.jit(do_not_specialize=["M"])  # as _fused_gemm_kernel's M
    def _qkv_rope_kernel(
        a_ptr,
        w_ptr,
        bias_ptr,
        nw_ptr,
        qo_ptr,
        kc_ptr,
        vc_ptr,
        cos_ptr,
        sin_ptr,
        pos_ptr,
        slot_ptr,
        M,
        K,
        stride_am,
        stride_wn,
        eps,
        offset,
        HQ: tl.constexpr,
        HKV: tl.constexpr,
        D: tl.constexpr,
        NORM: tl.constexpr,
        HAS_BIAS: tl.constexpr,
        ROUND: tl.constexpr,
        BM: tl.constexpr,
        BN: tl.constexpr,
        BK: tl.constexpr,
        GROUP_M: tl.constexpr,
        CH: tl.constexpr,
        UNROLL: tl.constexpr,
        PDL: tl.constexpr,
    ):
        """A tile of ``qkv_rope_tile`` a program."""
        wait_only(PDL)
        launch_next(PDL)
        qkv_rope_tile(
            tl.program_id(0),
            a_ptr,
            w_ptr,
            bias_ptr,
            nw_ptr,
            qo_ptr,
            kc_ptr,
            vc_ptr,
            cos_ptr,
            sin_ptr,
            pos_ptr,
            slot_ptr,
            M,
            K,
            stride_am,
            stride_wn,
            eps,
            offset,
            HQ,
            HKV,
            D,
            NORM,
            HAS_BIAS,
            ROUND,
            BM,
            BN,
            BK,
            GROUP_M,
            CH,
            UNROLL,
            "",
        )

    @triton.jit
    def qkv_rope_tile(
        pid,
        a_ptr,
        w_ptr,
        bias_ptr,
        nw_ptr,
        qo_ptr,
        kc_ptr,
        vc_ptr,
        cos_ptr,
        sin_ptr,
        pos_ptr,
        slot_ptr,
        M,
        K,
        stride_am,
        stride_wn,
        eps,
        offset,
        HQ: tl.constexpr,
        HKV: tl.constexpr,
        D: tl.constexpr,
        NORM: tl.constexpr,
        HAS_BIAS: tl.constexpr,
        ROUND: tl.constexpr,
        BM: tl.constexpr,
        BN: tl.constexpr,
        BK: tl.constexpr,
        GROUP_M: tl.constexpr,
        CH: tl.constexpr,
        UNROLL: tl.constexpr,
        ACT_CACHE: tl.constexpr,
        EARLY: tl.constexpr = False,
        DEFER: tl.constexpr = 0,
        ps_ptr=None,
        G=1,
        GP: tl.constexpr = 64,
        STAGES: tl.constexpr = 0,
        PRE_ROWS: tl.constexpr = False,
        pre_pos=0,
        pre_slot=0,
    ):
        """Tile ``pid`` of the QKV product (with the RMSNorm prologue when NORM) and, in its
        epilogue, the rope of its q and k columns and the cache write of k and v: a q or k
        tile holds dims ``i .. i + BN/2 - 1`` of one head's first half and the same of its
        second (the rotation's pairs), a v tile ``BN`` columns in order. The kernel above,
        or one phase of a persistent kernel (``ACT_CACHE=".cg"``: the activations, written
        by other programs of the launch, read from L2). ``EARLY``: the cache slots asked
        for before the product, not after it. ``DEFER`` 1: ``fused_tile``'s (rows handed
        over already multiplied by the norm weight, 1 / rms from their subtree sums at
        ``ps_ptr``); ``STAGES``: ``_tile_products``'. ``PRE_ROWS`` (a tile of the first BM
        rows, speed only): the rows' positions and cache slots already loaded (``pre_pos``,
        ``pre_slot``; a persistent kernel loads them once a launch), so the rope's cos/sin
        loads wait on nothing."""
        Q: tl.constexpr = HQ * D
        KV: tl.constexpr = HKV * D
        HB: tl.constexpr = BN // 2
        HALF: tl.constexpr = D // 2
        pid_m, pid_n = tile_ids(pid, M, Q + 2 * KV, BM, BN, GROUP_M)
        rm = pid_m * BM + tl.arange(0, BM)
        row_ok = rm < M
        c0 = pid_n * BN  # the tile's first column of the product: q, k, v heads in order
        head = c0 // D
        roped = c0 < Q + KV
        i0 = (c0 % D) // BN * HB
        i = i0 + tl.arange(0, HB)  # a rotated tile's first-half dims
        j = tl.arange(0, BN)
        rn = tl.where(
            roped, head * D + (j // HB) * HALF + i0 + j % HB, c0 + j
        )  # the weight rows (product columns) of the tile
        if PRE_ROWS:
            pos = pre_pos.to(tl.int64)
        else:
            pos = tl.load(pos_ptr + rm, mask=row_ok, other=0).to(tl.int64)
        c1, s1, c2, s2 = rope_rows(cos_ptr + i0, sin_ptr + i0, pos[:, None], HALF, HB, ROUND)
        a_rows = a_ptr + rm.to(tl.int64)[:, None] * stride_am
        w_rows = w_ptr + rn.to(tl.int64)[:, None] * stride_wn
        if PRE_ROWS:
            slot = pre_slot.to(tl.int64)
        elif EARLY:
            slot = tl.load(slot_ptr + rm, mask=row_ok, other=-1).to(tl.int64)
        rstd = _tile_rstd(
            a_rows, ps_ptr, rm, row_ok, K, G, eps, NORM, DEFER, BM, CH, UNROLL, GP, ACT_CACHE
        )
        acc, _ = _tile_products(
            a_rows,
            w_rows,
            w_rows,
            row_ok,
            rn,
            Q + 2 * KV,
            K,
            nw_ptr,
            offset,
            NORM,
            False,
            BM,
            BN,
            BK,
            ACT_CACHE,
            STAGES,
        )
        if NORM or DEFER == 1:  # the norm's 1 / rms, before the bias and every rounding
            acc = acc * rstd[:, None]
        if not EARLY and not PRE_ROWS:
            slot = tl.load(slot_ptr + rm, mask=row_ok, other=-1).to(tl.int64)
        if HAS_BIAS:
            acc += tl.load(bias_ptr + rn).to(tl.float32)[None, :]
        y = _round(acc, ROUND)  # the product's value, as linear stores it
        cached = (row_ok & (slot >= 0))[:, None]  # a negative slot: padding, nothing written
        if roped:
            x1, x2 = tl.split(tl.permute(tl.reshape(y, [BM, 2, HB]), (0, 2, 1)))
            o1, o2 = _rotate_pair(x1, x2, c1, s1, c2, s2, ROUND)
            if c0 < Q:
                dst = qo_ptr + rm.to(tl.int64)[:, None] * Q + head * D + i[None, :]
                ok = row_ok[:, None]
            else:
                dst = kc_ptr + slot[:, None] * KV + (head - HQ) * D + i[None, :]
                ok = cached
            tl.store(dst, o1.to(qo_ptr.dtype.element_ty), mask=ok)
            tl.store(dst + HALF, o2.to(qo_ptr.dtype.element_ty), mask=ok)
        else:
            tl.store(
                vc_ptr + slot[:, None] * KV + (c0 - Q - KV) + j[None, :],
                y.to(vc_ptr.dtype.element_ty),
                mask=cached,
            )

    @triton.jit
    def _rotated_at(
        src, ok, c1, s1, c2, s2, HALF: tl.constexpr, ROUND: tl.constexpr, X_CACHE: tl.constexpr
    ):
        """Heads starting at the pointers ``src`` (R, 1) (rows where ``ok`` (R, 1)) rotated
        by the cos/sin halves (R or 1, HALF), rounding as torch does -> the two halves
        (R, HALF) as fp32 holding activation-dtype values. Elementwise, so a head's bits do
        not depend on which rows share the tile."""
        i = tl.arange(0, HALF)[None, :]
        f1 = tl.load(src + i, mask=ok, other=0.0, cache_modifier=X_CACHE).to(tl.float32)
        f2 = tl.load(src + HALF + i, mask=ok, other=0.0, cache_modifier=X_CACHE).to(tl.float32)
        return _rotate_pair(f1, f2, c1, s1, c2, s2, ROUND)

    @triton.jit
    def _rotate_pair(f1, f2, c1, s1, c2, s2, ROUND: tl.constexpr):
        """The halves (fp32 holding activation-dtype values) rotated as torch does:
        ``x * cos + cat(-x2, x1) * sin``, each op rounded to the activation dtype."""
        o1 = _round(_round(f1 * c1, ROUND) + _round(-f2 * s1, ROUND), ROUND)
        o2 = _round(_round(f2 * c2, ROUND) + _round(f1 * s2, ROUND), ROUND)
        return o1, o2

    @triton.jit
    def _rotated(
        x_ptr,
        H,
        c1,
        s1,
        c2,
        s2,
        HALF: tl.constexpr,
        BLOCK_H: tl.constexpr,
        ROUND: tl.constexpr,
        X_CACHE: tl.constexpr,
    ):
        """H heads at x_ptr (head stride 2*HALF) rotated (``_rotated_at``)."""
        h = tl.arange(0, BLOCK_H)[:, None]
        return _rotated_at(x_ptr + h * 2 * HALF, h < H, c1, s1, c2, s2, HALF, ROUND, X_CACHE)

    @triton.jit
    def store_halves_at(dst, o1, o2, ok, HALF: tl.constexpr):
        """Store (R, HALF) halves as heads starting at the pointers ``dst`` (R, 1)."""
        i = tl.arange(0, HALF)[None, :]
        tl.store(dst + i, o1.to(dst.dtype.element_ty), mask=ok)
        tl.store(dst + HALF + i, o2.to(dst.dtype.element_ty), mask=ok)

    @triton.jit
    def _store_halves(o_ptr, o1, o2, H, HALF: tl.constexpr, BLOCK_H: tl.constexpr):
        """Store (BLOCK_H, HALF) halves as H heads at o_ptr (head stride 2*HALF)."""
        h = tl.arange(0, BLOCK_H)[:, None]
        store_halves_at(o_ptr + h * 2 * HALF, o1, o2, h < H, HALF)

    @triton.jit
    def _rotate_heads(
        x_ptr,
        o_ptr,
        H,
        c1,
        s1,
        c2,
        s2,
        HALF: tl.constexpr,
        BLOCK_H: tl.constexpr,
        ROUND: tl.constexpr,
        X_CACHE: tl.constexpr,
    ):
        """Rotate H heads at x_ptr into o_ptr (same layout), rounding as torch does
        (``X_CACHE``: the load's cache modifier, ".cg" in a persistent kernel)."""
        o1, o2 = _rotated(x_ptr, H, c1, s1, c2, s2, HALF, BLOCK_H, ROUND, X_CACHE)
        _store_halves(o_ptr, o1, o2, H, HALF, BLOCK_H)

    @triton.jit
    def _rotate_quantize_heads(
        x_ptr,
        o_ptr,
        scale_ptr,
        H,
        c1,
        s1,
        c2,
        s2,
        HALF: tl.constexpr,
        BLOCK_H: tl.constexpr,
        ROUND: tl.constexpr,
    ):
        """``_rotate_heads`` into an e4m3 cache: each rotated head (rounded as torch rounds
        it) is quantised with ``_quantize_store``'s arithmetic (per-head max|x| / 448,
        IEEE divisions, clamp, round to nearest even), so the bytes equal rotate + write."""
        o1, o2 = _rotated(x_ptr, H, c1, s1, c2, s2, HALF, BLOCK_H, ROUND, "")
        amax = tl.maximum(tl.max(tl.abs(o1), 1), tl.max(tl.abs(o2), 1))  # (BLOCK_H,)
        scale = tl.math.div_rn(amax, tl.full([BLOCK_H], 448.0, tl.float32))
        safe = tl.broadcast_to(tl.where(scale > 0.0, scale, 1.0)[:, None], [BLOCK_H, HALF])
        y1 = tl.minimum(tl.maximum(tl.math.div_rn(o1, safe), -448.0), 448.0)
        y2 = tl.minimum(tl.maximum(tl.math.div_rn(o2, safe), -448.0), 448.0)
        _store_halves(o_ptr, y1, y2, H, HALF, BLOCK_H)
        h = tl.arange(0, BLOCK_H)
        tl.store(scale_ptr + h, scale, mask=h < H)

    @triton.jit
    def rope_rows(
        cos_ptr, sin_ptr, pos, HALF: tl.constexpr, LANES: tl.constexpr, ROUND: tl.constexpr
    ):
        """cos and sin halves (R, LANES) of the token positions ``pos`` (R, 1), rounded to
        the activation dtype: dims 0 .. LANES - 1 of each half after the pointers (the table
        repeats its frequencies, but both halves are read as the reference does)."""
        i = tl.arange(0, LANES)[None, :]
        table = pos.to(tl.int64) * 2 * HALF
        c1 = _round(tl.load(cos_ptr + table + i), ROUND)
        s1 = _round(tl.load(sin_ptr + table + i), ROUND)
        c2 = _round(tl.load(cos_ptr + table + HALF + i), ROUND)
        s2 = _round(tl.load(sin_ptr + table + HALF + i), ROUND)
        return c1, s1, c2, s2

    @triton.jit
    def rope_row(cos_ptr, sin_ptr, pos_ptr, HALF: tl.constexpr, ROUND: tl.constexpr):
        """``rope_rows`` (1, HALF) of the one token position at ``pos_ptr``."""
        pos = tl.load(pos_ptr + tl.zeros([1, 1], tl.int32))
        return rope_rows(cos_ptr, sin_ptr, pos, HALF, HALF, ROUND)

    @triton.jit
    def _rope_write_kv_kernel(
        q_ptr,
        k_ptr,
        v_ptr,
        qo_ptr,
        kc_ptr,
        vc_ptr,
        ks_ptr,
        vs_ptr,
        cos_ptr,
        sin_ptr,
        pos_ptr,
        slot_ptr,
        HQ,
        HKV: tl.constexpr,
        stride_qn,
        stride_kn,
        stride_vn,
        HALF: tl.constexpr,
        BLOCK_HQ: tl.constexpr,
        BLOCK_HKV: tl.constexpr,
        ROUND: tl.constexpr,
        FP8: tl.constexpr,
        PDL: tl.constexpr,
    ):
        wait_previous(PDL)
        n = tl.program_id(0).to(tl.int64)
        c1, s1, c2, s2 = rope_row(cos_ptr, sin_ptr, pos_ptr + n, HALF, ROUND)
        _rotate_heads(
            q_ptr + n * stride_qn,
            qo_ptr + n * HQ * 2 * HALF,
            HQ,
            c1,
            s1,
            c2,
            s2,
            HALF,
            BLOCK_HQ,
            ROUND,
            "",
        )
        slot = tl.load(slot_ptr + n).to(tl.int64)
        if slot >= 0:  # negative: a padding token, nothing written
            row = slot * HKV * 2 * HALF
            if FP8:  # e4m3 cache: per-token, per-head scales at slot * HKV
                _rotate_quantize_heads(
                    k_ptr + n * stride_kn,
                    kc_ptr + row,
                    ks_ptr + slot * HKV,
                    HKV,
                    c1,
                    s1,
                    c2,
                    s2,
                    HALF,
                    BLOCK_HKV,
                    ROUND,
                )
                _quantize_store(
                    v_ptr + n * stride_vn,
                    vc_ptr + row,
                    vs_ptr + slot * HKV,
                    tl.arange(0, BLOCK_HKV),
                    tl.arange(0, 2 * HALF),
                    HKV,
                    2 * HALF,
                    BLOCK_HKV,
                    2 * HALF,
                )
            else:
                _rotate_heads(
                    k_ptr + n * stride_kn,
                    kc_ptr + row,
                    HKV,
                    c1,
                    s1,
                    c2,
                    s2,
                    HALF,
                    BLOCK_HKV,
                    ROUND,
                    "",
                )
                h = tl.arange(0, BLOCK_HKV)[:, None]
                d = tl.arange(0, 2 * HALF)[None, :]
                ok = h < HKV
                tl.store(
                    vc_ptr + row + h * 2 * HALF + d,
                    tl.load(v_ptr + n * stride_vn + h * 2 * HALF + d, mask=ok),
                    mask=ok,
                )


def _gemm(
    x: torch.Tensor,
    weight: torch.Tensor,
    n: int,
    cfg: TileConfig | None,
    *,
    norm: tuple[torch.Tensor, float, float] | None = None,
    bias: torch.Tensor | None = None,
    residual: torch.Tensor | None = None,
    gated: bool = False,
    late: bool = False,
) -> torch.Tensor:
    """The one launcher: x (..., K) against ``weight`` (rows 0..n-1, and n.. when gated);
    ``late``: the PDL trigger after each program's tile (``triton_pdl``), the same bits."""
    k = x.shape[-1]
    a = x.reshape(-1, k)  # (M, K)
    if a.stride(-1) != 1:
        a = a.contiguous()
    assert weight.stride(-1) == 1 and weight.shape[1] == k
    m = a.shape[0]
    out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    if not m:
        return out.view(*x.shape[:-1], n)
    if cfg is None:
        if norm is not None:
            cfg = fused_config(m, n, gated)
        elif residual is not None:
            cfg = residual_config(m, n, k, x.device)
        else:
            cfg = pick_config(m, n)
    res = out
    if residual is not None:
        res = residual.reshape(m, n)
        assert res.stride(-1) == 1 and res.dtype == x.dtype
    assert norm is None or k <= NORM_MAX_K, k  # the norm tree's counter levels
    nw, eps, offset = norm if norm is not None else (out, 0.0, 0.0)
    tiles = triton.cdiv(m, cfg.bm) * triton.cdiv(n, cfg.bn)
    _fused_gemm_kernel[(tiles,)](
        a,
        weight,
        out,
        bias if bias is not None else out,
        res,
        nw,
        m,
        n,
        k,
        n,
        a.stride(0),
        weight.stride(0),
        out.stride(0),
        res.stride(0),
        eps,
        offset,
        NORM=norm is not None,
        HAS_BIAS=bias is not None,
        RESIDUAL=residual is not None,
        GATED=gated,
        ROUND=_round_mode(x.dtype),
        BM=cfg.bm,
        BN=cfg.bn,
        BK=cfg.bk,
        GROUP_M=8,
        CH=NORM_CHUNK,
        UNROLL=norm_unroll(cfg.bm),
        num_warps=cfg.warps,
        num_stages=cfg.stages,
        **gemm_pdl_args(a, late),
    )
    return out.view(*x.shape[:-1], n)


def norm_linear(
    x: torch.Tensor,
    norm_weight: torch.Tensor,
    eps: float,
    offset: float,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    config: TileConfig | None = None,
) -> torch.Tensor:
    """``linear(rms_norm(x, norm_weight, eps, offset), weight, bias)`` in one launch.

    x: (..., K), weight: (N, K) -> (..., N). ``config``: tile shape (tests; bits do not move).
    """
    return _gemm(x, weight, weight.shape[0], config, norm=(norm_weight, eps, offset), bias=bias)


def linear_residual(
    x: torch.Tensor,
    weight: torch.Tensor,
    residual: torch.Tensor,
    config: TileConfig | None = None,
    late: bool = False,
) -> torch.Tensor:
    """``residual + linear(x, weight)`` in one launch; x (..., K), residual (..., N).
    ``late``: the PDL trigger after the tile (``_gemm``)."""
    return _gemm(x, weight, weight.shape[0], config, residual=residual, late=late)


def norm_gate_up_silu(
    x: torch.Tensor,
    norm_weight: torch.Tensor,
    eps: float,
    offset: float,
    gate_up: torch.Tensor,
    config: TileConfig | None = None,
) -> torch.Tensor:
    """``silu(gate) * up`` of ``linear(rms_norm(x), gate_up)`` split in halves, one launch.

    x: (..., K), gate_up: (2 * inter, K) (gate rows first) -> (..., inter).
    """
    assert gate_up.shape[0] % 2 == 0
    return _gemm(
        x, gate_up, gate_up.shape[0] // 2, config, norm=(norm_weight, eps, offset), gated=True
    )


# The gated epilogue's thin tile for a wide model's gate_up (widths 16,384 to
# ``MLP_MAX_WIDTH``, steps of <= 16 rows): 32 gate and 32 up columns a program over K steps
# of 256, 4 warps, 3 stages: the only tile measured faster than the plain GEMM +
# ``silu_mul`` (docs/performance.md). Speed only: the bits are the GEMM + ``silu_mul``'s.
GATED_THIN = TileConfig(16, 32, 256, 4, 3)


def thin_gated_config(m: int, width: int) -> TileConfig | None:
    """The tile ``gate_up_silu`` takes a step of ``m`` rows with, for a gate_up ``width``
    (gate and up rows) the gated epilogue was measured faster at; else None (the plain
    GEMM, then ``silu_mul``)."""
    from mmserve.kernels.triton_matmul import MLP_MAX_WIDTH

    if m <= 16 and 16384 <= width <= MLP_MAX_WIDTH and not overridden(m):
        return GATED_THIN
    return None


def gate_up_silu(
    x: torch.Tensor, gate_up: torch.Tensor, config: TileConfig | None = None, late: bool = False
) -> torch.Tensor:
    """``silu(gate) * up`` of ``linear(x, gate_up)`` split in halves, in one launch: the
    gated epilogue without the norm prologue, so the bits of the plain GEMM followed by
    ``silu_mul`` (tests). x: (..., K) already normed -> (..., inter).

    The model's path for thin steps of a wide model (``thin_gated_config``).
    """
    assert gate_up.shape[0] % 2 == 0
    return _gemm(x, gate_up, gate_up.shape[0] // 2, config, gated=True, late=late)


SILU_BLOCK = 1024  # columns a program: 14 programs a row at the Llama-3-8B shape's 14,336


def silu_mul(x: torch.Tensor, block: int = SILU_BLOCK) -> torch.Tensor:
    """``F.silu(gate) * up`` where ``gate, up = x.split(inter, -1)``, in one launch.

    x: (..., 2 * inter) half precision -> (..., inter): the gated epilogue's arithmetic
    (silu in fp32 with torch's expf and division, rounded; the product rounded once), so
    the bits of torch's two kernels, and a PDL launch in the step's chain where theirs
    are not.
    """
    two = x.shape[-1]
    assert two % 2 == 0
    inter = two // 2
    x2 = x.reshape(-1, two)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    out = torch.empty(x2.shape[0], inter, dtype=x.dtype, device=x.device)
    if x2.shape[0] and inter:
        _silu_mul_kernel[(x2.shape[0], triton.cdiv(inter, block))](
            x2,
            out,
            inter,
            x2.stride(0),
            out.stride(0),
            ROUND=_round_mode(x.dtype),
            BLOCK=block,
            num_warps=4,
            **pdl_args(x2),
        )
    return out.view(*x.shape[:-1], inter)


def qkv_rope(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    norm: tuple[torch.Tensor, float, float] | None,
    heads: int,
    kv_heads: int,
    positions: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    config: TileConfig | None = None,
) -> torch.Tensor:
    """``rope_write_kv`` of the q, k, v columns of ``linear(x, weight, bias)`` (of
    ``norm_linear`` with ``norm`` = (weight, eps, offset)) in one launch -> rotated q
    (M, heads, D); k rotated and v stored at their slots of the bf16 caches (blocks, bs,
    Hkv, D) (a negative slot: nothing written). The same bits as the product, then
    ``rope_write_kv``. ``config``: the tile (tests; the bits do not depend on it)."""
    k = x.shape[-1]
    a = x.reshape(-1, k)
    if a.stride(-1) != 1:
        a = a.contiguous()
    d = k_cache.shape[-1]
    n = (heads + 2 * kv_heads) * d
    assert weight.shape == (n, k) and weight.stride(-1) == 1
    assert k_cache.is_contiguous() and v_cache.is_contiguous() and cos.is_contiguous()
    assert sin.is_contiguous() and k_cache.shape[-2] == kv_heads and d % 2 == 0
    m = a.shape[0]
    out = torch.empty(m, heads, d, dtype=x.dtype, device=x.device)
    if not m:
        return out
    cfg = config or (fused_config(m, n, False) if norm is not None else pick_config(m, n))
    bn = cfg.bn  # halved until it divides D: a rotated tile holds pairs of one head's dims
    while bn > 16 and d % bn:
        bn //= 2
    assert d % bn == 0, (bn, d)
    assert norm is None or k <= NORM_MAX_K, k  # the norm tree's counter levels
    nw, eps, offset = norm if norm is not None else (out, 0.0, 0.0)
    tiles = triton.cdiv(m, cfg.bm) * (n // bn)
    _qkv_rope_kernel[(tiles,)](
        a,
        weight,
        bias if bias is not None else out,
        nw,
        out,
        k_cache,
        v_cache,
        cos,
        sin,
        positions,
        slot_mapping,
        m,
        k,
        a.stride(0),
        weight.stride(0),
        eps,
        offset,
        HQ=heads,
        HKV=kv_heads,
        D=d,
        NORM=norm is not None,
        HAS_BIAS=bias is not None,
        ROUND=_round_mode(x.dtype),
        BM=cfg.bm,
        BN=bn,
        BK=cfg.bk,
        GROUP_M=8,
        CH=NORM_CHUNK,
        UNROLL=norm_unroll(cfg.bm),
        num_warps=cfg.warps,
        num_stages=cfg.stages,
        **pdl_args(a),
    )
    return out


def rope_write_kv(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    positions: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """Rotate q (N, Hq, D) and k (N, Hkv, D) at ``positions``; store rotated k and v at their
    slots of the caches (blocks, bs, Hkv, D) (negative slot: skipped); -> rotated q.

    q/k/v may be strided views of the QKV product (token stride free, heads packed).
    cos/sin: (P, D) float32 tables. With ``k_scale``/``v_scale`` (blocks, bs, Hkv) float32
    the caches are e4m3, written as ``cuda_write_kv`` quantises (the same bytes).
    """
    n, hq, d = q.shape
    hkv = k.shape[1]
    for t in (q, k, v):
        assert t.stride(-1) == 1 and t.stride(1) == d, "heads must be packed within a token"
    assert cos.is_contiguous() and sin.is_contiguous() and d % 2 == 0
    assert k_cache.is_contiguous() and v_cache.is_contiguous() and k_cache.shape[-1] == d
    fp8 = k_scale is not None
    if k_scale is not None:
        assert v_scale is not None and k_scale.is_contiguous() and v_scale.is_contiguous()
        assert d & (d - 1) == 0, "the fp8 write loads a head as one power-of-two tile"
    out = torch.empty(n, hq, d, dtype=q.dtype, device=q.device)
    if n:
        _rope_write_kv_kernel[(n,)](
            q,
            k,
            v,
            out,
            k_cache,
            v_cache,
            k_scale if fp8 else k_cache,
            v_scale if fp8 else v_cache,
            cos,
            sin,
            positions,
            slot_mapping,
            hq,
            hkv,
            q.stride(0),
            k.stride(0),
            v.stride(0),
            HALF=d // 2,
            BLOCK_HQ=triton.next_power_of_2(hq),
            BLOCK_HKV=triton.next_power_of_2(hkv),
            ROUND=_round_mode(q.dtype),
            FP8=fp8,
            num_warps=4,
            **pdl_args(q),
        )
    return out
