"""The image processors of HF VLM checkpoints, reproduced pixel for pixel on CPU.

transformers 5 preprocesses with torchvision on uint8 tensors (its ``TorchvisionBackend``);
the same ``torchvision.transforms.v2.functional`` calls in the same order give the same
pixels, so the frames here equal HF's bit for bit (``tests/connectors`` checks it):

- ``TiledProcessor`` (``Idefics3ImageProcessor``, ``SmolVLMImageProcessor``): scale the
  longest edge to ``size["longest_edge"]`` (the short edge rounded up to even), round both
  edges up to multiples of the tile side, cut row-major tiles, and append the whole image
  squeezed to one tile (the global image). An image no larger than one tile stays a single
  frame; ``rows == cols == 0`` then.
- ``SquareProcessor`` (``CLIPImageProcessor``, ``LlavaImageProcessor``,
  ``SiglipImageProcessor``): optional pad-to-square in the mean colour, resize (shortest
  edge, or a fixed height and width), optional centre crop.

Both end with HF's fused rescale-and-normalize: ``(x - mean * 255) / (std * 255)`` in
float32. Input is an RGB ``PIL.Image`` (``connectors``' image source converts modes).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import torch
from PIL import Image
from torchvision.transforms.v2 import InterpolationMode
from torchvision.transforms.v2 import functional as tvF

# PIL resample codes (what HF configs store) -> torchvision modes, as HF maps them
_RESAMPLE = {
    0: InterpolationMode.NEAREST_EXACT,
    1: InterpolationMode.LANCZOS,
    2: InterpolationMode.BILINEAR,
    3: InterpolationMode.BICUBIC,
}
MAX_IMAGE_SIDE = 4096  # Idefics3's cap on the resized image's longest edge
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)
HALF = (0.5, 0.5, 0.5)


class Frames(NamedTuple):
    """One image's frames for the tower: (N, 3, S, S) float32, and its tile grid
    (``rows == cols == 0``: one frame, no tiles)."""

    pixels: torch.Tensor
    rows: int
    cols: int


def to_tensor(image: Image.Image) -> torch.Tensor:
    """An RGB PIL image -> (3, H, W) uint8, as HF's backend reads it."""
    if image.mode != "RGB":
        raise ValueError(f"expected an RGB image, got mode {image.mode!r}")
    return torch.from_numpy(np.array(image)).permute(2, 0, 1).contiguous()


def resize(image: torch.Tensor, height: int, width: int, resample: int) -> torch.Tensor:
    if resample not in _RESAMPLE:
        raise ValueError(f"resample {resample} is not supported; supported: {sorted(_RESAMPLE)}")
    return tvF.resize(image, [height, width], interpolation=_RESAMPLE[resample], antialias=True)


@dataclass(frozen=True)
class Normalize:
    mean: tuple[float, ...]
    std: tuple[float, ...]
    rescale_factor: float = 1 / 255
    do_rescale: bool = True
    do_normalize: bool = True

    def __call__(self, frames: torch.Tensor) -> torch.Tensor:
        """uint8 frames -> float32, with HF's fused arithmetic (the same bits)."""
        if self.do_rescale and self.do_normalize:
            mean = torch.tensor(self.mean) * (1.0 / self.rescale_factor)
            std = torch.tensor(self.std) * (1.0 / self.rescale_factor)
            return tvF.normalize(frames.to(torch.float32), mean, std)  # type: ignore[arg-type]
        if self.do_normalize:
            return tvF.normalize(frames.to(torch.float32), list(self.mean), list(self.std))
        if self.do_rescale:
            return frames * self.rescale_factor
        return frames.to(torch.float32)

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any], mean: tuple, std: tuple) -> Normalize:
        return cls(
            tuple(cfg.get("image_mean", mean)),
            tuple(cfg.get("image_std", std)),
            cfg.get("rescale_factor", 1 / 255),
            cfg.get("do_rescale", True),
            cfg.get("do_normalize", True),
        )


def _scale_longest_edge(height: int, width: int, longest: int) -> tuple[int, int]:
    """Idefics3's ``get_resize_output_image_size``: longest edge -> ``longest`` (the other
    rounded up to even), then both scaled under ``MAX_IMAGE_SIDE``."""
    aspect = width / height
    if width >= height:
        width, height = longest, int(longest / aspect)
        height += height % 2
    else:
        height, width = longest, int(longest * aspect)
        width += width % 2
    height, width = max(height, 1), max(width, 1)
    aspect = width / height
    if width >= height and width > MAX_IMAGE_SIDE:
        width, height = MAX_IMAGE_SIDE, int(MAX_IMAGE_SIDE / aspect)
    elif height > width and height > MAX_IMAGE_SIDE:
        height, width = MAX_IMAGE_SIDE, int(MAX_IMAGE_SIDE * aspect)
    return max(height, 1), max(width, 1)


def _tile_multiples(height: int, width: int, tile: int) -> tuple[int, int]:
    """Idefics3's ``resize_for_vision_encoder`` target: both edges up to multiples of tile."""
    aspect = width / height
    if width >= height:
        width = math.ceil(width / tile) * tile
        height = math.ceil(int(width / aspect) / tile) * tile
    else:
        height = math.ceil(height / tile) * tile
        width = math.ceil(int(height * aspect) / tile) * tile
    return height, width


@dataclass(frozen=True)
class TiledProcessor:
    """Idefics3/SmolVLM image processing (module docstring)."""

    longest_edge: int | None  # None: no first resize (``do_resize`` off)
    tile: int
    split: bool
    resample: int
    normalize: Normalize

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any]) -> TiledProcessor:
        size = cfg.get("size", {"longest_edge": 4 * 364})
        if cfg.get("do_resize", True) and "longest_edge" not in size:
            raise ValueError(
                f"image processor size {size} is not supported; "
                "Idefics3-style processors resize by 'longest_edge'"
            )
        return cls(
            size["longest_edge"] if cfg.get("do_resize", True) else None,
            cfg.get("max_image_size", {"longest_edge": 364})["longest_edge"],
            cfg.get("do_image_splitting", True),
            cfg.get("resample", 1),
            Normalize.from_config(cfg, HALF, HALF),
        )

    def __call__(self, image: Image.Image) -> Frames:
        x = to_tensor(image)
        if self.longest_edge is not None:
            height, width = x.shape[-2:]
            x = resize(x, *_scale_longest_edge(height, width, self.longest_edge), self.resample)
        if not self.split:
            x = resize(x, self.tile, self.tile, self.resample)
            return Frames(self.normalize(x[None]), 0, 0)
        height, width = x.shape[-2:]
        x = resize(x, *_tile_multiples(height, width, self.tile), self.resample)
        height, width = x.shape[-2:]
        if height <= self.tile and width <= self.tile:
            return Frames(self.normalize(x[None]), 0, 0)
        rows, cols = height // self.tile, width // self.tile
        # (3, rows*t, cols*t) -> (rows*cols, 3, t, t), row-major as HF's unfold
        tiles = x.reshape(3, rows, self.tile, cols, self.tile).permute(1, 3, 0, 2, 4)
        tiles = tiles.reshape(rows * cols, 3, self.tile, self.tile)
        whole = resize(x, self.tile, self.tile, self.resample)
        return Frames(self.normalize(torch.cat([tiles, whole[None]])), rows, cols)


@dataclass(frozen=True)
class SquareProcessor:
    """CLIP / LLaVA / SigLIP image processing (module docstring)."""

    size: Mapping[str, int] | None  # {"shortest_edge": n} or {"height", "width"}; None: none
    crop: tuple[int, int] | None
    pad_square: bool
    resample: int
    normalize: Normalize

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any]) -> SquareProcessor:
        siglip = cfg.get("image_processor_type", "").startswith("Siglip")
        mean = HALF if siglip else CLIP_MEAN
        std = HALF if siglip else CLIP_STD
        size = cfg.get("size", {"height": 224, "width": 224} if siglip else {"shortest_edge": 224})
        if isinstance(size, int):
            size = {"height": size, "width": size} if siglip else {"shortest_edge": size}
        if not ("shortest_edge" in size and len(size) == 1 or {"height", "width"} <= set(size)):
            raise ValueError(
                f"image processor size {size} is not supported; give "
                "{'shortest_edge': n} or {'height': h, 'width': w}"
            )
        crop = cfg.get("crop_size", {"height": 224, "width": 224})
        if isinstance(crop, int):
            crop = {"height": crop, "width": crop}
        do_crop = cfg.get("do_center_crop", not siglip)
        return cls(
            size if cfg.get("do_resize", True) else None,
            (crop["height"], crop["width"]) if do_crop else None,
            bool(cfg.get("do_pad", False)),
            cfg.get("resample", 3),
            Normalize.from_config(cfg, mean, std),
        )

    def __call__(self, image: Image.Image) -> Frames:
        x = to_tensor(image)
        if self.pad_square:
            x = self._pad_square(x)
        if self.size is not None:
            x = resize(x, *self._resized(*x.shape[-2:]), self.resample)
        if self.crop is not None:
            x = self._center_crop(x, *self.crop)
        return Frames(self.normalize(x[None]), 0, 0)

    def _resized(self, height: int, width: int) -> tuple[int, int]:
        assert self.size is not None
        if "shortest_edge" not in self.size:
            return self.size["height"], self.size["width"]
        short, long = (width, height) if width <= height else (height, width)
        edge = self.size["shortest_edge"]
        new_long = int(edge * long / short)
        return (new_long, edge) if width <= height else (edge, new_long)

    def _pad_square(self, x: torch.Tensor) -> torch.Tensor:
        height, width = x.shape[-2:]
        if height == width:
            return x
        side = max(height, width)
        left, top = (side - width) // 2, (side - height) // 2
        fill = [int(m * 255) for m in self.normalize.mean]
        return tvF.pad(x, [left, top, side - width - left, side - height - top], fill=fill)

    @staticmethod
    def _center_crop(x: torch.Tensor, height: int, width: int) -> torch.Tensor:
        h, w = x.shape[-2:]
        if width > w or height > h:
            pads = [
                (width - w) // 2 if width > w else 0,
                (height - h) // 2 if height > h else 0,
                (width - w + 1) // 2 if width > w else 0,
                (height - h + 1) // 2 if height > h else 0,
            ]
            x = tvF.pad(x, pads, fill=0)
            h, w = x.shape[-2:]
        return tvF.crop(x, int((h - height) / 2.0), int((w - width) / 2.0), height, width)


def image_processor(cfg: Mapping[str, Any]) -> TiledProcessor | SquareProcessor:
    """The processor an HF image-processor config describes; a clear error otherwise."""
    kind = cfg.get("image_processor_type", "")
    if kind.removesuffix("Fast") in ("Idefics3ImageProcessor", "SmolVLMImageProcessor"):
        return TiledProcessor.from_config(cfg)
    if kind.removesuffix("Fast") in (
        "CLIPImageProcessor",
        "LlavaImageProcessor",
        "SiglipImageProcessor",
    ):
        return SquareProcessor.from_config(cfg)
    raise ValueError(
        f"image processor {kind!r} is not supported; supported: Idefics3, SmolVLM, "
        "CLIP, Llava and Siglip image processors"
    )
