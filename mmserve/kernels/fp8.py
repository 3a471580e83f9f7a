"""fp8 (e4m3) KV-cache quantisation: per-token, per-kv-head dynamic scales (plain torch).

Each new key (or value) vector ``x`` of one token and one kv head, ``(D,)``, is stored as
``round_e4m3(x / s)`` with ``s = max|x| / 448`` (448 is e4m3's largest finite value), and
``s`` is kept beside it in float32. The scale comes from the vector itself, so no
calibration data is needed, and a token's stored bits depend only on that token: the
cache stays batch-invariant. A zero vector stores ``s = 0`` and zeros, and reads back as
exact zeros.

The arithmetic is fixed so that the Triton writer (``triton_attention._write_kv_fp8``)
produces the same bits: float32 throughout, correctly rounded divisions, a clamp to
``[-448, 448]``, then round-to-nearest-even into e4m3.
"""

from __future__ import annotations

import torch

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = 448.0  # torch.finfo(torch.float8_e4m3fn).max


def is_fp8(dtype: torch.dtype) -> bool:
    """True for the fp8 dtype the KV cache supports (e4m3fn)."""
    return dtype == FP8_DTYPE


def quantize_fp8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x (N, Hkv, D) -> (e4m3 values (N, Hkv, D), float32 scales (N, Hkv))."""
    xf = x.float()
    scale = xf.abs().amax(dim=-1) / FP8_MAX  # (N, Hkv)
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))  # zero vector: stores zeros
    values = (xf / safe[..., None]).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    return values, scale


def dequantize_fp8(values: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """e4m3 values (..., D) and float32 scales (...) -> (..., D) in ``dtype``."""
    return (values.float() * scale[..., None]).to(dtype)
