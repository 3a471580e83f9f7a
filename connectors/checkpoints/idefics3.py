"""Idefics3 and SmolVLM: SigLIP tiles -> pixel shuffle -> one linear layer -> the LM.

An image becomes ``rows x cols`` tiles plus one global frame (``preprocess.TiledProcessor``);
each frame is one tower pass (timm, ``towers``), its ``grid x grid`` patch features are
pixel-shuffled by ``scale_factor`` (``scale**2`` neighbours concatenated, so
``grid**2 / scale**2`` tokens of ``hidden * scale**2``) and projected without bias into the
LM's space: ``seq_len`` tokens a frame.

Placeholder layout, exactly as ``Idefics3Processor`` / ``SmolVLMProcessor`` write it, with
``<image>`` repeated ``seq_len`` times where ``{img}`` stands::

    tiles:   <fake><row_1_col_1>{img}<fake><row_1_col_2>{img}\\n ... \\n
             \\n<fake><global-img>{img}<fake>
    single:  <fake><global-img>{img}<fake>

(``<fake>`` is ``<fake_token_around_image>``; each tile row ends with a newline.) So one
image fills ``frames`` runs of ``seq_len`` placeholders, in frame order.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from connectors.base import Connector
from connectors.checkpoints.files import ProcessorFiles
from connectors.checkpoints.preprocess import Frames, TiledProcessor
from connectors.checkpoints.processor import CheckpointProcessor
from connectors.checkpoints.towers import VisionTower, in_chunks, tower_spec
from mmserve.models.tokenizer import Tokenizer

MODEL_TYPES = ("idefics3", "smolvlm")


def pixel_shuffle(x: torch.Tensor, scale: int) -> torch.Tensor:
    """(B, S*S, D) -> (B, S*S / scale**2, D * scale**2), HF's ``Idefics3Connector``
    order (neighbours along a row first, then along a column)."""
    b, seq, dim = x.shape
    side = int(seq**0.5)
    x = x.reshape(b, side, side // scale, dim * scale)  # (B, H, W/s, D*s)
    x = x.permute(0, 2, 1, 3)  # (B, W/s, H, D*s)
    x = x.reshape(b, side // scale, side // scale, dim * scale * scale)  # (B, W/s, H/s, D*s*s)
    x = x.permute(0, 2, 1, 3)  # (B, H/s, W/s, D*s*s)
    return x.reshape(b, seq // scale**2, dim * scale**2)


@dataclass(frozen=True)
class Idefics3Layout:
    """The text an image stands as (module docstring), from the tokenizer's named tokens."""

    seq_len: int
    image: str = "<image>"
    fake: str = "<fake_token_around_image>"
    global_tag: str = "<global-img>"

    @classmethod
    def named(cls, seq_len: int, tokens: Mapping[str, str]) -> Idefics3Layout:
        return cls(
            seq_len,
            tokens.get("image_token", cls.image),
            tokens.get("fake_image_token", cls.fake),
            tokens.get("global_image_token", cls.global_tag),
        )

    def __call__(self, frames: Frames) -> str:
        run = self.image * self.seq_len
        whole = f"{self.fake}{self.global_tag}{run}{self.fake}"
        if frames.rows == 0 and frames.cols == 0:
            return whole
        rows = [
            "".join(f"{self.fake}<row_{r + 1}_col_{c + 1}>{run}" for c in range(frames.cols))
            for r in range(frames.rows)
        ]
        return "".join(row + "\n" for row in rows) + "\n" + whole


def checkpoint_processor(
    config: Mapping[str, Any], files: ProcessorFiles, tokenizer: Tokenizer
) -> CheckpointProcessor:
    """The CPU half, from the config and processor files alone (no weights)."""
    frames = TiledProcessor.from_config(files.image_processor)
    spec = tower_spec(config.get("vision_config") or {})
    if frames.tile != spec.image_size:
        raise ValueError(
            f"tiles of {frames.tile}px (max_image_size) do not match the vision "
            f"tower's image_size {spec.image_size}"
        )
    scale = config.get("scale_factor", 2)
    seq_len = spec.grid**2 // scale**2
    declared = files.processor.get("image_seq_len", seq_len)
    if declared != seq_len:
        raise ValueError(
            f"processor image_seq_len {declared} disagrees with the model's "
            f"{seq_len} tokens a frame"
        )
    layout = Idefics3Layout.named(seq_len, files.named_tokens)
    return CheckpointProcessor(
        frames, layout, layout.image, config.get("image_token_id", 128257), tokenizer
    )


class Idefics3Connector(nn.Module, Connector):
    """The SigLIP tower and pixel-shuffle projector of an Idefics3/SmolVLM checkpoint."""

    def __init__(
        self, tower: VisionTower, proj: torch.Tensor, scale: int, processor: CheckpointProcessor
    ) -> None:
        super().__init__()
        self.tower = tower
        self.proj = nn.Parameter(proj, requires_grad=False)  # (hidden, D * scale**2)
        self.scale, self.processor = scale, processor
        self.hidden_size = proj.shape[0]

    @property
    def device(self) -> torch.device:  # type: ignore[override]
        return self.proj.device

    @classmethod
    def from_checkpoint(
        cls,
        config: Mapping[str, Any],
        files: ProcessorFiles,
        sd: Mapping[str, torch.Tensor],
        tokenizer: Tokenizer,
    ) -> Idefics3Connector:
        tower = VisionTower.from_hf(config["vision_config"], sd, "model.vision_model.")
        return cls(
            tower,
            sd["model.connector.modality_projection.proj.weight"],
            config.get("scale_factor", 2),
            checkpoint_processor(config, files, tokenizer),
        )

    @torch.inference_mode()
    def encode(self, payloads: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """Images' frames ((frames, 3, S, S) each), all through the tower together (in
        fixed-size passes, ``towers.in_chunks``) -> one (frames * seq_len, hidden) per image."""
        p = self.proj
        pixels = torch.cat(list(payloads)).to(p.device, p.dtype)
        feats = in_chunks(self._frames, pixels)  # (frames, seq_len, hidden)
        counts = [x.shape[0] for x in payloads]
        return [x.reshape(-1, self.hidden_size) for x in feats.split(counts)]

    def _frames(self, pixels: torch.Tensor) -> torch.Tensor:
        return F.linear(pixel_shuffle(self.tower(pixels), self.scale), self.proj)
