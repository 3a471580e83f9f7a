"""LLaVA-1.5 style: a CLIP or SigLIP tower's hidden states -> a 2-layer MLP -> the LM.

The tower (timm, ``towers``) runs up to ``vision_feature_layer`` (HF's ``hidden_states``
index: 0 is the embeddings, -1 the last block, never the final norm; a list concatenates
several along the feature axis) and stops there. ``vision_feature_select_strategy``
``"default"`` drops the first position (CLIP's class token; on a tower without one, as in HF,
the first patch), ``"full"`` keeps every position. The projector is
``linear_1 -> act -> linear_2`` (``mlp2x_gelu``; biases per ``multimodal_projector_bias``).

Placeholder layout, as ``LlavaProcessor`` writes it: the image token repeated once per
feature row (576 for CLIP-L/14 at 336px with "default"), one run per image.
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
from connectors.checkpoints.preprocess import Frames, SquareProcessor
from connectors.checkpoints.processor import CheckpointProcessor
from connectors.checkpoints.towers import TowerSpec, VisionTower, in_chunks, tower_spec
from mmserve.models.tokenizer import Tokenizer

MODEL_TYPES = ("llava",)
# LlavaConfig's tower when its config names none (CLIP ViT-L/14 at 336 px)
DEFAULT_VISION = {
    "model_type": "clip_vision_model",
    "hidden_size": 1024,
    "intermediate_size": 4096,
    "patch_size": 14,
    "image_size": 336,
    "num_hidden_layers": 24,
    "num_attention_heads": 16,
}
_ACTS = {
    "gelu": F.gelu,
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "quick_gelu": lambda x: x * torch.sigmoid(1.702 * x),
    "silu": F.silu,
    "relu": F.relu,
}


def _projector(sd: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    for prefix in ("model.multi_modal_projector.", "multi_modal_projector."):
        if f"{prefix}linear_1.weight" in sd:
            return {
                k: sd[f"{prefix}{k}"]
                for k in ("linear_1.weight", "linear_1.bias", "linear_2.weight", "linear_2.bias")
                if f"{prefix}{k}" in sd
            }
    raise ValueError("no multi_modal_projector.linear_1.weight in this LLaVA checkpoint")


def _tower_prefix(sd: Mapping[str, torch.Tensor]) -> str:
    # transformers 4 saved CLIP/SigLIP under ``vision_model.``, transformers 5 saves without
    # it; in-memory names gain a leading ``model.``
    for prefix in (
        "vision_tower.vision_model.",
        "vision_tower.",
        "model.vision_tower.vision_model.",
        "model.vision_tower.",
    ):
        if f"{prefix}embeddings.patch_embedding.weight" in sd:
            return prefix
    raise ValueError("no vision_tower...embeddings.patch_embedding.weight in this LLaVA checkpoint")


def _feature_layers(config: Mapping[str, Any], spec: TowerSpec) -> list[int]:
    """``vision_feature_layer`` as non-negative ``hidden_states`` indices (layers + 1 of
    them: the embeddings, then each block)."""
    wanted = config.get("vision_feature_layer", -2)
    layers = [wanted] if isinstance(wanted, int) else list(wanted)
    index = [i if i >= 0 else spec.layers + 1 + i for i in layers]
    if not all(0 <= i <= spec.layers for i in index):
        raise ValueError(
            f"vision_feature_layer {wanted} is outside a tower of {spec.layers} layers"
        )
    return index


def _drop_first(config: Mapping[str, Any]) -> bool:
    strategy = config.get("vision_feature_select_strategy", "default")
    if strategy not in ("default", "full"):
        raise ValueError(
            f"vision_feature_select_strategy {strategy!r} is not supported; "
            "supported: default, full"
        )
    return strategy == "default"


def checkpoint_processor(
    config: Mapping[str, Any], files: ProcessorFiles, tokenizer: Tokenizer
) -> CheckpointProcessor:
    """The CPU half, from the config and processor files alone (no weights)."""
    spec = tower_spec(config.get("vision_config") or DEFAULT_VISION)
    _feature_layers(config, spec)
    token = files.processor.get("image_token") or files.named_tokens.get("image_token", "<image>")
    tokens = spec.grid**2 + spec.prefix_tokens - int(_drop_first(config))
    return CheckpointProcessor(
        SquareProcessor.from_config(files.image_processor),
        _SquareLayout(token, tokens, spec.image_size),
        token,
        config.get("image_token_index", config.get("image_token_id", 32000)),
        tokenizer,
    )


class LlavaConnector(nn.Module, Connector):
    """The CLIP/SigLIP tower and MLP projector of a LLaVA checkpoint."""

    def __init__(
        self,
        tower: VisionTower,
        layers: list[int],
        drop_first: bool,
        projector: dict[str, torch.Tensor],
        act: str,
        processor: CheckpointProcessor,
    ) -> None:
        super().__init__()
        if act not in _ACTS:
            raise ValueError(
                f"projector_hidden_act {act!r} is not supported; supported: "
                f"{', '.join(sorted(_ACTS))}"
            )
        self.tower, self.layers, self.drop_first = tower, layers, drop_first
        self.proj = nn.ParameterDict(
            {
                k.replace(".", "_"): nn.Parameter(v, requires_grad=False)
                for k, v in projector.items()
            }
        )
        self.act, self.processor = _ACTS[act], processor
        self.hidden_size = projector["linear_2.weight"].shape[0]

    @property
    def device(self) -> torch.device:  # type: ignore[override]
        return self.proj["linear_1_weight"].device

    @classmethod
    def from_checkpoint(
        cls,
        config: Mapping[str, Any],
        files: ProcessorFiles,
        sd: Mapping[str, torch.Tensor],
        tokenizer: Tokenizer,
    ) -> LlavaConnector:
        vision = config.get("vision_config") or DEFAULT_VISION
        layers = _feature_layers(config, tower_spec(vision))
        tower = VisionTower.from_hf(
            vision, sd, _tower_prefix(sd), blocks=max(layers), final_norm=False
        )
        return cls(
            tower,
            layers,
            _drop_first(config),
            _projector(sd),
            config.get("projector_hidden_act", "gelu"),
            checkpoint_processor(config, files, tokenizer),
        )

    @torch.inference_mode()
    def encode(self, payloads: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """Images' pixels ((1, 3, S, S) each), all through the tower together (in fixed-size
        passes, ``towers.in_chunks``) -> one (tokens, hidden) each."""
        w = self.proj["linear_1_weight"]
        pixels = torch.cat(list(payloads)).to(w.device, w.dtype)
        return list(in_chunks(self._frames, pixels))

    def _frames(self, pixels: torch.Tensor) -> torch.Tensor:
        states = self.tower.hidden_states(pixels)
        feats = torch.cat([states[i] for i in self.layers], dim=-1)  # (B, prefix + P, D*n)
        if self.drop_first:
            feats = feats[:, 1:]
        p = self.proj
        x = F.linear(
            feats, p["linear_1_weight"], p["linear_1_bias"] if "linear_1_bias" in p else None
        )
        return F.linear(
            self.act(x), p["linear_2_weight"], p["linear_2_bias"] if "linear_2_bias" in p else None
        )


@dataclass(frozen=True)
class _SquareLayout:
    """One run of ``token`` per feature row; the frame must be the tower's square."""

    token: str
    tokens: int
    side: int

    def __call__(self, frames: Frames) -> str:
        if frames.pixels.shape[-2:] != (self.side, self.side):
            raise ValueError(
                f"the image processor gives {tuple(frames.pixels.shape[-2:])} "
                f"frames; the vision tower takes {self.side}x{self.side}"
            )
        return self.token * self.tokens
