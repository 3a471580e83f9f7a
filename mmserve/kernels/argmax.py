"""A row's argmax over the last dim: ``x.argmax(-1)`` (first index of the maximum, NaN above all).

On CUDA with Triton two PDL launches (:mod:`mmserve.kernels.triton_argmax`), the same
indices (tests); elsewhere torch's own.
"""

from __future__ import annotations

import torch

from mmserve.kernels.triton_dispatch import use_triton

# the kernel compares in float32: wider floats could tie there, integers have no -inf
_FLOATS = (torch.float32, torch.bfloat16, torch.float16)


def argmax(x: torch.Tensor) -> torch.Tensor:
    """(..., V) -> (...) int64."""
    if x.dtype in _FLOATS and use_triton(x) and x.shape[-1] > 0:
        from mmserve.kernels.triton_argmax import cuda_argmax

        return cuda_argmax(x)
    return x.argmax(-1)
