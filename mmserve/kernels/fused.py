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

``set_fused_enabled(False)`` (or ``MMSERVE_FUSED=0``) sends every call to the unfused
composition: benchmarks compare the two in one run.
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F

from mmserve.kernels.attention import LayerKV, write_kv
from mmserve.kernels.linear import batch_invariant, linear
from mmserve.kernels.norm import rms_norm
from mmserve.kernels.rope import RotaryTable
from mmserve.kernels.triton_dispatch import use_triton

_state = {"enabled": os.environ.get("MMSERVE_FUSED", "1") != "0",
          "rope_attention": os.environ.get("MMSERVE_ROPE_ATTENTION", "0") == "1",
          "qkv_rope": os.environ.get("MMSERVE_QKV_ROPE", "1") != "0"}
HALF = (torch.bfloat16, torch.float16)


def set_fused_enabled(enabled: bool) -> None:
    """Switch every fused op in the process between the fused kernels and the composition."""
    _state["enabled"] = enabled


def fused_enabled() -> bool:
    return _state["enabled"]


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
    return (_state["enabled"] and (hidden is None or hidden <= FUSE_MAX_HIDDEN)
            and batch_invariant() and x.dtype in HALF and use_triton(x))


def norm_linear(x: torch.Tensor, norm_weight: torch.Tensor, eps: float, offset: float,
                weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``linear(rms_norm(x, norm_weight, eps, offset), weight, bias)``; x (M, K) -> (M, N)."""
    if _fused_gemm(x, x.shape[-1]):
        from mmserve.kernels import triton_fused

        return triton_fused.norm_linear(x, norm_weight, eps, offset, weight, bias)
    return linear(rms_norm(x, norm_weight, eps, offset), weight, bias)


def set_o_groups(on: bool) -> None:
    """The attention's o product summed by kv-head group (``o_segments``) in the Triton
    paths, the decode stack's and the layered kernels' alike: an arithmetic, so switched
    for the whole process (tests, benchmarks; ``MMSERVE_O_GROUPS``)."""
    _state["o_groups"] = on


def o_segments(kv_heads: int) -> int:
    """Chains the o product's K is summed in (``triton_fused._gemm``'s ``segments``): one
    per kv head with ``set_o_groups`` on (each head group's attention rows times their o
    columns a chain of its own, the chains added in head order: the decode stack can then
    start a group's product in its attention phase, ``triton_decode_stack``), else 1."""
    return kv_heads if _state["o_groups"] else 1


_state["o_groups"] = os.environ.get("MMSERVE_O_GROUPS", "0") == "1"


def linear_residual(x: torch.Tensor, weight: torch.Tensor, residual: torch.Tensor,
                    segments: int = 1) -> torch.Tensor:
    """``residual + linear(x, weight)``, the same bits fused or not; x (M, K) -> (M, N).
    ``segments``: the fused kernel's K chains (``o_segments``; the composition's product
    is torch's or the plain GEMM's, whose order is its own)."""
    if _fused_gemm(x, None):
        from mmserve.kernels import triton_fused

        return triton_fused.linear_residual(x, weight, residual, segments=segments)
    return residual + linear(x, weight)


def norm_gate_up_silu(x: torch.Tensor, norm_weight: torch.Tensor, eps: float, offset: float,
                      gate_up: torch.Tensor) -> torch.Tensor:
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
    if _state["enabled"] and x.dtype in HALF and use_triton(x):
        from mmserve.kernels import triton_fused

        return triton_fused.silu_mul(x)
    gate, up = x.split(x.shape[-1] // 2, dim=-1)
    return F.silu(gate) * up


def set_rope_attention(on: bool) -> None:
    """Rope, the cache write and attention in one launch where ``rope_attention`` applies
    (off: two, ``rope_write_kv`` and ``paged_attention``; the same bits). Off by default
    (``MMSERVE_ROPE_ATTENTION=1`` turns it on): no faster (docs/performance.md), since a
    small grid's attention program then runs rope's chain of loads itself and the step
    saves only the boundary."""
    _state["rope_attention"] = on


def rope_attention(qkv: torch.Tensor, heads: int, kv_heads: int, positions: torch.Tensor,
                   rope: RotaryTable, kv: LayerKV, meta, scale: float,
                   window: int | None) -> torch.Tensor | None:
    """``paged_attention(rope_write_kv(q, k, v, ...))`` of the q, k, v columns of ``qkv``
    (N, (Hq + 2 Hkv) D) -> (N, Hq D) in one launch (``triton_rope_attention``), or None
    where that kernel does not apply: not CUDA bf16 with a bf16 cache, a sliding window,
    or a sequence with more than 16 tokens in the step (a prompt chunk)."""
    if not (_state["enabled"] and _state["rope_attention"] and window is None
            and qkv.dtype == torch.bfloat16 and use_triton(qkv) and kv.k.dtype == qkv.dtype
            and kv.k_scale is None and qkv.is_contiguous()):
        return None
    from mmserve.kernels import triton_rope_attention as tra
    from mmserve.kernels.triton_attention import paged_metadata

    d = kv.k.shape[-1]
    if d & (d - 1) or paged_metadata(meta, kv.k.shape[1]).max_query_len > tra.TK:
        return None
    return tra.rope_attention(qkv, heads, kv_heads, positions, rope.cos, rope.sin, kv.k, kv.v,
                              meta, scale)


def set_qkv_rope(on: bool) -> None:
    """The QKV product with rope and the cache write in its epilogue where ``qkv_rope``
    applies (off: the product, then ``rope_write_kv``; the same bits)."""
    _state["qkv_rope"] = on


def qkv_rope(x: torch.Tensor, norm_weight: torch.Tensor, eps: float, offset: float,
             weight: torch.Tensor, bias: torch.Tensor | None, heads: int, kv_heads: int,
             positions: torch.Tensor, rope: RotaryTable, kv: LayerKV,
             slot_mapping: torch.Tensor) -> torch.Tensor | None:
    """``rope_write_kv`` of the q, k, v heads of ``norm_linear(x, ...)`` -> rotated q
    (N, Hq, D), with k and v in the cache; one launch (the product's epilogue ropes and
    writes), or None where it does not apply: not CUDA bf16 in invariant mode with a
    bf16 cache, the head dim not a multiple of 16, or rope + attention in one launch on.
    The norm is the product's prologue where ``norm_linear`` fuses it, else its own
    launch before."""
    if not (_state["qkv_rope"] and not _state["rope_attention"] and x.dtype == torch.bfloat16
            and _fused_gemm(x, None) and kv.k.dtype == x.dtype and kv.k_scale is None
            and kv.k.shape[-1] % 16 == 0 and kv.k.is_contiguous() and kv.v.is_contiguous()):
        return None
    from mmserve.kernels import triton_fused

    if _fused_gemm(x, x.shape[-1]):  # as norm_linear: the norm in the product's prologue
        norm = (norm_weight, eps, offset)
    else:
        x, norm = rms_norm(x, norm_weight, eps, offset), None
    return triton_fused.qkv_rope(x, weight, bias, norm, heads, kv_heads, positions, rope.cos,
                                 rope.sin, kv.k, kv.v, slot_mapping)


def rope_write_kv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor,
                  rope: RotaryTable, kv: LayerKV, slot_mapping: torch.Tensor) -> torch.Tensor:
    """Rotate q (N, Hq, D) and k (N, Hkv, D), store k and v in the paged cache -> rotated q.

    One launch for bf16 on CUDA with the bits of ``rope.rotate`` + ``write_kv`` (so it does
    not need batch-invariant mode), into a bf16 cache or an fp8 one (``kv.k_scale``: the
    rotated k and v quantised as ``write_kv`` does, the same bytes and scales).
    """
    fp8 = kv.k_scale is not None
    if (_state["enabled"] and q.dtype == torch.bfloat16 and use_triton(q)
            and (kv.k.dtype == q.dtype or fp8)):
        from mmserve.kernels import triton_fused

        return triton_fused.rope_write_kv(q, k, v, positions, rope.cos, rope.sin, kv.k, kv.v,
                                          slot_mapping, kv.k_scale, kv.v_scale)
    q, k = rope.rotate(q, positions), rope.rotate(k, positions)
    write_kv(kv, k, v, slot_mapping)
    return q
