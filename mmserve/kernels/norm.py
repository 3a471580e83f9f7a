"""RMSNorm, row-wise (so batch-invariant: each row reduces over its own hidden dim)."""

from __future__ import annotations

import torch

from mmserve.kernels.triton_dispatch import use_triton


def rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, offset: float = 0.0
) -> torch.Tensor:
    """``x / rms(x) * (offset + weight)``; Gemma uses ``offset=1``. Computed in float32."""
    if use_triton(x):  # CUDA: one Triton launch, same float32 math
        from mmserve.kernels.triton_norm import cuda_rms_norm

        return cuda_rms_norm(x, weight, eps, offset)
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (xf * (offset + weight.float())).to(x.dtype)
