"""Fused decoder-layer ops: fewer kernel launches per layer on CUDA, the same ops elsewhere.

A batch-1 decode step of a small model is launch-bound (~14 kernels a layer of a few
microseconds each). These four ops cut a Llama layer to six launches:
``norm_linear`` (RMSNorm + QKV product), ``rope_write_kv``, attention, ``linear_residual``
(o product + residual), ``norm_gate_up_silu`` (RMSNorm + gate/up product + silu * up),
``linear_residual`` (down product + residual). Where the norm is not fused (hidden above
``FUSE_MAX_HIDDEN``), ``silu_mul`` is silu * up in one launch after the gate/up product.
``qkv_rope`` takes one more launch out: the QKV product ropes q and k and writes the
cache in its epilogue (bf16 cache, no q/k norm), in place of ``norm_linear`` (or the
product after the norm) and ``rope_write_kv`` (docs/performance.md).

Each op hands its call to :mod:`mmserve.kernels.triton_fused` when the tensors live on
CUDA with Triton (``use_triton``), fusion is on, and the dtype is bf16/fp16; the GEMM
fusions also need batch-invariant mode (they are the invariant Triton GEMM). Otherwise
each composes the plain functions exactly as the models did before fusion, so the CPU
path (compared token for token against HF transformers) is bit-for-bit unchanged.

``KernelConfig.fused`` off (``MMSERVE_FUSED=0``) sends every call to the unfused
composition: benchmarks compare the two in one run (``settings.override``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from mmserve.kernels.attention import LayerKV, write_kv
from mmserve.kernels.linear import batch_invariant, linear
from mmserve.kernels.norm import rms_norm
from mmserve.kernels.rope import RotaryTable
from mmserve.kernels.settings import current
from mmserve.kernels.triton_dispatch import use_triton

HALF = (torch.bfloat16, torch.float16)


def fused_enabled() -> bool:
    """Whether the fused kernels may run (``KernelConfig.fused``)."""
    return current().fused


# The RMSNorm-prologue GEMMs pay where a step is launch-bound (small hidden sizes) and
# cost where it is bandwidth- or compute-bound (their tiles are narrowed, and each
# program reads its rows twice): a win at SmolLM2-135M's hidden 576, a loss at the
# Llama-3-8B shape's 4096 (docs/performance.md). The choice is per model, never per
# batch: the fused norm's bits are its own.
FUSE_MAX_HIDDEN = 2048
# Above it the gated epilogue alone (norm kernel, then gate_up with silu * up fused) is
# no faster than the plain GEMM + F.silu + the product, so the composition stays there,
# with silu * up in one launch of its own (``silu_mul``), except for thin steps at the
# gated tile measured faster in the whole step (``triton_fused.thin_gated_config``).


def _fused_gemm(x: torch.Tensor, hidden: int | None) -> bool:
    """Whether the Triton fused GEMM runs; ``hidden`` None: no norm prologue (the residual
    epilogue keeps the plain GEMM's tiles and bits, so it is used at every size)."""
    return (
        fused_enabled()
        and (hidden is None or hidden <= FUSE_MAX_HIDDEN)
        and batch_invariant()
        and x.dtype in HALF
        and use_triton(x)
    )


def norm_linear(
    x: torch.Tensor,
    norm_weight: torch.Tensor,
    eps: float,
    offset: float,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """``linear(rms_norm(x, norm_weight, eps, offset), weight, bias)``; x (M, K) -> (M, N)."""
    if _fused_gemm(x, x.shape[-1]):
        from mmserve.kernels import triton_fused

        return triton_fused.norm_linear(x, norm_weight, eps, offset, weight, bias)
    return linear(rms_norm(x, norm_weight, eps, offset), weight, bias)


def linear_residual(x: torch.Tensor, weight: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
    """``residual + linear(x, weight)``, the same bits fused or not; x (M, K) -> (M, N)."""
    if _fused_gemm(x, None):
        from mmserve.kernels import triton_fused

        return triton_fused.linear_residual(x, weight, residual)
    return residual + linear(x, weight)


def norm_gate_up_silu(
    x: torch.Tensor, norm_weight: torch.Tensor, eps: float, offset: float, gate_up: torch.Tensor
) -> torch.Tensor:
    """``silu(gate) * up`` where ``gate, up`` = halves of ``linear(rms_norm(x), gate_up)``.

    x: (M, K), gate_up: (2 * inter, K), gate rows first -> (M, inter).
    """
    if _fused_gemm(x, x.shape[-1]):
        from mmserve.kernels import triton_fused

        return triton_fused.norm_gate_up_silu(x, norm_weight, eps, offset, gate_up)
    h = rms_norm(x, norm_weight, eps, offset)
    if _fused_gemm(h, None):  # thin steps of a wide model: silu * up in the epilogue
        from mmserve.kernels import triton_fused

        cfg = triton_fused.thin_gated_config(h.numel() // h.shape[-1], gate_up.shape[0])
        if cfg is not None:
            return triton_fused.gate_up_silu(h, gate_up, config=cfg)
    return silu_mul(linear(h, gate_up))


def silu_mul(x: torch.Tensor) -> torch.Tensor:
    """``F.silu(gate) * up`` of ``gate, up = x.split(inter, -1)``; x (..., 2 * inter).

    On CUDA one Triton launch with torch's bits (a PDL launch: the Llama-3-8B shape's
    composition above ran torch's silu and product as two launches outside the chain).
    """
    if fused_enabled() and x.dtype in HALF and use_triton(x):
        from mmserve.kernels import triton_fused

        return triton_fused.silu_mul(x)
    gate, up = x.split(x.shape[-1] // 2, dim=-1)
    return F.silu(gate) * up


def qkv_rope(
    x: torch.Tensor,
    norm_weight: torch.Tensor,
    eps: float,
    offset: float,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    heads: int,
    kv_heads: int,
    positions: torch.Tensor,
    rope: RotaryTable,
    kv: LayerKV,
    slot_mapping: torch.Tensor,
) -> torch.Tensor | None:
    """``rope_write_kv`` of the q, k, v heads of ``norm_linear(x, ...)`` -> rotated q
    (N, Hq, D), with k and v in the cache; one launch (the product's epilogue ropes and
    writes), or None where it does not apply: ``KernelConfig.qkv_rope`` off, not CUDA bf16
    in invariant mode with a bf16 cache, or the head dim not a multiple of 16.
    The norm is the product's prologue where ``norm_linear`` fuses it, else its own
    launch before."""
    if not (
        current().qkv_rope
        and x.dtype == torch.bfloat16
        and _fused_gemm(x, None)
        and kv.k.dtype == x.dtype
        and kv.k_scale is None
        and kv.k.shape[-1] % 16 == 0
        and kv.k.is_contiguous()
        and kv.v.is_contiguous()
    ):
        return None
    from mmserve.kernels import triton_fused

    if _fused_gemm(x, x.shape[-1]):  # as norm_linear: the norm in the product's prologue
        norm = (norm_weight, eps, offset)
    else:
        x, norm = rms_norm(x, norm_weight, eps, offset), None
    return triton_fused.qkv_rope(
        x,
        weight,
        bias,
        norm,
        heads,
        kv_heads,
        positions,
        rope.cos,
        rope.sin,
        kv.k,
        kv.v,
        slot_mapping,
    )


def rope_write_kv(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    positions: torch.Tensor,
    rope: RotaryTable,
    kv: LayerKV,
    slot_mapping: torch.Tensor,
) -> torch.Tensor:
    """Rotate q (N, Hq, D) and k (N, Hkv, D), store k and v in the paged cache -> rotated q.

    One launch for bf16 on CUDA with the bits of ``rope.rotate`` + ``write_kv`` (so it does
    not need batch-invariant mode), into a bf16 cache or an fp8 one (``kv.k_scale``: the
    rotated k and v quantised as ``write_kv`` does, the same bytes and scales).
    """
    fp8 = kv.k_scale is not None
    if (
        fused_enabled()
        and q.dtype == torch.bfloat16
        and use_triton(q)
        and (kv.k.dtype == q.dtype or fp8)
    ):
        from mmserve.kernels import triton_fused

        return triton_fused.rope_write_kv(
            q, k, v, positions, rope.cos, rope.sin, kv.k, kv.v, slot_mapping, kv.k_scale, kv.v_scale
        )
    q, k = rope.rotate(q, positions), rope.rotate(k, positions)
    write_kv(kv, k, v, slot_mapping)
    return q
