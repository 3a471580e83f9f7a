"""Building blocks shared by the model families: paged self-attention and gated MLP.

Every product goes through :func:`mmserve.kernels.linear.linear` and attention
through the paged kernel, so a token's hidden states never depend on the batch.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from mmserve.kernels.attention import AttentionMetadata, LayerKV, paged_attention, write_kv
from mmserve.kernels.linear import linear
from mmserve.kernels.norm import rms_norm
from mmserve.kernels.rope import RotaryTable


class SelfAttention(nn.Module):
    """Fused-QKV GQA attention with optional QKV bias, per-head q/k RMSNorm and sliding window."""

    def __init__(self, hidden: int, heads: int, kv_heads: int, head_dim: int, *, bias: bool,
                 qk_norm: bool, norm_eps: float, norm_offset: float, scale: float,
                 window: int | None) -> None:
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

    def forward(self, x: torch.Tensor, positions: torch.Tensor, rope: RotaryTable,
                meta: AttentionMetadata, kv: LayerKV) -> torch.Tensor:
        n = x.shape[0]
        qkv = linear(x, self.qkv_weight, self.qkv_bias)
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.reshape(n, self.heads, self.head_dim)  # (N, Hq, D)
        k = k.reshape(n, self.kv_heads, self.head_dim)  # (N, Hkv, D)
        v = v.reshape(n, self.kv_heads, self.head_dim)
        if self.q_norm is not None and self.k_norm is not None:
            q = rms_norm(q, self.q_norm, self.norm_eps, self.norm_offset)
            k = rms_norm(k, self.k_norm, self.norm_eps, self.norm_offset)
        q, k = rope.rotate(q, positions), rope.rotate(k, positions)
        write_kv(kv, k, v, meta.slot_mapping)
        out = paged_attention(q, kv, meta, self.scale, self.window)
        return linear(out.reshape(n, self.q_size), self.o_weight)


class GatedMLP(nn.Module):
    """``down(act(gate(x)) * up(x))`` with gate and up fused into one product."""

    def __init__(self, hidden: int, inter: int, act: Callable[[torch.Tensor], torch.Tensor]):
        super().__init__()
        self.inter, self.act = inter, act
        self.gate_up_weight = nn.Parameter(torch.empty(2 * inter, hidden))
        self.down_weight = nn.Parameter(torch.empty(hidden, inter))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = linear(x, self.gate_up_weight).split(self.inter, dim=-1)
        return linear(self.act(gate) * up, self.down_weight)


def fuse_attention(sd: dict[str, torch.Tensor], prefix: str, out: str) -> dict[str, torch.Tensor]:
    """Map HF q/k/v/o (+bias, +q/k norm) tensors under ``prefix`` onto SelfAttention names."""
    p = prefix
    fused = {
        f"{out}.qkv_weight": torch.cat([sd[f"{p}.q_proj.weight"], sd[f"{p}.k_proj.weight"],
                                        sd[f"{p}.v_proj.weight"]]),
        f"{out}.o_weight": sd[f"{p}.o_proj.weight"],
    }
    if f"{p}.q_proj.bias" in sd:
        fused[f"{out}.qkv_bias"] = torch.cat([sd[f"{p}.q_proj.bias"], sd[f"{p}.k_proj.bias"],
                                              sd[f"{p}.v_proj.bias"]])
    if f"{p}.q_norm.weight" in sd:
        fused[f"{out}.q_norm"] = sd[f"{p}.q_norm.weight"]
        fused[f"{out}.k_norm"] = sd[f"{p}.k_norm.weight"]
    return fused


def fuse_mlp(sd: dict[str, torch.Tensor], prefix: str, out: str) -> dict[str, torch.Tensor]:
    return {
        f"{out}.gate_up_weight": torch.cat([sd[f"{prefix}.gate_proj.weight"],
                                            sd[f"{prefix}.up_proj.weight"]]),
        f"{out}.down_weight": sd[f"{prefix}.down_proj.weight"],
    }
