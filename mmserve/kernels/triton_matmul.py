"""Batch-invariant ``x @ W.T (+ bias)`` on CUDA in Triton.

Reference: ``torch.nn.functional.linear`` (tests compare on random inputs).

Why: cuBLAS chooses its kernel (and split-K) by the row count, so a row's bits
change with the batch (``benchmarks/invariance.py``; figures in docs/performance.md).
Here every output element is one chain of tensor-core k16 steps over K in
ascending order, accumulated in fp32, then the bias, then one rounding: no
split-K, whatever M is.

The tile shape grows with M (thin tiles that stream weights at batch 1, big ones
for prefill). That changes which rows and columns share a program, never an
element's arithmetic: measured bit-identical across every tile shape tried, from
16x16 (mma.sync) to 128x256 (wgmma), by benchmarks/invariance.py and
tests/kernels/test_triton_matmul.py.
"""

from __future__ import annotations

import os
from typing import NamedTuple

import torch

from mmserve.kernels.q8 import BLOCK, Q8Weight
from mmserve.kernels.settings import current
from mmserve.kernels.triton_pdl import gemm_pdl_args

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - CPU-only installs
    triton = None


class TileConfig(NamedTuple):
    bm: int
    bn: int
    bk: int
    warps: int
    stages: int


BUCKETS = (16, 64, 256, 1 << 62)  # pick_config's row-count buckets (upper bounds)


def _overrides() -> dict[int, TileConfig]:
    """Row-count bucket -> tile shape, from ``KernelConfig.tiles`` (benchmarks, tuning;
    bits do not move)."""
    table = current().tiles
    assert all(b in BUCKETS for b, _ in table), f"buckets are {BUCKETS}"
    return {b: TileConfig(*c) for b, c in table}


# Widths up to this (a wide model's gate_up, not a vocabulary) take 16x64 thin tiles, the
# fastest measured there; a vocabulary-wide head is slower with them (docs/performance.md).
MLP_MAX_WIDTH = 32768


def overridden(m: int) -> bool:
    """Whether ``KernelConfig.tiles`` sets the tile of ``m`` rows' bucket."""
    return bool(current().tiles) and next(b for b in BUCKETS if m <= b) in _overrides()


# A vocabulary-wide GEMM over a narrow hidden size (K below this: SmolLM2-135M's lm_head,
# K = 576, N = 49,152) takes 128 columns a program in K steps of 64, which divide K (the
# wide default's 256-wide K steps would run the third step's products mostly on zeros).
NARROW_K = 1024


def pick_config(m: int, n: int, k: int | None = None) -> TileConfig:
    """Tile shape by row count, width and (when given) K (speed only: every shape computes
    the same bits).

    An H200 sweep of ``benchmarks/invariance.py`` chose these.
    """
    bucket = next(b for b in BUCKETS if m <= b)
    if current().tiles:
        override = _overrides().get(bucket)
        if override is not None:
            return override
    wide = n >= 16384  # gate_up, lm_head: enough column tiles for wider ones
    if m <= 16:  # weight streaming: many thin programs keep every SM loading
        if wide and n <= MLP_MAX_WIDTH:
            return TileConfig(16, 64, 256, 4, 3)
        if wide and k is not None and k < NARROW_K:
            return TileConfig(16, 128, 64, 4, 5)
        return TileConfig(16, 32, 256, 4, 4) if wide else TileConfig(16, 16, 256, 2, 4)
    if m <= 64:
        return TileConfig(64, 64, 128, 4, 3) if wide else TileConfig(64, 32, 128, 4, 4)
    if m <= 256:
        return TileConfig(128, 64, 64, 8, 4) if wide else TileConfig(64, 64, 128, 4, 4)
    return TileConfig(256, 128, 64, 8, 3)


if triton is not None:
    from mmserve.kernels.triton_pdl import launch_next, wait_only

    @triton.jit
    def tile_ids(pid, M, N, BM: tl.constexpr, BN: tl.constexpr, GROUP_M: tl.constexpr):
        """Program ``pid``'s (row tile, column tile); row-tile groups of ``GROUP_M`` walk
        the columns together so they share weight tiles in L2."""
        grid_m = tl.cdiv(M, BM)
        grid_n = tl.cdiv(N, BN)
        group = pid // (GROUP_M * grid_n)
        first_m = group * GROUP_M
        size_m = tl.minimum(grid_m - first_m, GROUP_M)
        pid_m = first_m + (pid % (GROUP_M * grid_n)) % size_m
        pid_n = (pid % (GROUP_M * grid_n)) // size_m
        return pid_m, pid_n

    @triton.jit
    def tile_rows_cols(pid, M, N, BM: tl.constexpr, BN: tl.constexpr, GROUP_M: tl.constexpr):
        """Program ``pid``'s output rows and columns (``tile_ids``)."""
        pid_m, pid_n = tile_ids(pid, M, N, BM, BN, GROUP_M)
        return pid_m * BM + tl.arange(0, BM), pid_n * BN + tl.arange(0, BN)

    # M (a step's rows) is not specialised on divisibility by 16: a variant for each
    # (tile config, M % 16 == 0) pair would compile at the first step that reaches it,
    # which the start-up warm-up cannot cover for every row count.
    @triton.jit(do_not_specialize=["M"])
    def _gemm_kernel(
        a_ptr,
        w_ptr,
        o_ptr,
        bias_ptr,
        M,
        N,
        K,
        stride_am,
        stride_wn,
        stride_om,
        HAS_BIAS: tl.constexpr,
        BM: tl.constexpr,
        BN: tl.constexpr,
        BK: tl.constexpr,
        GROUP_M: tl.constexpr,
        UPCAST: tl.constexpr,
        PDL: tl.constexpr,
        LATE: tl.constexpr,
    ):
        rm, rn = tile_rows_cols(tl.program_id(0), M, N, BM, BN, GROUP_M)
        rk = tl.arange(0, BK)
        a_rows = a_ptr + rm.to(tl.int64)[:, None] * stride_am
        w_rows = w_ptr + rn.to(tl.int64)[:, None] * stride_wn
        wait_only(PDL)
        if not LATE:  # else the next kernel launches after the K loop
            launch_next(PDL)
        acc = tl.zeros([BM, BN], dtype=tl.float32)
        for k in range(0, K, BK):
            kk = k + rk
            a = tl.load(a_rows + kk[None, :], mask=(rm[:, None] < M) & (kk[None, :] < K), other=0.0)
            w = tl.load(w_rows + kk[None, :], mask=(rn[:, None] < N) & (kk[None, :] < K), other=0.0)
            acc = tl.dot(a, tl.trans(w), acc)
        if LATE:
            launch_next(PDL)
        if HAS_BIAS:
            acc += tl.load(bias_ptr + rn, mask=rn < N, other=0.0).to(tl.float32)[None, :]
        if UPCAST:  # rounded to the input's dtype, stored wider: ``linear(...).float()``
            acc = acc.to(a_ptr.dtype.element_ty)
        tl.store(
            o_ptr + rm.to(tl.int64)[:, None] * stride_om + rn[None, :],
            acc.to(o_ptr.dtype.element_ty),
            mask=(rm[:, None] < M) & (rn[None, :] < N),
        )

    @triton.jit
    def _q8_dequant(q, d, dtype: tl.constexpr, FMA: tl.constexpr):
        """``d * q`` (q int8 (BN, QB), d float32 (BN,)) rounded to ``dtype``: exact in
        float32, then rounded once (nearest even), as ``Q8Weight.dequantize``. Without the
        conversion unit (I2F runs at a quarter of the FP32 rate on sm_90, and the head
        converts every weight): the bits 0x4B400000 + q are the float32 f = 3 * 2^22 + q
        exactly (|q| < 2^22 keeps f in [2^23, 2^24), where floats step by 1), and
        ``FMA``: one fma(f, d, -d * 3 * 2^22) a weight, which is d * q before its one
        rounding (d * 3 * 2^22 is exact: 11 + 2 significant bits; so the exact sum is
        d * q, which float32 holds: 11 + 7 bits); else (the interpreter, whose fma rounds
        the product first) (f - 3 * 2^22) * d.

        The result passes an identity asm with a side effect (compiled, not interpreted):
        Triton sizes a dot operand's registers by the narrowest load it can trace the
        operand back to, and from the int8 load it picks kWidth 4, which on sm_90's
        mma.sync sends k 2-3 of every 4 to the block's second k16 product: other k16 sums
        than the bf16 GEMM's, other bits. The asm stops that trace: kWidth 2, the bf16
        GEMM's groups (and fewer instructions a K step)."""
        f = (q.to(tl.int32) + 0x4B400000).to(tl.float32, bitcast=True)
        if FMA:
            w = tl.fma(f, d[:, None], (d * -12582912.0)[:, None])
        else:
            w = (f - 12582912.0) * d[:, None]
        w = w.to(dtype, fp_downcast_rounding="rtne")
        if FMA:  # 32 bits a register: two halves, or one float32
            w = tl.inline_asm_elementwise(
                "mov.b32 $0, $1;",
                "=r,r",
                [w],
                dtype=w.dtype,
                is_pure=False,
                pack=32 // w.dtype.primitive_bitwidth,
            )
        return w

    @triton.jit(do_not_specialize=["M"])  # as _gemm_kernel's M
    def _gemm_q8_kernel(
        a_ptr,
        q_ptr,
        s_ptr,
        o_ptr,
        M,
        N,
        K,
        stride_am,
        stride_om,
        BM: tl.constexpr,
        BN: tl.constexpr,
        QB: tl.constexpr,
        GROUP_M: tl.constexpr,
        UPCAST: tl.constexpr,
        PDL: tl.constexpr,
        LATE: tl.constexpr,
        FMA: tl.constexpr,
    ):
        """``_gemm_kernel`` over a ``q8.Q8Weight`` (q (K / QB, N, QB) int8, s (K / QB, N)
        float32 holding fp16 values): a K step a block, its weights ``d * q`` in float32
        (exact) rounded to a's dtype (nearest even) before the product, so the product's
        operands, and its chain of k16 steps, are those of ``_gemm_kernel`` on the
        dequantized weight."""
        rm, rn = tile_rows_cols(tl.program_id(0), M, N, BM, BN, GROUP_M)
        rk = tl.arange(0, QB)
        a_rows = a_ptr + rm.to(tl.int64)[:, None] * stride_am
        q_tile = q_ptr + rn.to(tl.int64)[:, None] * QB + rk[None, :]  # block 0's
        s_cols = s_ptr + rn
        wait_only(PDL)
        if not LATE:
            launch_next(PDL)
        acc = tl.zeros([BM, BN], dtype=tl.float32)
        for k in range(0, K, QB):  # block k / QB: its (N, QB) bytes start at k * N
            kn = tl.cast(k, tl.int64) * N
            a = tl.load(a_rows + (k + rk)[None, :], mask=rm[:, None] < M, other=0.0)
            q = tl.load(q_tile + kn, mask=rn[:, None] < N, other=0)
            s = tl.load(s_cols + kn // QB, mask=rn < N, other=0.0)
            w = _q8_dequant(q, s.to(tl.float32), a_ptr.dtype.element_ty, FMA)
            acc = tl.dot(a, tl.trans(w), acc)
        if LATE:
            launch_next(PDL)
        if UPCAST:
            acc = acc.to(a_ptr.dtype.element_ty)
        tl.store(
            o_ptr + rm.to(tl.int64)[:, None] * stride_om + rn[None, :],
            acc.to(o_ptr.dtype.element_ty),
            mask=(rm[:, None] < M) & (rn[None, :] < N),
        )


def _rows_and_out(x: torch.Tensor, n: int, float_out: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """x (..., K) as (M, K) rows with unit column stride, and the (M, n) output (float32 with
    ``float_out``, else x's dtype)."""
    a = x.reshape(-1, x.shape[-1])
    if a.stride(-1) != 1:
        a = a.contiguous()
    out = torch.empty(a.shape[0], n, dtype=torch.float32 if float_out else x.dtype, device=x.device)
    return a, out


def invariant_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    config: TileConfig | None = None,
    float_out: bool = False,
    late: bool = False,
) -> torch.Tensor:
    """x: (..., K), weight: (N, K) -> (..., N); a row's bits do not depend on the row count.

    ``config`` overrides the tile shape (tests and benchmarks: the bits must not move).
    ``float_out``: the result rounded to x's dtype as always, stored as float32: the bits
    of ``invariant_linear(x, weight).float()`` without the cast's launch (logits).
    ``late``: under PDL the next kernel launches after the K loop, not at the start
    (``triton_pdl``); the same bits.
    """
    k = x.shape[-1]
    n = weight.shape[0]
    assert weight.stride(-1) == 1 and weight.shape[1] == k
    a, out = _rows_and_out(x, n, float_out)
    m = a.shape[0]
    if m:
        cfg = config or pick_config(m, n, k)
        tiles = triton.cdiv(m, cfg.bm) * triton.cdiv(n, cfg.bn)
        _gemm_kernel[(tiles,)](
            a,
            weight,
            out,
            bias if bias is not None else out,
            m,
            n,
            k,
            a.stride(0),
            weight.stride(0),
            out.stride(0),
            HAS_BIAS=bias is not None,
            BM=cfg.bm,
            BN=cfg.bn,
            BK=cfg.bk,
            GROUP_M=8,
            UPCAST=float_out and x.dtype != torch.float32,
            num_warps=cfg.warps,
            num_stages=cfg.stages,
            **gemm_pdl_args(a, late),
        )
    return out.view(*x.shape[:-1], n)


def _interpreting() -> bool:
    """Whether Triton runs kernels in its interpreter (whose fma rounds the product first)."""
    knobs = getattr(triton, "knobs", None)
    if knobs is not None:
        return bool(knobs.runtime.interpret)
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on")


# The Q8_0 LM head's tile at batch 1 (speed only: every tile has the same bits; a K step per
# 32-weight block), by how many programs the narrow tile would run a SM. A head of few
# programs (SmolLM2-135M's 49,152 x 576: 384 at 16x128 on 132 SMs) is bound by its
# programs' ramp and K chain, not the HBM, and the wider tile is faster; a head of many
# (Gemma-3-270M's 262,144 x 640) streams near the HBM's rate and the wider tile is slower
# (H100 figures: docs/performance.md).
Q8_TILE_FEW = TileConfig(16, 256, 32, 4, 6)
Q8_TILE_MANY = TileConfig(16, 128, 32, 4, 8)
Q8_FEW_PER_SM = 4  # at most this many Q8_TILE_MANY programs a SM: Q8_TILE_FEW
CPU_SMS = 132  # the interpreter's CPU tensors: an H100's count


def q8_tile(n: int, device: torch.device) -> TileConfig:
    """The Q8_0 head's tile for ``n`` output columns on ``device`` (``KernelConfig.q8_tile``:
    one tile for every head, for benchmarks)."""
    fixed = current().q8_tile
    if fixed is not None:
        return TileConfig(*fixed)
    sms = (
        torch.cuda.get_device_properties(device).multi_processor_count
        if device.type == "cuda"
        else CPU_SMS
    )
    few = -(-n // Q8_TILE_MANY.bn) <= Q8_FEW_PER_SM * sms
    return Q8_TILE_FEW if few else Q8_TILE_MANY


# The most rows the Q8_0 head takes: above, the half-precision weight's GEMM (the same bits)
# keeps its tiles for prefill's many rows.
Q8_MAX_ROWS = 16


def q8_linear(
    x: torch.Tensor,
    weight: Q8Weight,
    config: TileConfig | None = None,
    float_out: bool = False,
    late: bool = False,
) -> torch.Tensor:
    """``invariant_linear(x, weight.dequantize(x.dtype))`` from a ``q8.Q8Weight``: the same
    bits, reading 1.125 bytes a weight instead of 2. ``config``: the tile (its ``bk`` must
    be the block, 32)."""
    n, k = weight.shape
    assert x.shape[-1] == k and weight.q.is_contiguous() and weight.scale.is_contiguous()
    a, out = _rows_and_out(x, n, float_out)
    m = a.shape[0]
    if m:
        cfg = config or q8_tile(n, x.device)
        assert cfg.bk == BLOCK and cfg.bn * BLOCK % 128 == 0
        tiles = triton.cdiv(m, cfg.bm) * triton.cdiv(n, cfg.bn)
        _gemm_q8_kernel[(tiles,)](
            a,
            weight.q,
            weight.scale,
            out,
            m,
            n,
            k,
            a.stride(0),
            out.stride(0),
            BM=cfg.bm,
            BN=cfg.bn,
            QB=BLOCK,
            GROUP_M=8,
            UPCAST=float_out and x.dtype != torch.float32,
            FMA=not _interpreting(),
            num_warps=cfg.warps,
            num_stages=cfg.stages,
            **gemm_pdl_args(a, late),
        )
    return out.view(*x.shape[:-1], n)
