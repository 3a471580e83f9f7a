"""A grammar's token bitmask on logits rows in Triton: one launch instead of torch's six.

Reference: ``mmserve.structured.bitmask.apply_bitmask``'s torch path (bit ``t % 32`` of
word ``t // 32`` clear -> logit ``t`` set to -inf, in place). The sampler masks the
constrained rows of every step on the host's critical path, where each eager torch op
costs its dispatch and launch (tens of microseconds a step for the shift, the and, the
cast, the inversion and the masked fill); this is one launch. A program covers
``BLOCK`` tokens of one row and writes only its disallowed tokens (no read of the
logits). Row-wise and elementwise: batch invariant.
"""

from __future__ import annotations

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - CPU-only installs
    triton = None

BLOCK = 4096  # tokens a program: 12 programs a row at 49,152

if triton is not None:

    @triton.jit
    def _mask_kernel(x_ptr, m_ptr, V, stride_x, stride_m, BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        ok = offs < V
        words = tl.load(m_ptr + row * stride_m + offs // 32, mask=ok, other=-1)
        banned = ((words >> (offs % 32)) & 1) == 0
        tl.store(x_ptr + row * stride_x + offs, float("-inf"), mask=ok & banned)


def cuda_apply_bitmask(logits: torch.Tensor, bitmask: torch.Tensor) -> torch.Tensor:
    """``logits`` (R, V) float, unit stride along V; ``bitmask`` (R, W) int32 on its
    device, W >= ceil(V / 32). Disallowed tokens set to -inf in place; returns logits."""
    rows, vocab = logits.shape
    assert logits.stride(-1) == 1 and bitmask.dtype == torch.int32
    assert bitmask.shape[0] == rows and bitmask.shape[1] * 32 >= vocab
    if bitmask.stride(-1) != 1:
        bitmask = bitmask.contiguous()
    if rows and vocab:
        grid = (rows, triton.cdiv(vocab, BLOCK))
        _mask_kernel[grid](logits, bitmask, vocab, logits.stride(0), bitmask.stride(0), BLOCK=BLOCK)
    return logits
