"""Rotary position embedding (the HF "rotate half" layout), with Llama-3 style scaling."""

from __future__ import annotations

import math

import torch

from mmserve.kernels.triton_dispatch import use_triton


def inv_frequencies(head_dim: int, theta: float, scaling: dict | None = None) -> torch.Tensor:
    """(head_dim/2,) inverse frequencies, adjusted by ``rope_scaling`` from config.json."""
    # float32 like HF transformers, so positions rotate identically
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    kind = (scaling or {}).get("rope_type", (scaling or {}).get("type"))
    if kind in (None, "default"):
        return inv.float()
    if kind == "linear":
        return (inv / scaling["factor"]).float()  # type: ignore[index]
    if kind == "llama3":
        return _llama3(inv, scaling).float()  # type: ignore[arg-type]
    raise ValueError(f"unsupported rope_scaling type {kind!r}; supported: default, linear, llama3")


def _llama3(inv: torch.Tensor, s: dict) -> torch.Tensor:
    factor, low, high = s["factor"], s["low_freq_factor"], s["high_freq_factor"]
    old_len = s["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv
    smooth = (old_len / wavelen - low) / (high - low)
    scaled = torch.where(wavelen > old_len / low, inv / factor, inv)
    mid = (1 - smooth) * inv / factor + smooth * inv
    is_mid = (wavelen <= old_len / low) & (wavelen >= old_len / high)
    return torch.where(is_mid, mid, scaled)


class RotaryTable(torch.nn.Module):
    """cos/sin for every position up to ``max_positions``, computed once.

    The tables follow ``model.to(device)`` but stay float32 whatever the model's
    dtype (as in HF transformers: cos/sin are rounded to the activation dtype per call).
    """

    cos: torch.Tensor
    sin: torch.Tensor

    def __init__(
        self,
        head_dim: int,
        theta: float,
        max_positions: int,
        scaling: dict | None = None,
        device: torch.device | None = None,
    ) -> None:
        super().__init__()
        inv = inv_frequencies(head_dim, theta, scaling)
        angles = torch.outer(torch.arange(max_positions, dtype=torch.float32), inv)
        emb = torch.cat([angles, angles], dim=-1)  # (P, D)
        self.cos = emb.cos().to(device)
        self.sin = emb.sin().to(device)

    def _apply(self, fn, recurse=True):  # type: ignore[no-untyped-def]
        device = fn(torch.zeros(1)).device  # follow the device, never the dtype
        self.cos, self.sin = self.cos.to(device), self.sin.to(device)
        return self

    def rotate(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """x: (N, H, D) at ``positions`` (N,) -> rotated x, same dtype."""
        if use_triton(x) and x.dtype == torch.bfloat16:  # one launch, bit-identical
            from mmserve.kernels.triton_rope import cuda_rope

            return cuda_rope(x, self.cos, self.sin, positions)
        return self.rotate_reference(x, positions)

    def rotate_reference(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """The plain-torch rotation (the CPU path and the kernels' reference)."""
        cos = self.cos[positions][:, None, :].to(x.dtype)  # (N, 1, D)
        sin = self.sin[positions][:, None, :].to(x.dtype)
        half = x.shape[-1] // 2
        rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
        return x * cos + rotated * sin
