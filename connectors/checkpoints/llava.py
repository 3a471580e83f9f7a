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
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from connectors.checkpoints.files import ProcessorFiles
from connectors.checkpoints.preprocess import Frames, SquareProcessor
from connectors.checkpoints.towers import VisionTower, tower_spec

MODEL_TYPES = ("llava",)
_ACTS = {"gelu": F.gelu, "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
         "quick_gelu": lambda x: x * torch.sigmoid(1.702 * x), "silu": F.silu, "relu": F.relu}


def _projector(sd: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    for prefix in ("model.multi_modal_projector.", "multi_modal_projector."):
        if f"{prefix}linear_1.weight" in sd:
            return {k: sd[f"{prefix}{k}"] for k in ("linear_1.weight", "linear_1.bias",
                                                    "linear_2.weight", "linear_2.bias")
                    if f"{prefix}{k}" in sd}
    raise ValueError("no multi_modal_projector.linear_1.weight in this LLaVA checkpoint")


def _tower_prefix(sd: Mapping[str, torch.Tensor]) -> str:
    # transformers 4 saved CLIP/SigLIP under ``vision_model.``, transformers 5 saves without
    # it; in-memory names gain a leading ``model.``
    for prefix in ("vision_tower.vision_model.", "vision_tower.",
                   "model.vision_tower.vision_model.", "model.vision_tower."):
        if f"{prefix}embeddings.patch_embedding.weight" in sd:
            return prefix
    raise ValueError("no vision_tower...embeddings.patch_embedding.weight in this LLaVA "
                     "checkpoint")


class LlavaConnector(nn.Module):
    """Images -> (tokens, LM hidden) embeddings for a LLaVA checkpoint."""

    def __init__(self, tower: VisionTower, layers: list[int], drop_first: bool,
                 projector: dict[str, torch.Tensor], act: str, processor: SquareProcessor,
                 image_token: str, image_token_id: int) -> None:
        super().__init__()
        if act not in _ACTS:
            raise ValueError(f"projector_hidden_act {act!r} is not supported; supported: "
                             f"{', '.join(sorted(_ACTS))}")
        self.tower, self.layers, self.drop_first = tower, layers, drop_first
        self.proj = nn.ParameterDict({k.replace(".", "_"): nn.Parameter(v, requires_grad=False)
                                      for k, v in projector.items()})
        self.act, self.processor = _ACTS[act], processor
        self.hidden_size = projector["linear_2.weight"].shape[0]
        self.image_token, self.image_token_id = image_token, image_token_id
        spec = tower.spec
        self.tokens = spec.grid**2 + spec.prefix_tokens - int(drop_first)

    @classmethod
    def from_checkpoint(cls, config: Mapping[str, Any], files: ProcessorFiles,
                        sd: Mapping[str, torch.Tensor]) -> LlavaConnector:
        vision = config.get("vision_config") or {}
        spec = tower_spec(vision)
        wanted = config.get("vision_feature_layer", -2)
        layers = [wanted] if isinstance(wanted, int) else list(wanted)
        # hidden_states has layers + 1 entries; build only the blocks the deepest one needs
        index = [i if i >= 0 else spec.layers + 1 + i for i in layers]
        if not all(0 <= i <= spec.layers for i in index):
            raise ValueError(f"vision_feature_layer {wanted} is outside a tower of "
                             f"{spec.layers} layers")
        prefix = _tower_prefix(sd)
        tower = VisionTower.from_hf(vision, sd, prefix, blocks=max(index), final_norm=False)
        strategy = config.get("vision_feature_select_strategy", "default")
        if strategy not in ("default", "full"):
            raise ValueError(f"vision_feature_select_strategy {strategy!r} is not supported; "
                             "supported: default, full")
        token = files.processor.get("image_token") or files.named_tokens.get("image_token",
                                                                              "<image>")
        token_id = config.get("image_token_index", config.get("image_token_id", 32000))
        return cls(tower, index, strategy == "default", _projector(sd),
                   config.get("projector_hidden_act", "gelu"),
                   SquareProcessor.from_config(files.image_processor), token, token_id)

    def preprocess(self, image) -> Frames:
        """An RGB PIL image -> its one frame (CPU)."""
        frames = self.processor(image)
        side = self.tower.spec.image_size
        if frames.pixels.shape[-2:] != (side, side):
            raise ValueError(f"the image processor gives {tuple(frames.pixels.shape[-2:])} "
                             f"frames; the vision tower takes {side}x{side}")
        return frames

    def num_tokens(self, frames: Frames) -> int:
        return self.tokens

    def placeholder(self, frames: Frames) -> str:
        return self.image_token * self.tokens

    @torch.inference_mode()
    def encode(self, payloads: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """Images' pixels (``Frames.pixels``, (1, 3, S, S) each) in one tower pass -> one
        (tokens, hidden) each."""
        w = self.proj["linear_1_weight"]
        pixels = torch.cat(list(payloads)).to(w.device, w.dtype)
        states = self.tower.hidden_states(pixels)
        feats = torch.cat([states[i] for i in self.layers], dim=-1)  # (B, prefix + P, D*n)
        if self.drop_first:
            feats = feats[:, 1:]
        p = self.proj
        x = F.linear(feats, w, p["linear_1_bias"] if "linear_1_bias" in p else None)
        x = F.linear(self.act(x), p["linear_2_weight"],
                     p["linear_2_bias"] if "linear_2_bias" in p else None)
        return list(x)
