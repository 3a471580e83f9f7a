"""Building blocks shared by the model families: paged self-attention and gated MLP.

Every product goes through :func:`mmserve.kernels.linear.linear` (or a fused op of
:mod:`mmserve.kernels.fused` built on the same invariant GEMM) and attention through
the paged kernel, so a token's hidden states never depend on the batch.

``forward`` takes an already-normed input and returns the block's output (Gemma's
sandwich norms need that); ``residual_forward`` is the pre-norm block
``x + block(rms_norm(x))`` with the norm and the residual add fused into the products.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from mmserve.kernels.attention import AttentionMetadata, LayerKV, paged_attention
from mmserve.kernels.fused import (
    linear_residual,
    norm_gate_up_silu,
    norm_linear,
    qkv_rope,
    rope_write_kv,
)
from mmserve.kernels.linear import linear
from mmserve.kernels.norm import rms_norm
from mmserve.kernels.rope import RotaryTable


class SelfAttention(nn.Module):
    """Fused-QKV GQA attention with optional QKV bias, per-head q/k RMSNorm and sliding window."""

    def __init__(
        self,
        hidden: int,
        heads: int,
        kv_heads: int,
        head_dim: int,
        *,
        bias: bool,
        qk_norm: bool,
        norm_eps: float,
        norm_offset: float,
        scale: float,
        window: int | None,
    ) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        self.q_size, self.kv_size = heads * head_dim, kv_heads * head_dim
        self.scale, self.window = scale, window
        self.norm_eps, self.norm_offset = norm_eps, norm_offset
        self.qkv_weight = nn.Parameter(torch.empty(self.q_size + 2 * self.kv_size, hidden))
        self.qkv_bias = nn.Parameter(torch.empty(self.q_size + 2 * self.kv_size)) if bias else None
        self.o_weight = nn.Parameter(torch.empty(hidden, self.q_size))
        self.q_norm = nn.Parameter(torch.empty(head_dim)) if qk_norm else None
        self.k_norm = nn.Parameter(torch.empty(head_dim)) if qk_norm else None

    def forward(
        self,
        x: torch.Tensor,
        positions: torch.Tensor,
        rope: RotaryTable,
        meta: AttentionMetadata,
        kv: LayerKV,
    ) -> torch.Tensor:
        """Attention of an already-normed x (N, hidden) -> (N, hidden)."""
        qkv = linear(x, self.qkv_weight, self.qkv_bias)
        return linear(self.attend(qkv, positions, rope, meta, kv), self.o_weight)

    def residual_forward(
        self,
        x: torch.Tensor,
        norm: torch.Tensor,
        eps: float,
        positions: torch.Tensor,
        rope: RotaryTable,
        meta: AttentionMetadata,
        kv: LayerKV,
        offset: float = 0.0,
    ) -> torch.Tensor:
        """``x + forward(rms_norm(x, norm, eps, offset))``: the norm and the add fused, and
        rope with the cache write in the QKV product's epilogue where that applies."""
        q = None
        if self.q_norm is None:
            q = qkv_rope(
                x,
                norm,
                eps,
                offset,
                self.qkv_weight,
                self.qkv_bias,
                self.heads,
                self.kv_heads,
                positions,
                rope,
                kv,
                meta.slot_mapping,
            )
        if q is None:
            out = self.attend(
                norm_linear(x, norm, eps, offset, self.qkv_weight, self.qkv_bias),
                positions,
                rope,
                meta,
                kv,
            )
        else:
            out = paged_attention(q, kv, meta, self.scale, self.window).reshape(-1, self.q_size)
        return linear_residual(out, self.o_weight, x)

    def attend(
        self,
        qkv: torch.Tensor,
        positions: torch.Tensor,
        rope: RotaryTable,
        meta: AttentionMetadata,
        kv: LayerKV,
    ) -> torch.Tensor:
        """(N, q + 2 kv) projections -> (N, Hq * D) attention output; caches this step's K/V."""
        n = qkv.shape[0]
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.reshape(n, self.heads, self.head_dim)  # (N, Hq, D), a view of qkv
        k = k.reshape(n, self.kv_heads, self.head_dim)  # (N, Hkv, D)
        v = v.reshape(n, self.kv_heads, self.head_dim)
        if self.q_norm is not None and self.k_norm is not None:
            q = rms_norm(q, self.q_norm, self.norm_eps, self.norm_offset)
            k = rms_norm(k, self.k_norm, self.norm_eps, self.norm_offset)
        q = rope_write_kv(q, k, v, positions, rope, kv, meta.slot_mapping)
        out = paged_attention(q, kv, meta, self.scale, self.window)
        return out.reshape(n, self.q_size)


class GatedMLP(nn.Module):
    """``down(act(gate(x)) * up(x))`` with gate and up fused into one product."""

    def __init__(self, hidden: int, inter: int, act: Callable[[torch.Tensor], torch.Tensor]):
        super().__init__()
        self.inter, self.act = inter, act
        self.gate_up_weight = nn.Parameter(torch.empty(2 * inter, hidden))
        self.down_weight = nn.Parameter(torch.empty(hidden, inter))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """MLP of an already-normed x (N, hidden) -> (N, hidden)."""
        gate, up = linear(x, self.gate_up_weight).split(self.inter, dim=-1)
        return linear(self.act(gate) * up, self.down_weight)

    def residual_forward(
        self, x: torch.Tensor, norm: torch.Tensor, eps: float, offset: float = 0.0
    ) -> torch.Tensor:
        """``x + forward(rms_norm(x, norm, eps, offset))``: norm, activation and add fused."""
        if self.act is F.silu:
            h = norm_gate_up_silu(x, norm, eps, offset, self.gate_up_weight)
        else:
            gate, up = norm_linear(x, norm, eps, offset, self.gate_up_weight).split(
                self.inter, dim=-1
            )
            h = self.act(gate) * up
        return linear_residual(h, self.down_weight, x)


def fuse_attention(sd: dict[str, torch.Tensor], prefix: str, out: str) -> dict[str, torch.Tensor]:
    """Map HF q/k/v/o (+bias, +q/k norm) tensors under ``prefix`` onto SelfAttention names."""
    p = prefix
    fused = {
        f"{out}.qkv_weight": torch.cat(
            [sd[f"{p}.q_proj.weight"], sd[f"{p}.k_proj.weight"], sd[f"{p}.v_proj.weight"]]
        ),
        f"{out}.o_weight": sd[f"{p}.o_proj.weight"],
    }
    if f"{p}.q_proj.bias" in sd:
        fused[f"{out}.qkv_bias"] = torch.cat(
            [sd[f"{p}.q_proj.bias"], sd[f"{p}.k_proj.bias"], sd[f"{p}.v_proj.bias"]]
        )
    if f"{p}.q_norm.weight" in sd:
        fused[f"{out}.q_norm"] = sd[f"{p}.q_norm.weight"]
        fused[f"{out}.k_norm"] = sd[f"{p}.k_norm.weight"]
    return fused


def fuse_mlp(sd: dict[str, torch.Tensor], prefix: str, out: str) -> dict[str, torch.Tensor]:
    return {
        f"{out}.gate_up_weight": torch.cat(
            [sd[f"{prefix}.gate_proj.weight"], sd[f"{prefix}.up_proj.weight"]]
        ),
        f"{out}.down_weight": sd[f"{prefix}.down_proj.weight"],
    }
