"""Gemma 3 text models (e.g. Gemma-3-270M).

Differences from Llama: embeddings scaled by sqrt(hidden); RMSNorm weights are
offsets from 1; four norms per layer (pre/post attention, pre/post MLP); per-head
q/k RMSNorm; GELU-tanh MLP; attention scale from ``query_pre_attn_scalar``;
interleaved sliding-window (local) and full (global) layers with their own RoPE
bases.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from mmserve.kernels.attention import AttentionMetadata, KVLike, kv_layer
from mmserve.kernels.norm import rms_norm
from mmserve.kernels.rope import RotaryTable
from mmserve.models.base import CausalLM, load_into
from mmserve.models.layers import GatedMLP, SelfAttention, fuse_attention, fuse_mlp

MODEL_TYPES = ("gemma3_text",)


def layer_types(cfg: dict) -> list[str]:
    if cfg.get("layer_types"):
        return list(cfg["layer_types"])
    pattern = cfg.get("sliding_window_pattern", 6)
    return [
        "full_attention" if (i + 1) % pattern == 0 else "sliding_attention"
        for i in range(cfg["num_hidden_layers"])
    ]


def rope_bases(cfg: dict) -> tuple[tuple[float, dict | None], tuple[float, dict | None]]:
    """((global theta, scaling), (local theta, scaling)) from old or new config keys."""
    params = cfg.get("rope_parameters") or {}
    if "full_attention" in params:
        full, local = params["full_attention"], params["sliding_attention"]
        scale = full if full.get("rope_type") not in (None, "default") else None
        return (full["rope_theta"], scale), (local["rope_theta"], None)
    scaling = cfg.get("rope_scaling")
    return (
        (cfg.get("rope_theta", 1_000_000.0), scaling),
        (cfg.get("rope_local_base_freq", 10_000.0), None),
    )


def gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    return F.gelu(x, approximate="tanh")


class Gemma3Layer(nn.Module):
    def __init__(self, cfg: dict, sliding: bool) -> None:
        super().__init__()
        h, eps = cfg["hidden_size"], cfg.get("rms_norm_eps", 1e-6)
        self.eps, self.sliding = eps, sliding
        head_dim = cfg.get("head_dim", 256)
        self.attn = SelfAttention(
            h,
            cfg["num_attention_heads"],
            cfg["num_key_value_heads"],
            head_dim,
            bias=bool(cfg.get("attention_bias", False)),
            qk_norm=True,
            norm_eps=eps,
            norm_offset=1.0,
            scale=cfg.get("query_pre_attn_scalar", head_dim) ** -0.5,
            window=cfg.get("sliding_window") if sliding else None,
        )
        self.mlp = GatedMLP(h, cfg["intermediate_size"], gelu_tanh)
        names = ("input_norm", "post_attn_norm", "pre_mlp_norm", "post_mlp_norm")
        for name in names:
            setattr(self, name, nn.Parameter(torch.empty(h)))

    def forward(self, x, positions, rope, meta, kv):
        a = self.attn(rms_norm(x, self.input_norm, self.eps, 1.0), positions, rope, meta, kv)
        x = x + rms_norm(a, self.post_attn_norm, self.eps, 1.0)
        m = self.mlp(rms_norm(x, self.pre_mlp_norm, self.eps, 1.0))
        return x + rms_norm(m, self.post_mlp_norm, self.eps, 1.0)


class Gemma3ForCausalLM(CausalLM):
    def __init__(self, cfg: dict) -> None:
        super().__init__()
        h = cfg["hidden_size"]
        self.num_layers = cfg["num_hidden_layers"]
        self.num_kv_heads = cfg["num_key_value_heads"]
        self.head_dim = cfg.get("head_dim", 256)
        self.vocab_size = cfg["vocab_size"]
        self.max_position_embeddings = min(cfg.get("max_position_embeddings", 32768), 32768)
        self.eps = cfg.get("rms_norm_eps", 1e-6)
        self.softcap = cfg.get("final_logit_softcapping")
        self.normalizer = h**0.5
        self.kinds = layer_types(cfg)
        self.embed_tokens = nn.Embedding(self.vocab_size, h)
        self.layers = nn.ModuleList(
            Gemma3Layer(cfg, kind == "sliding_attention") for kind in self.kinds
        )
        self.norm = nn.Parameter(torch.empty(h))
        self.cfg = cfg

    def _make_ropes(self) -> None:
        (g_theta, g_scale), (l_theta, l_scale) = rope_bases(self.cfg)
        n = self.max_position_embeddings
        self.global_rope = RotaryTable(self.head_dim, g_theta, n, g_scale)
        self.local_rope = RotaryTable(self.head_dim, l_theta, n, l_scale)

    @classmethod
    def from_hf_config(cls, config: dict) -> Gemma3ForCausalLM:
        with torch.device("meta"):
            model = cls(config)
        model._make_ropes()
        return model

    def load_hf_state_dict(self, sd: dict[str, torch.Tensor]) -> None:
        sd = {k.removeprefix("language_model."): v for k, v in sd.items()}
        out = {
            "embed_tokens.weight": sd["model.embed_tokens.weight"],
            "norm": sd["model.norm.weight"],
        }
        for i in range(self.num_layers):
            p = f"model.layers.{i}"
            out.update(fuse_attention(sd, f"{p}.self_attn", f"layers.{i}.attn"))
            out.update(fuse_mlp(sd, f"{p}.mlp", f"layers.{i}.mlp"))
            for ours, theirs in (
                ("input_norm", "input_layernorm"),
                ("post_attn_norm", "post_attention_layernorm"),
                ("pre_mlp_norm", "pre_feedforward_layernorm"),
                ("post_mlp_norm", "post_feedforward_layernorm"),
            ):
                out[f"layers.{i}.{ours}"] = sd[f"{p}.{theirs}.weight"]
        load_into(self, out)

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.embed_tokens(input_ids)
        return x * torch.tensor(self.normalizer, dtype=x.dtype)

    def forward(
        self,
        input_ids: torch.Tensor | None,
        positions: torch.Tensor,
        meta: AttentionMetadata,
        kv_cache: KVLike,
        inputs_embeds: torch.Tensor | None = None,
    ) -> torch.Tensor:
        assert input_ids is not None or inputs_embeds is not None
        x = self.embed(input_ids) if inputs_embeds is None else inputs_embeds  # type: ignore[arg-type]
        for i, layer in enumerate(self.layers):
            rope = self.local_rope if layer.sliding else self.global_rope
            x = layer(x, positions, rope, meta, kv_layer(kv_cache, i))
        return rms_norm(x, self.norm, self.eps, 1.0)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = super().compute_logits(hidden)
        if self.softcap:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits
