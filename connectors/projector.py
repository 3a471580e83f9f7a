"""Projectors: an encoder's patch grid -> a fixed number of vectors in the LM's space.

- ``mlp2x_gelu`` (LLaVA-1.5): every patch -> Linear -> GELU -> Linear; H*W tokens.
- ``shuffle_linear`` (Idefics3 / SmolVLM): pixel shuffle by ``scale`` (each ``scale x
  scale`` block of patches becomes one token of ``scale**2`` times the width), then one
  Linear without bias; H*W / scale**2 tokens.
- ``shuffle_mlp`` (the offline default): pixel shuffle, LayerNorm, then mlp2x_gelu.

The token count depends only on the grid and ``scale``: ``num_tokens(grid)``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import nn

KINDS = ("mlp2x_gelu", "shuffle_linear", "shuffle_mlp")


@dataclass
class ProjectorSpec:
    kind: str
    in_dim: int  # the encoder's feature width
    out_dim: int  # the LM's hidden size
    scale: int = 1  # pixel-shuffle factor (shuffle kinds)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"projector kind must be one of {', '.join(KINDS)}, got {self.kind!r}")
        if self.kind == "mlp2x_gelu" and self.scale != 1:
            raise ValueError("mlp2x_gelu does not shuffle: scale must be 1")
        if self.scale < 1:
            raise ValueError(f"scale must be >= 1, got {self.scale}")

    def num_tokens(self, grid: tuple[int, int]) -> int:
        h, w = grid
        if h % self.scale or w % self.scale:
            raise ValueError(f"a {h}x{w} patch grid does not divide by scale {self.scale}")
        return (h // self.scale) * (w // self.scale)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def pixel_shuffle(x: torch.Tensor, scale: int) -> torch.Tensor:
    """(B, H, W, C) -> (B, H*W / scale**2, C * scale**2), in Idefics3's element order."""
    b, h, w, c = x.shape
    x = x.reshape(b, h, w // scale, c * scale)  # (B, H, W/s, C*s)
    x = x.permute(0, 2, 1, 3)  # (B, W/s, H, C*s)
    x = x.reshape(b, w // scale, h // scale, c * scale * scale)  # (B, W/s, H/s, C*s*s)
    x = x.permute(0, 2, 1, 3)  # (B, H/s, W/s, C*s*s)
    return x.reshape(b, (h // scale) * (w // scale), c * scale * scale)


class Projector(nn.Module):
    def __init__(self, spec: ProjectorSpec) -> None:
        super().__init__()
        self.spec = spec
        width = spec.in_dim * spec.scale * spec.scale
        if spec.kind == "shuffle_linear":
            self.proj = nn.Linear(width, spec.out_dim, bias=False)
        else:
            self.norm = nn.LayerNorm(width) if spec.kind == "shuffle_mlp" else nn.Identity()
            self.linear_1 = nn.Linear(width, spec.out_dim)
            self.act = nn.GELU()
            self.linear_2 = nn.Linear(spec.out_dim, spec.out_dim)

    def forward(self, grid: torch.Tensor) -> torch.Tensor:  # (B, H, W, C) -> (B, N, D)
        x = pixel_shuffle(grid, self.spec.scale) if self.spec.scale > 1 else grid.flatten(1, 2)
        if self.spec.kind == "shuffle_linear":
            return self.proj(x)
        return self.linear_2(self.act(self.linear_1(self.norm(x))))
