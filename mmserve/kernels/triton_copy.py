"""A decode step's small copies between pinned host memory and the device, as one short
Triton kernel each instead of DMA copies.

Around each batch-1 graph replay the engine moved a few hundred bytes with four copies: the
step's inputs from the pinned host buffer, the last step's tokens into the input ids, the
argmax out of the graph's buffer (a clone) and the tokens to the host. Each DMA copy is
short, but the stream stands idle several times as long around each (the copy engine's
hand-offs with the SMs; docs/performance.md). A kernel reads and writes pinned host memory
directly (it is mapped into the device's address space), so the same bytes move on the SMs,
in the stream's order, with no hand-off.

``copy_flat(dst, src, head, head_out)``: ``dst[:] = src`` with its first ``len(head)``
elements taken from ``head`` instead (the input ids of a step whose tokens are still on
the device), and ``head`` also into ``head_out`` (those tokens to the host: the last
step's copy out and the next step's copy in as one launch); either side may be pinned
host memory. Without Triton (CPU, or Triton switched off) or with
``KernelConfig.copy_kernel`` off (``MMSERVE_COPY_KERNEL=0``, for comparisons) the same
copies run as ``Tensor.copy_``.
"""

from __future__ import annotations

import torch

from mmserve.kernels.settings import current
from mmserve.kernels.triton_dispatch import use_triton

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - CPU-only installs
    triton = None

BLOCK = 1024  # elements a program
_counts = {"launches": 0}


def launches() -> int:
    """Kernel launches so far (the DMA fallback counts none)."""
    return _counts["launches"]


if triton is not None:

    @triton.jit(do_not_specialize=["n", "n_head"])
    def _copy_kernel(
        dst_ptr, src_ptr, head_ptr, out_ptr, n, n_head, BLOCK: tl.constexpr, OUT: tl.constexpr
    ):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        inside = offs < n
        head = offs < n_head
        hv = tl.load(head_ptr + offs, mask=head & inside)
        v = tl.where(head, hv, tl.load(src_ptr + offs, mask=inside & ~head))
        tl.store(dst_ptr + offs, v, mask=inside)
        if OUT:
            tl.store(out_ptr + offs, hv, mask=head & inside)


def copy_flat(
    dst: torch.Tensor,
    src: torch.Tensor,
    head: torch.Tensor | None = None,
    head_out: torch.Tensor | None = None,
) -> None:
    """``dst[:] = src``, then ``dst[:len(head)] = head`` and ``head_out[:] = head``, in the
    current stream's order (1-D, contiguous, one dtype; a host side must be pinned)."""
    n = dst.numel()
    assert src.numel() == n and dst.dim() == src.dim() == 1 and dst.dtype == src.dtype
    assert dst.is_contiguous() and src.is_contiguous()
    if head is not None:
        assert head.dim() == 1 and head.dtype == dst.dtype and head.numel() <= n
        assert head.is_contiguous()
    if head_out is not None:
        assert head is not None and head_out.shape == head.shape
        assert head_out.dtype == head.dtype and head_out.is_contiguous()
    extra = [t for t in (head, head_out) if t is not None]
    device_side = dst if dst.is_cuda else src
    kernel = (
        current().copy_kernel
        and triton is not None
        and use_triton(device_side)
        and all(t.is_cuda or t.is_pinned() for t in (dst, src, *extra))
    )
    if not kernel:
        dst.copy_(src, non_blocking=True)
        if head is not None:
            dst[: head.numel()].copy_(head, non_blocking=True)
            if head_out is not None:
                head_out.copy_(head, non_blocking=True)
        return
    if n == 0:
        return
    h = head if head is not None else src
    _counts["launches"] += 1
    with torch.cuda.device(device_side.device):
        _copy_kernel[(triton.cdiv(n, BLOCK),)](
            dst,
            src,
            h,
            head_out if head_out is not None else h,
            n,
            h.numel() if head is not None else 0,
            BLOCK=BLOCK,
            num_warps=4,
            OUT=head_out is not None,
        )
