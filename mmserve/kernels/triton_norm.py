"""RMSNorm on CUDA in Triton: one program per row, the reference's float32 math.

Reference: :func:`mmserve.kernels.norm.rms_norm` (``x / rms(x) * (offset + w)`` in
float32). One launch instead of the reference's six elementwise/reduction kernels,
which is what matters for small models, where a decode step is launch-bound. A
row reduces over its own hidden dim only, in one fixed order: batch-invariant.
"""

from __future__ import annotations

import torch

from mmserve.kernels.triton_pdl import pdl_args

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - CPU-only installs
    triton = None

if triton is not None:
    from mmserve.kernels.triton_pdl import wait_previous

    @triton.jit
    def _rms_norm_kernel(
        x_ptr,
        w_ptr,
        o_ptr,
        stride_x,
        stride_o,
        H,
        eps,
        offset,
        BLOCK: tl.constexpr,
        PDL: tl.constexpr,
    ):
        wait_previous(PDL)
        row = tl.program_id(0).to(tl.int64)
        i = tl.arange(0, BLOCK)
        ok = i < H
        x = tl.load(x_ptr + row * stride_x + i, mask=ok, other=0.0).to(tl.float32)
        inv = tl.rsqrt(tl.sum(x * x, 0) / H + eps)
        w = tl.load(w_ptr + i, mask=ok, other=0.0).to(tl.float32)
        tl.store(
            o_ptr + row * stride_o + i, (x * inv * (offset + w)).to(o_ptr.dtype.element_ty), mask=ok
        )


def cuda_rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, offset: float = 0.0
) -> torch.Tensor:
    """(..., H) -> (..., H) in x's dtype."""
    h = x.shape[-1]
    x2 = x.reshape(-1, h)  # (R, H); a view whenever rows are evenly strided
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    out = torch.empty(x2.shape, dtype=x.dtype, device=x.device)
    if x2.shape[0]:
        block = triton.next_power_of_2(h)
        _rms_norm_kernel[(x2.shape[0],)](
            x2,
            weight,
            out,
            x2.stride(0),
            out.stride(0),
            h,
            eps,
            offset,
            BLOCK=block,
            num_warps=4 if block <= 2048 else 8,
            **pdl_args(x2),
        )
    return out.view(x.shape)
