"""The Llama family: Llama 2/3, Mistral, Qwen2, Qwen3 and SmolLM2, driven by config.json.

Differences handled from the config: GQA (``num_key_value_heads``), RoPE theta and
scaling, Qwen3's per-head q/k RMSNorm, Qwen2's QKV bias (``attention_bias``), tied
embeddings, Mistral's sliding window.
"""

from __future__ import annotations

from typing import cast

import torch
import torch.nn.functional as F
from torch import nn

from mmserve.kernels import decode_stack
from mmserve.kernels.attention import AttentionMetadata, KVLike, kv_layer
from mmserve.kernels.norm import rms_norm
from mmserve.kernels.rope import RotaryTable
from mmserve.models.base import CausalLM, load_into
from mmserve.models.layers import GatedMLP, SelfAttention, fuse_attention, fuse_mlp

MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")


def hf_tensor_shapes(cfg: dict) -> dict[str, tuple[int, ...]]:
    """The tensors of an HF Llama checkpoint of config ``cfg`` and their shapes (what
    ``load_hf_state_dict`` reads), in a fixed order: the embedding, the final norm, the
    head when untied, then each layer's. For building random-weight models."""
    h, inter = cfg["hidden_size"], cfg["intermediate_size"]
    d = cfg.get("head_dim") or h // cfg["num_attention_heads"]
    q = cfg["num_attention_heads"] * d
    kv = (cfg.get("num_key_value_heads") or cfg["num_attention_heads"]) * d
    shapes: dict[str, tuple[int, ...]] = {
        "model.embed_tokens.weight": (cfg["vocab_size"], h),
        "model.norm.weight": (h,),
    }
    if not cfg.get("tie_word_embeddings", False):
        shapes["lm_head.weight"] = (cfg["vocab_size"], h)
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}"
        shapes |= {
            f"{p}.self_attn.q_proj.weight": (q, h),
            f"{p}.self_attn.k_proj.weight": (kv, h),
            f"{p}.self_attn.v_proj.weight": (kv, h),
            f"{p}.self_attn.o_proj.weight": (h, q),
            f"{p}.mlp.gate_proj.weight": (inter, h),
            f"{p}.mlp.up_proj.weight": (inter, h),
            f"{p}.mlp.down_proj.weight": (h, inter),
            f"{p}.input_layernorm.weight": (h,),
            f"{p}.post_attention_layernorm.weight": (h,),
        }
    return shapes


def rope_settings(cfg: dict) -> tuple[float, dict | None]:
    """(theta, scaling) from either the classic keys or transformers 5's ``rope_parameters``."""
    params = cfg.get("rope_parameters") or {}
    theta = cfg.get("rope_theta", params.get("rope_theta", 10000.0))
    scaling = cfg.get("rope_scaling") or (
        params if params.get("rope_type") not in (None, "default") else None
    )
    return float(theta), scaling


class LlamaLayer(nn.Module):
    def __init__(self, cfg: dict, head_dim: int, qk_norm: bool, bias: bool) -> None:
        super().__init__()
        h, eps = cfg["hidden_size"], cfg.get("rms_norm_eps", 1e-6)
        self.eps = eps
        self.attn = SelfAttention(
            h,
            cfg["num_attention_heads"],
            cfg.get("num_key_value_heads") or cfg["num_attention_heads"],
            head_dim,
            bias=bias,
            qk_norm=qk_norm,
            norm_eps=eps,
            norm_offset=0.0,
            scale=head_dim**-0.5,
            window=cfg.get("sliding_window")
            if cfg.get("use_sliding_window", cfg["model_type"] == "mistral")
            else None,
        )
        self.mlp = GatedMLP(h, cfg["intermediate_size"], F.silu)
        self.input_norm = nn.Parameter(torch.empty(h))
        self.post_attn_norm = nn.Parameter(torch.empty(h))

    def forward(self, x, positions, rope, meta, kv):
        # x + attn(norm(x)), then x + mlp(norm(x)): on CUDA six launches (kernels.fused)
        x = self.attn.residual_forward(x, self.input_norm, self.eps, positions, rope, meta, kv)
        return self.mlp.residual_forward(x, self.post_attn_norm, self.eps)


class LlamaForCausalLM(CausalLM):
    def __init__(self, cfg: dict) -> None:
        super().__init__()
        if cfg.get("model_type") not in MODEL_TYPES:
            raise ValueError(f"model_type {cfg.get('model_type')!r} is not one of {MODEL_TYPES}")
        h = cfg["hidden_size"]
        self.num_layers = cfg["num_hidden_layers"]
        self.num_kv_heads = cfg.get("num_key_value_heads") or cfg["num_attention_heads"]
        self.head_dim = cfg.get("head_dim") or h // cfg["num_attention_heads"]
        self.vocab_size = cfg["vocab_size"]
        self.max_position_embeddings = cfg.get("max_position_embeddings", 4096)
        self.eps = cfg.get("rms_norm_eps", 1e-6)
        self.tied = bool(cfg.get("tie_word_embeddings", False))
        qk_norm = cfg["model_type"] == "qwen3"
        bias = cfg["model_type"] == "qwen2" or bool(cfg.get("attention_bias", False))
        self.num_heads = cfg["num_attention_heads"]
        self.embed_tokens = nn.Embedding(self.vocab_size, h)
        self.layers = nn.ModuleList(
            LlamaLayer(cfg, self.head_dim, qk_norm, bias) for _ in range(self.num_layers)
        )
        self.norm = nn.Parameter(torch.empty(h))
        self.lm_head = None if self.tied else nn.Parameter(torch.empty(self.vocab_size, h))
        theta, scaling = rope_settings(cfg)
        self.rope = RotaryTable(self.head_dim, theta, self.max_position_embeddings, scaling)
        attn = cast(LlamaLayer, self.layers[0]).attn
        # what the one-launch decode stack covers (kernels/decode_stack.py)
        self.stack_ok = (
            not qk_norm
            and not bias
            and attn.window is None
            and self.head_dim & (self.head_dim - 1) == 0
        )

    @classmethod
    def from_hf_config(cls, config: dict) -> LlamaForCausalLM:
        with torch.device("meta"):
            model = cls(config)
        theta, scaling = rope_settings(config)  # the table must be real, not meta
        model.rope = RotaryTable(model.head_dim, theta, model.max_position_embeddings, scaling)
        return model

    def load_hf_state_dict(self, sd: dict[str, torch.Tensor]) -> None:
        out = {
            "embed_tokens.weight": sd["model.embed_tokens.weight"],
            "norm": sd["model.norm.weight"],
        }
        if not self.tied:
            out["lm_head"] = sd.get("lm_head.weight", sd["model.embed_tokens.weight"])
        for i in range(self.num_layers):
            p = f"model.layers.{i}"
            out.update(fuse_attention(sd, f"{p}.self_attn", f"layers.{i}.attn"))
            out.update(fuse_mlp(sd, f"{p}.mlp", f"layers.{i}.mlp"))
            out[f"layers.{i}.input_norm"] = sd[f"{p}.input_layernorm.weight"]
            out[f"layers.{i}.post_attn_norm"] = sd[f"{p}.post_attention_layernorm.weight"]
        load_into(self, out)

    def forward(
        self,
        input_ids: torch.Tensor | None,
        positions: torch.Tensor,
        meta: AttentionMetadata,
        kv_cache: KVLike,
        inputs_embeds: torch.Tensor | None = None,
    ) -> torch.Tensor:
        assert input_ids is not None or inputs_embeds is not None
        # the stack gathers the embedding rows in its input kernel (ids and the table);
        # embeddings given (image or audio spans) go in as rows
        ids = input_ids if inputs_embeds is None else None
        x: torch.Tensor = self.embed_tokens.weight if ids is not None else inputs_embeds  # type: ignore[assignment]
        if decode_stack.applies(
            x, kv_cache, self.layers, rows=None if ids is None else ids.shape[0]
        ):
            # a step of <= 16 tokens on CUDA: every layer in one persistent launch, the
            # same bits
            x = decode_stack.run(
                x,
                self.layers,
                positions,
                meta,
                kv_cache,
                self.rope,
                heads=self.num_heads,
                kv_heads=self.num_kv_heads,
                eps=self.eps,
                scale=self.head_dim**-0.5,
                ids=ids,
            )
        else:
            if ids is not None:
                x = self.embed(ids)
            for i, layer in enumerate(self.layers):
                x = layer(x, positions, self.rope, meta, kv_layer(kv_cache, i))
        return rms_norm(x, self.norm, self.eps)

    def placed(self) -> None:
        """On CUDA, stack the layer weights for the one-launch decode (kernels.decode_stack)."""
        if not (self.stack_ok and self.norm.is_cuda):
            return
        layer = cast(LlamaLayer, self.layers[0])
        qkv, hidden = layer.attn.qkv_weight.shape
        if decode_stack.fits_one_wave(
            hidden, qkv, layer.mlp.inter, self.num_kv_heads, self.norm.device
        ):
            decode_stack.stacked_weights(self.layers)

    def lm_head_weight(self) -> torch.Tensor:
        return self.embed_tokens.weight if self.lm_head is None else self.lm_head
