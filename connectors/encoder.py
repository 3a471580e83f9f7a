"""A frozen timm model as a vision encoder: image tensors -> a grid of patch features.

Any timm model works: ``timm.create_model(name, pretrained_cfg_overlay=dict(file=...))``
loads local weights (nothing is downloaded), ``forward_features`` gives the features,
and the preprocessing is timm's own data config for the model (size, mean/std,
interpolation, crop), as ``timm.data.create_transform`` builds it. ViT-like models
give ``(B, prefix + N, C)`` tokens (the prefix - class and register tokens - is
dropped); CNNs give ``(B, C, H, W)`` maps. Either way ``forward`` returns the patch
grid ``(B, H, W, C)``.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

import timm
import torch
from PIL import Image
from timm.data import create_transform, resolve_data_config
from torch import nn


@dataclass
class EncoderSpec:
    """Which timm model, built how, with which weights (``file``: a local .safetensors /
    .pth; None: random init, for tests and for pretraining from scratch)."""

    name: str
    kwargs: dict[str, Any] = field(default_factory=dict)  # passed to timm.create_model
    file: str | None = None
    data: dict[str, Any] = field(default_factory=dict)  # overrides of timm's data config

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def create_encoder_model(spec: EncoderSpec) -> nn.Module:
    """The timm model of ``spec``, its weights from ``spec.file`` when given."""
    overlay: dict[str, Any] = dict(spec.data)
    if spec.file is not None:
        # A local file is a plain state dict: never a model's own custom loader (some timm
        # versions route a ViT's weights to its JAX .npz reader whatever the file is).
        overlay.update(file=spec.file, custom_load=False)
    return timm.create_model(
        spec.name,
        pretrained=spec.file is not None,
        num_classes=0,
        pretrained_cfg_overlay=overlay,
        **spec.kwargs,
    )


def data_config(model: nn.Module, spec: EncoderSpec) -> dict[str, Any]:
    """timm's data config for ``model`` with the spec's overrides."""
    cfg = resolve_data_config({}, model=model)
    cfg.update(
        {
            k: v
            for k, v in spec.data.items()
            if k in ("input_size", "interpolation", "mean", "std", "crop_pct", "crop_mode")
        }
    )
    return cfg


class Preprocess:
    """RGB image -> (C, H, W) float32 tensor, exactly as timm's eval transform does."""

    def __init__(self, cfg: dict[str, Any]) -> None:
        self.cfg = cfg
        self.transform = create_transform(**cfg, is_training=False)
        self.size: tuple[int, int] = tuple(cfg["input_size"][1:])  # type: ignore[assignment]

    def __call__(self, image: Image.Image) -> torch.Tensor:
        out = self.transform(image)
        assert isinstance(out, torch.Tensor) and out.shape[1:] == self.size
        return out

    def normalize_uint8(self, images: torch.Tensor) -> torch.Tensor:
        """(B, H, W, 3) uint8 images already at the input size -> (B, 3, H, W), as
        ``__call__`` gives for each (the resize is the identity then): a fast path for
        generated training images, on any device."""
        assert tuple(images.shape[1:3]) == self.size, "only for images at the input size"
        mean = torch.tensor(self.cfg["mean"], device=images.device).view(1, 3, 1, 1)
        std = torch.tensor(self.cfg["std"], device=images.device).view(1, 3, 1, 1)
        # the same float32 operations in the same order, in place on one contiguous copy
        x = images.permute(0, 3, 1, 2).contiguous().float()
        return x.div_(255.0).sub_(mean).div_(std)


class TimmEncoder(nn.Module):
    """Frozen timm model -> patch grid ``(B, H, W, C)``."""

    def __init__(self, model: Any) -> None:
        super().__init__()
        self.model: Any = model.eval().requires_grad_(False)
        self.prefix = int(getattr(model, "num_prefix_tokens", 0) or 0)
        self.dim = int(model.num_features)

    def train(self, mode: bool = True) -> TimmEncoder:
        super().train(False)  # frozen: dropout and norms stay in eval mode
        return self

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:  # (B, 3, H, W)
        feats = self.model.forward_features(pixels)
        if feats.dim() == 4:  # CNN: (B, C, H, W)
            return feats.permute(0, 2, 3, 1)
        tokens = feats[:, self.prefix :]  # (B, N, C)
        side = math.isqrt(tokens.shape[1])
        grid = getattr(getattr(self.model, "patch_embed", None), "grid_size", (side, side))
        return tokens.reshape(tokens.shape[0], grid[0], grid[1], tokens.shape[2])
