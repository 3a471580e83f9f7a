"""Batch-invariant matrix multiplication.

A row's output of ``F.linear`` depends on how many rows are in the call: on CPU
torch one row takes a GEMV path and two or more rows a GEMM path, and GEMM
blocking can change with the row count. Every row-wise product in the model goes
through :func:`linear`, which in batch-invariant mode pads the rows to a fixed
tile and always multiplies tiles of exactly that shape, so a row's result is the
same whether it is alone, in a decode batch of 64, or one of k+1 verify rows.
(Measured on this CPU: identical rows across tile contents and tile positions.)
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from mmserve.kernels.settings import current
from mmserve.kernels.triton_dispatch import use_triton

ROW_TILE = 8  # rows per fixed-shape product; a verify step of k+1 <= 8 rows costs one tile

# The Q8_0 head's bits decide batch invariance (up to 16 rows read the blocks, more the
# bf16 weight), so they must be the bf16 GEMM's: on sm_90 they are (the GPU tests, and
# the default model's row 0 the same at batch 1 and 64). ``KernelConfig.q8_head`` off
# (``MMSERVE_Q8_HEAD=0``) reads the bf16 weight.


def batch_invariant() -> bool:
    """Whether products run on fixed tiles (``KernelConfig.batch_invariant``)."""
    return current().batch_invariant


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ weight.T + bias`` with row results independent of ``x.shape[0]``.

    x: (M, K), weight: (N, K) -> (M, N).
    """
    if x.device.type == "cuda":
        return cuda_linear(x, weight, bias)
    if not batch_invariant():
        return F.linear(x, weight, bias)
    return tiled_linear(x, weight, bias, ROW_TILE)


def cuda_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """Invariant mode, half precision: the fixed-reduction-tree Triton GEMM (cuBLAS picks its
    kernel by M, so a row's bits change with the batch: ``benchmarks/invariance.py``). Else
    cuBLAS."""
    if batch_invariant() and x.dtype in (torch.bfloat16, torch.float16) and use_triton(x):
        from mmserve.kernels.triton_matmul import invariant_linear

        return invariant_linear(x, weight, bias)
    return F.linear(x, weight, bias)


def logits_linear(x: torch.Tensor, weight: torch.Tensor, q8=None) -> torch.Tensor:
    """``linear(x, weight).float()``: the product in x's dtype, as float32 (the LM head).

    On CUDA's invariant path the GEMM stores its rounded result as float32 itself, the
    same bits without the cast's launch after it. ``q8``: ``weight`` as a ``q8.Q8Weight``
    (checked bit for bit against it when the model was placed); with
    ``KernelConfig.q8_head`` (the default), up to
    ``triton_matmul.Q8_MAX_ROWS`` rows the product reads it instead (the same bits, 1.125
    bytes a weight instead of 2)."""
    settings = current()
    if (
        x.device.type == "cuda"
        and settings.batch_invariant
        and x.dtype in (torch.bfloat16, torch.float16)
        and use_triton(x)
    ):
        from mmserve.kernels.triton_matmul import Q8_MAX_ROWS, invariant_linear, q8_linear

        if q8 is not None and settings.q8_head and x.numel() <= Q8_MAX_ROWS * x.shape[-1]:
            return q8_linear(x, q8, float_out=True)
        return invariant_linear(x, weight, float_out=True)
    return linear(x, weight).float()


def tiled_linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, tile: int
) -> torch.Tensor:
    m = x.shape[0]
    if m == tile:
        return F.linear(x, weight, bias)
    padded = -(-m // tile) * tile
    xp = x.new_zeros(padded, x.shape[1])
    xp[:m] = x
    out = torch.empty(padded, weight.shape[0], dtype=x.dtype, device=x.device)
    for start in range(0, padded, tile):
        torch.matmul(xp[start : start + tile], weight.t(), out=out[start : start + tile])
    if bias is not None:
        out += bias
    return out[:m]
