"""Rotary embedding on CUDA in Triton: one launch, the same bits as ``RotaryTable.apply``.

Reference: :meth:`mmserve.kernels.rope.RotaryTable.apply`, which takes ~9 kernels
(two gathers, two casts, negate, concatenate, two products, a sum) per call. For
bfloat16 inputs this kernel rounds exactly where torch does (``cos``/``sin`` to
bf16, each product, the sum), so the result is bit-identical and swapping it in
changes no output. The roundings are done on the bits (round to nearest even), so
no compiler rewrite (FMA contraction, folding a narrow-and-widen pair) can remove
one (``.to(bf16).to(f32)`` can be folded away: 1 ulp off on the GPU).
Other dtypes are not handled: callers keep the reference there.
"""

from __future__ import annotations

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - CPU-only installs
    triton = None

if triton is not None:

    @triton.jit
    def round_bf16(f):
        """Round fp32 to the nearest bf16 (ties to even), kept as fp32; finite inputs."""
        u = f.to(tl.uint32, bitcast=True)
        u = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000
        return u.to(tl.float32, bitcast=True)

    @triton.jit
    def _rope_kernel(
        x_ptr,
        o_ptr,
        cos_ptr,
        sin_ptr,
        pos_ptr,
        H,
        stride_xn,
        stride_xh,
        HALF: tl.constexpr,
        BLOCK_H: tl.constexpr,
    ):
        n = tl.program_id(0)
        pos = tl.load(pos_ptr + n).to(tl.int64)
        h = tl.arange(0, BLOCK_H)
        i = tl.arange(0, HALF)
        ok = (h < H)[:, None]
        base = x_ptr + n * stride_xn + h[:, None] * stride_xh
        x1 = tl.load(base + i[None, :], mask=ok, other=0.0)  # (BH, HALF) first half
        x2 = tl.load(base + HALF + i[None, :], mask=ok, other=0.0)
        # the table repeats its frequencies, but read both halves as the reference does
        c1 = round_bf16(tl.load(cos_ptr + pos * 2 * HALF + i))[None, :]
        s1 = round_bf16(tl.load(sin_ptr + pos * 2 * HALF + i))[None, :]
        c2 = round_bf16(tl.load(cos_ptr + pos * 2 * HALF + HALF + i))[None, :]
        s2 = round_bf16(tl.load(sin_ptr + pos * 2 * HALF + HALF + i))[None, :]
        f1, f2 = x1.to(tl.float32), x2.to(tl.float32)
        # torch: x * cos + cat(-x2, x1) * sin, each op rounded to bf16
        o1 = round_bf16(round_bf16(f1 * c1) + round_bf16(-f2 * s1))
        o2 = round_bf16(round_bf16(f2 * c2) + round_bf16(f1 * s2))
        out = o_ptr + n * H * 2 * HALF + h[:, None] * 2 * HALF
        tl.store(out + i[None, :], o1.to(tl.bfloat16), mask=ok)
        tl.store(out + HALF + i[None, :], o2.to(tl.bfloat16), mask=ok)


def cuda_rope(
    x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor
) -> torch.Tensor:
    """x: (N, H, D) bfloat16; cos/sin: (P, D) float32 tables -> rotated (N, H, D)."""
    n, h, d = x.shape
    assert x.dtype == torch.bfloat16 and x.stride(-1) == 1
    assert cos.is_contiguous() and sin.is_contiguous() and d % 2 == 0
    out = torch.empty(n, h, d, dtype=x.dtype, device=x.device)
    if n:
        _rope_kernel[(n,)](
            x,
            out,
            cos,
            sin,
            positions,
            h,
            x.stride(0),
            x.stride(1),
            HALF=d // 2,
            BLOCK_H=triton.next_power_of_2(h),
            num_warps=4,
        )
    return out
