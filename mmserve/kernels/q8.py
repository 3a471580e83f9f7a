"""A weight matrix held as int8 blocks with a half-precision scale each (GGUF's Q8_0), read
by the LM head at the bits of its half-precision copy.

Why: at batch 1 the LM head is the one bandwidth-bound piece of a small model's step
(SmolLM2-135M: 56.6 MB of bf16 a token, while the decode stack beside it is
latency-bound; docs/performance.md). Both shipped GGUFs store the token embedding (their tied LM
head) as Q8_0: 32 int8 values and one fp16 scale a block, 1.0625 bytes a weight, so the
same product can read 31.8 MB instead (the scales held as float32).

Bits. A Q8_0 weight dequantizes to ``d * q`` (fp16 d, int8 q), which float32 holds
exactly (11 + 7 significant bits); the model's half-precision weight is that value rounded
once (round to nearest even). The kernel (``triton_matmul.q8_linear``) computes the same
float32 product and the same rounding per element before the product's tensor-core
chain, so its operands, and with the GEMM's fixed order its output, are those of
``invariant_linear`` on the half-precision weight. ``factor_q8`` finds the blocks from the
float32 weight and accepts them only if every element is reproduced exactly, and
``Q8Weight.matches`` checks the device copy against the model's weight bit for bit, so a
weight that is not Q8_0 (a bf16 checkpoint, a K-quant) is never read this way.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

BLOCK = 32  # weights a scale (Q8_0's block, along K)


class Q8Weight(NamedTuple):
    """An (N, K) matrix as ``q`` (K / BLOCK, N, BLOCK) int8 and ``scale`` (K / BLOCK, N)
    float32 (fp16 values, held wider: a 2-byte scale a thread cannot be copied
    asynchronously, and the kernel's pipeline then waited on each block's scales;
    compiled for sm_90, a plain load and a shared-memory round trip in every K step):
    block-major, so a tile of a program's columns over one block is one contiguous run of
    bytes, and its scales one contiguous vector. A block whose scale is 0 has q = 0 (the
    kernel's fma gives +0 there whatever q is)."""

    q: torch.Tensor
    scale: torch.Tensor

    @property
    def shape(self) -> tuple[int, int]:
        return self.scale.shape[1], self.scale.shape[0] * BLOCK

    def to(self, device: torch.device | str) -> Q8Weight:
        if self.q.device == torch.device(device) and self.scale.device == self.q.device:
            return self
        return Q8Weight(self.q.to(device), self.scale.to(device))

    def dequantize(self, dtype: torch.dtype) -> torch.Tensor:
        """(N, K) in ``dtype``: each ``d * q`` in float32 (exact), rounded once."""
        w = self.q.float() * self.scale.float()[:, :, None]  # (K / B, N, B)
        return w.permute(1, 0, 2).reshape(self.shape).to(dtype)

    def matches(self, weight: torch.Tensor, rows: int = 8192) -> bool:
        """Whether the blocks dequantize to ``weight`` (its dtype) bit for bit (``rows`` rows
        compared at a time)."""
        if tuple(weight.shape) != self.shape:
            return False
        for r in range(0, self.shape[0], rows):
            part = Q8Weight(self.q[:, r : r + rows], self.scale[:, r : r + rows])
            if not torch.equal(_bits(part.dequantize(weight.dtype)), _bits(weight[r : r + rows])):
                return False
        return True


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view({1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


def factor_q8(weight: torch.Tensor, rows: int = 8192) -> Q8Weight | None:
    """``weight`` (N, K) float32 as Q8_0 blocks, if it is exactly some: each block of
    ``BLOCK`` along K is ``d * q`` with d an fp16 value and q integers in [-127, 127]
    (llama.cpp's Q8_0 sets d = amax / 127, so the largest |q| is 127 and d = amax / 127
    exactly). None when any element is not reproduced exactly. Worked ``rows`` rows at a
    time (a vocabulary's float32 intermediates stay small; the first rows that fail end
    it)."""
    if weight.dim() != 2 or weight.dtype != torch.float32 or weight.shape[1] % BLOCK:
        return None
    n, k = weight.shape
    qs, ds = [], []
    for r in range(0, n, rows):
        b = weight[r : r + rows].detach().reshape(-1, k // BLOCK, BLOCK)
        d = b.abs().amax(-1) / 127
        if not bool(torch.isfinite(d).all()) or not torch.equal(d.half().float(), d):
            return None
        q = torch.where(d[..., None] > 0, b / torch.where(d > 0, d, 1.0)[..., None], 0.0)
        if not torch.equal(q.round(), q):
            return None
        q = q.to(torch.int8)  # rebuilt as the kernel will: a -0.0 in the weight fails here
        if not torch.equal(_bits(q.float() * d[..., None]), _bits(b)):
            return None
        qs.append(q)
        ds.append(d)
    return Q8Weight(torch.cat(qs).permute(1, 0, 2).contiguous(), torch.cat(ds).t().contiguous())


def quantize_q8(weight: torch.Tensor) -> Q8Weight:
    """(N, K) float -> Q8_0 blocks as llama.cpp's ``quantize_row_q8_0`` makes them (d the
    block's amax / 127 stored as fp16, q = round(x * 127 / amax)): test weights and
    benchmark shapes with the shipped GGUFs' LM-head storage."""
    n, k = weight.shape
    b = weight.detach().float().reshape(n, k // BLOCK, BLOCK)
    amax = b.abs().amax(-1)
    inv = torch.where(amax > 0, 127 / torch.where(amax > 0, amax, 1.0), 0.0)
    q = (b * inv[..., None]).round().clamp(-127, 127)
    d = (amax / 127).half().float()
    q = torch.where(d[..., None] > 0, q, 0.0)  # an amax under fp16's range: a zero block
    return Q8Weight(q.to(torch.int8).permute(1, 0, 2).contiguous(), d.t().contiguous())
