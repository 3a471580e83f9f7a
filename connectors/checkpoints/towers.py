"""HF vision towers (SigLIP, CLIP, Idefics3/SmolVLM's SigLIP) as timm ``VisionTransformer``s.

The HF towers are the pre-norm ViT that timm implements, so each is built as a timm model
from the HF ``vision_config`` and its weights are renamed into it (q/k/v rows concatenated
into timm's fused ``qkv``). What differs is settled here, not by a second implementation:

- CLIP: a class token, a LayerNorm before the blocks (timm ``pre_norm``, which also drops
  the patch bias as CLIP has none), quick-GELU.
- SigLIP: no class token, a patch bias, tanh-GELU; its pooling head is never used.
- Idefics3/SmolVLM: SigLIP whose position ids come from bucketing fractional patch
  coordinates (a NaViT-style scheme for padded images). The frames this package feeds it
  are always the full ``image_size`` square, so the ids are one fixed table; it is computed
  with HF's own float arithmetic and baked into ``pos_embed`` by gathering the rows.

``hidden_states`` returns what HF's ``output_hidden_states`` does (the embeddings after any
pre-norm, then each block's output, never the final norm); only the blocks a caller's
feature layer needs are built.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch
from timm.models.vision_transformer import VisionTransformer
from torch import nn

# HF ``hidden_act`` -> timm ``act_layer``
_ACTIVATIONS = {
    "gelu_pytorch_tanh": "gelu_tanh",
    "gelu_new": "gelu_tanh",
    "gelu": "gelu",
    "quick_gelu": "quick_gelu",
}


@dataclass(frozen=True)
class TowerSpec:
    """The shape of one HF vision tower, read from its ``vision_config``."""

    kind: str  # "clip" or "siglip" (Idefics3/SmolVLM towers are "siglip")
    image_size: int
    patch_size: int
    hidden: int
    intermediate: int
    layers: int
    heads: int
    eps: float
    act: str
    bucketed_positions: bool = False  # Idefics3/SmolVLM's fractional position ids

    @property
    def grid(self) -> int:
        return self.image_size // self.patch_size

    @property
    def prefix_tokens(self) -> int:
        return 1 if self.kind == "clip" else 0


_KINDS = {
    "clip_vision_model": "clip",
    "siglip_vision_model": "siglip",
    "idefics3_vision": "siglip",
    "smolvlm_vision": "siglip",
}
_BASE = {"num_hidden_layers": 12, "image_size": 224, "intermediate_size": 3072}
# each HF vision config class's defaults (configs saved as a diff against them omit these)
_DEFAULTS: dict[str, dict] = {
    "clip_vision_model": _BASE
    | {
        "hidden_size": 768,
        "num_attention_heads": 12,
        "patch_size": 32,
        "hidden_act": "quick_gelu",
        "layer_norm_eps": 1e-5,
    },
    "siglip_vision_model": _BASE
    | {
        "hidden_size": 768,
        "num_attention_heads": 12,
        "patch_size": 16,
        "hidden_act": "gelu_pytorch_tanh",
        "layer_norm_eps": 1e-6,
    },
    "idefics3_vision": _BASE
    | {
        "hidden_size": 1152,
        "num_attention_heads": 16,
        "patch_size": 32,
        "hidden_act": "gelu_pytorch_tanh",
        "layer_norm_eps": 1e-6,
    },
}
_DEFAULTS["smolvlm_vision"] = _DEFAULTS["idefics3_vision"]


def tower_spec(vision_config: Mapping) -> TowerSpec:
    """The ``TowerSpec`` of an HF ``vision_config``; a clear error for towers not covered."""
    model_type = vision_config.get("model_type", "clip_vision_model")
    if model_type not in _KINDS:
        raise ValueError(
            f"vision tower {model_type!r} is not supported; supported: {', '.join(sorted(_KINDS))}"
        )
    cfg = _DEFAULTS[model_type] | dict(vision_config)
    if cfg["hidden_act"] not in _ACTIVATIONS:
        raise ValueError(
            f"vision tower activation {cfg['hidden_act']!r} is not supported; "
            f"supported: {', '.join(sorted(_ACTIVATIONS))}"
        )
    size, patch = cfg["image_size"], cfg["patch_size"]
    if not isinstance(size, int) or not isinstance(patch, int):
        raise ValueError(
            f"only square towers are supported, got image_size={size!r}, patch_size={patch!r}"
        )
    return TowerSpec(
        kind=_KINDS[model_type],
        image_size=size,
        patch_size=patch,
        hidden=cfg["hidden_size"],
        intermediate=cfg["intermediate_size"],
        layers=cfg["num_hidden_layers"],
        heads=cfg["num_attention_heads"],
        eps=cfg["layer_norm_eps"],
        act=cfg["hidden_act"],
        bucketed_positions=model_type in ("idefics3_vision", "smolvlm_vision"),
    )


def build_vit(spec: TowerSpec, blocks: int, final_norm: bool) -> VisionTransformer:
    """An uninitialised timm ViT of ``spec`` with the first ``blocks`` blocks."""
    # timm sizes the MLP as int(dim * ratio): half a unit above keeps odd sizes exact
    ratio = (spec.intermediate + 0.5) / spec.hidden
    return VisionTransformer(
        img_size=spec.image_size,
        patch_size=spec.patch_size,
        num_classes=0,
        global_pool="",
        embed_dim=spec.hidden,
        depth=blocks,
        num_heads=spec.heads,
        mlp_ratio=ratio,
        qkv_bias=True,
        class_token=spec.kind == "clip",
        pre_norm=spec.kind == "clip",
        final_norm=final_norm,
        act_layer=_ACTIVATIONS[spec.act],
        norm_layer=lambda dim, **kw: nn.LayerNorm(dim, eps=spec.eps, **kw),
        weight_init="skip",
    )


def bucketed_position_ids(grid: int) -> torch.Tensor:
    """(grid*grid,) Idefics3's position ids for a full frame, with HF's own float32 steps
    (``Idefics3VisionEmbeddings.forward``), so a rounding that repeats an id repeats it
    here too."""
    boundaries = torch.arange(1 / grid, 1.0, 1 / grid)
    step = 1.0 / torch.tensor([grid])  # nb_patches_h for a mask of all ones
    coords = torch.arange(grid, dtype=torch.float32)[None, :] * step[:, None]
    buckets = torch.bucketize(torch.clamp(coords, max=1.0 - 1e-6), boundaries, right=True)[0]
    return (buckets[:, None] * grid + buckets[None, :]).reshape(-1)


def hf_vision_weights(
    spec: TowerSpec, sd: Mapping[str, torch.Tensor], prefix: str, blocks: int, final_norm: bool
) -> dict[str, torch.Tensor]:
    """HF tower tensors under ``prefix`` (``...vision_model.``) renamed to timm's names."""
    p = prefix
    pos = sd[f"{p}embeddings.position_embedding.weight"]
    if spec.bucketed_positions:
        pos = pos[bucketed_position_ids(spec.grid)]
    out = {
        "patch_embed.proj.weight": sd[f"{p}embeddings.patch_embedding.weight"],
        "pos_embed": pos[None],
    }
    if spec.kind == "clip":
        out["cls_token"] = sd[f"{p}embeddings.class_embedding"].reshape(1, 1, -1)
        out["norm_pre.weight"] = sd[f"{p}pre_layrnorm.weight"]
        out["norm_pre.bias"] = sd[f"{p}pre_layrnorm.bias"]
    else:
        out["patch_embed.proj.bias"] = sd[f"{p}embeddings.patch_embedding.bias"]
    if final_norm:
        out["norm.weight"] = sd[f"{p}post_layernorm.weight"]
        out["norm.bias"] = sd[f"{p}post_layernorm.bias"]
    for i in range(blocks):
        out.update(_block_weights(sd, f"{p}encoder.layers.{i}.", f"blocks.{i}."))
    return out


def _block_weights(sd: Mapping[str, torch.Tensor], src: str, dst: str) -> dict[str, torch.Tensor]:
    attn = f"{src}self_attn."
    out = {
        f"{dst}attn.qkv.{kind}": torch.cat([sd[f"{attn}{n}_proj.{kind}"] for n in "qkv"])
        for kind in ("weight", "bias")
    }
    renames = {
        "attn.proj": "self_attn.out_proj",
        "norm1": "layer_norm1",
        "norm2": "layer_norm2",
        "mlp.fc1": "mlp.fc1",
        "mlp.fc2": "mlp.fc2",
    }
    for timm_name, hf_name in renames.items():
        for kind in ("weight", "bias"):
            out[f"{dst}{timm_name}.{kind}"] = sd[f"{src}{hf_name}.{kind}"]
    return out


class VisionTower(nn.Module):
    """A timm ViT holding an HF tower's weights, and the two outputs the VLMs read."""

    def __init__(self, spec: TowerSpec, blocks: int, final_norm: bool) -> None:
        super().__init__()
        self.spec = spec
        self.vit = build_vit(spec, blocks, final_norm)

    @classmethod
    def from_hf(
        cls,
        vision_config: Mapping,
        sd: Mapping[str, torch.Tensor],
        prefix: str,
        blocks: int | None = None,
        final_norm: bool = True,
    ) -> VisionTower:
        """The tower of ``vision_config`` with the first ``blocks`` blocks (all by default)
        loaded from ``sd``; every parameter must be covered."""
        spec = tower_spec(vision_config)
        blocks = spec.layers if blocks is None else blocks
        if not 0 <= blocks <= spec.layers:
            raise ValueError(f"a tower of {spec.layers} layers has no output after {blocks}")
        tower = cls(spec, blocks, final_norm)
        weights = hf_vision_weights(spec, sd, prefix, blocks, final_norm)
        missing, unexpected = tower.vit.load_state_dict(weights, strict=False)
        if missing or unexpected:
            raise ValueError(
                f"vision tower weights: missing {missing[:5]}, unexpected {unexpected[:5]}"
            )
        return tower.eval().requires_grad_(False)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        """(B, 3, S, S) -> (B, prefix + grid*grid, hidden): the blocks, then the final norm
        if the tower was built with it (Idefics3's ``last_hidden_state``)."""
        return self.vit.forward_features(pixels)

    def hidden_states(self, pixels: torch.Tensor) -> list[torch.Tensor]:
        """HF's ``hidden_states``: [embeddings, after block 1, ..., after the last built]."""
        vit = self.vit
        x = vit.norm_pre(vit._pos_embed(vit.patch_embed(pixels)))
        states = [x]
        for block in vit.blocks:
            x = block(x)
            states.append(x)
        return states


CHUNK = 8  # frames a tower pass (batch invariance: see ``in_chunks``)


def in_chunks(
    fn: Callable[[torch.Tensor], torch.Tensor], frames: torch.Tensor, chunk: int = CHUNK
) -> torch.Tensor:
    """``fn`` over (N, ...) frames in passes of exactly ``chunk`` (the last padded with
    zeros), so every frame goes through the same kernel shapes whatever it is batched with:
    an image's embeddings do not depend on the step that encoded it, and a cached encoding
    equals a fresh one (``SpanEncoder``'s contract)."""
    n = frames.shape[0]
    pad = -n % chunk
    if pad:
        frames = torch.cat([frames, frames.new_zeros(pad, *frames.shape[1:])])
    outs = [fn(frames[i : i + chunk]) for i in range(0, frames.shape[0], chunk)]
    return (torch.cat(outs) if len(outs) > 1 else outs[0])[:n]
