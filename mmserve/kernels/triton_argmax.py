"""Row-wise argmax on CUDA in Triton: torch's answer, in two short PDL launches.

Reference: ``torch.argmax(x, dim=-1)``: the first index of a row's maximum, and a NaN
counts above every number (the first NaN's index). A CUDA graph's step ends with its
logits rows' argmax (greedy tokens without a launch from the host); torch's kernel
reduces a row in one block, tens of microseconds for a vocabulary-wide row, outside the
PDL chain (docs/performance.md).

Here pass 1 splits each row into ``BLOCK``-wide chunks, one program each, and stores a
chunk's maximum, its first index and whether it holds a NaN; pass 2 (one program a row)
takes the first NaN chunk's index, else the lowest index of the largest chunk maximum.
Both passes pick the *lowest index* among equal values with ``min``, not a layout's
order, so ties resolve as torch's do. Index only: no value is computed.
"""

from __future__ import annotations

import torch

from mmserve.kernels.triton_pdl import pdl_args

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - CPU-only installs
    triton = None

BLOCK = 2048  # a chunk per program: 24 programs a row at 49,152, 63 at 128,256

if triton is not None:
    from mmserve.kernels.triton_pdl import wait_previous

    @triton.jit
    def _chunk_kernel(
        x_ptr, val_ptr, idx_ptr, nan_ptr, V, stride_x, S, BLOCK: tl.constexpr, PDL: tl.constexpr
    ):
        wait_previous(PDL)
        row = tl.program_id(0).to(tl.int64)
        chunk = tl.program_id(1)
        offs = chunk * BLOCK + tl.arange(0, BLOCK)
        ok = offs < V
        x = tl.load(x_ptr + row * stride_x + offs, mask=ok, other=float("-inf")).to(tl.float32)
        big = 2147483647
        nan = (x != x) & ok
        first_nan = tl.min(tl.where(nan, offs, big), 0)
        x = tl.where(nan, float("-inf"), x)
        top = tl.max(x, 0)
        first_top = tl.min(tl.where((x == top) & ok, offs, big), 0)
        out = row * S + chunk
        tl.store(val_ptr + out, top)
        tl.store(idx_ptr + out, tl.where(first_nan < big, first_nan, first_top))
        tl.store(nan_ptr + out, (first_nan < big).to(tl.int32))

    @triton.jit
    def _rows_kernel(val_ptr, idx_ptr, nan_ptr, o_ptr, S, BLOCK_S: tl.constexpr, PDL: tl.constexpr):
        wait_previous(PDL)
        row = tl.program_id(0).to(tl.int64)
        s = tl.arange(0, BLOCK_S)
        ok = s < S
        val = tl.load(val_ptr + row * S + s, mask=ok, other=float("-inf"))
        idx = tl.load(idx_ptr + row * S + s, mask=ok, other=0)
        nan = tl.load(nan_ptr + row * S + s, mask=ok, other=0) != 0
        big = 2147483647
        first_nan = tl.min(tl.where(nan, idx, big), 0)
        top = tl.max(tl.where(nan, float("-inf"), val), 0)
        first_top = tl.min(tl.where((val == top) & ok & ~nan, idx, big), 0)
        tl.store(o_ptr + row, tl.where(first_nan < big, first_nan, first_top).to(tl.int64))


def cuda_argmax(x: torch.Tensor, block: int = BLOCK) -> torch.Tensor:
    """(..., V) float -> (...) int64: ``x.argmax(-1)``'s indices."""
    v = x.shape[-1]
    assert 0 < v < 2**31 - 1
    x2 = x.reshape(-1, v)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    rows = x2.shape[0]
    out = torch.empty(rows, dtype=torch.int64, device=x.device)
    if rows:
        s = triton.cdiv(v, block)
        val = torch.empty(rows, s, dtype=torch.float32, device=x.device)
        idx = torch.empty(rows, s, dtype=torch.int32, device=x.device)
        nan = torch.empty(rows, s, dtype=torch.int32, device=x.device)
        _chunk_kernel[(rows, s)](
            x2, val, idx, nan, v, x2.stride(0), s, BLOCK=block, num_warps=4, **pdl_args(x2)
        )
        _rows_kernel[(rows,)](
            val, idx, nan, out, s, BLOCK_S=triton.next_power_of_2(s), num_warps=1, **pdl_args(x2)
        )
    return out.view(x.shape[:-1])
