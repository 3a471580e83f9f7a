"""A plain-torch Llama for training, with HF transformers' weight names and arithmetic.

What it trains is served by the engine's own ``LlamaForCausalLM`` (loaded from the HF
layout this writes); a test holds its logits to HF transformers' on the same weights.
Tied embeddings, GQA, RoPE (rotate-half, theta from the config), RMSNorm in float32.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

SIZES: dict[str, dict] = {
    # the shipped voice: ~7.5M parameters, 15 MB in float16 (under 16 MiB a file, which is
    # what a GPU machine's output may hold)
    "base": dict(
        hidden_size=384,
        num_hidden_layers=5,
        num_attention_heads=6,
        num_key_value_heads=2,
        intermediate_size=640,
    ),
    # a model one CPU thread trains in hours, for a voice when no GPU is at hand
    "small": dict(
        hidden_size=256,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=512,
    ),
    # a toy, for tests of the recipe's plumbing
    "tiny": dict(
        hidden_size=64,
        num_hidden_layers=1,
        num_attention_heads=1,
        num_key_value_heads=1,
        intermediate_size=128,
    ),
}


def llama_config(size: str, vocab: int, max_len: int = 2048) -> dict:
    if size not in SIZES:
        raise ValueError(f"unknown backbone size {size!r}; known: {', '.join(SIZES)}")
    return {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        **SIZES[size],
        "vocab_size": vocab,
        "tie_word_embeddings": True,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "max_position_embeddings": max_len,
        "head_dim": 64,
        "hidden_act": "silu",
        "attention_bias": False,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "pad_token_id": 0,
        "torch_dtype": "float16",
    }


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


class Attention(nn.Module):
    def __init__(self, cfg: dict) -> None:
        super().__init__()
        h, d = cfg["hidden_size"], cfg["head_dim"]
        self.heads, self.kv, self.d = cfg["num_attention_heads"], cfg["num_key_value_heads"], d
        self.q_proj = nn.Linear(h, self.heads * d, bias=False)
        self.k_proj = nn.Linear(h, self.kv * d, bias=False)
        self.v_proj = nn.Linear(h, self.kv * d, bias=False)
        self.o_proj = nn.Linear(self.heads * d, h, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.heads, self.d).transpose(1, 2)  # (B, H, T, D)
        k = self.k_proj(x).view(b, t, self.kv, self.d).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.kv, self.d).transpose(1, 2)
        q, k = q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin
        rep = self.heads // self.kv
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(o.transpose(1, 2).reshape(b, t, -1))


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


class MLP(nn.Module):
    def __init__(self, cfg: dict) -> None:
        super().__init__()
        h, i = cfg["hidden_size"], cfg["intermediate_size"]
        self.gate_proj = nn.Linear(h, i, bias=False)
        self.up_proj = nn.Linear(h, i, bias=False)
        self.down_proj = nn.Linear(i, h, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Layer(nn.Module):
    def __init__(self, cfg: dict, dropout: float = 0.0) -> None:
        super().__init__()
        self.self_attn = Attention(cfg)
        self.mlp = MLP(cfg)
        self.drop = nn.Dropout(dropout)
        self.input_layernorm = RMSNorm(cfg["hidden_size"], cfg["rms_norm_eps"])
        self.post_attention_layernorm = RMSNorm(cfg["hidden_size"], cfg["rms_norm_eps"])

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.drop(self.self_attn(self.input_layernorm(x), cos, sin))
        return x + self.drop(self.mlp(self.post_attention_layernorm(x)))


class Inner(nn.Module):
    def __init__(self, cfg: dict, dropout: float = 0.0) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg["vocab_size"], cfg["hidden_size"])
        self.layers = nn.ModuleList(Layer(cfg, dropout) for _ in range(cfg["num_hidden_layers"]))
        self.norm = RMSNorm(cfg["hidden_size"], cfg["rms_norm_eps"])


class TrainLlama(nn.Module):
    """``state_dict()`` keys are HF's (``model.layers.0.self_attn.q_proj.weight``, ...).

    ``dropout`` (training only; ``eval()`` switches it off, and the served model has
    none) drops each residual branch's output: a regulariser for a small corpus."""

    inv_freq: torch.Tensor

    def __init__(self, cfg: dict, dropout: float = 0.0) -> None:
        super().__init__()
        self.cfg = cfg
        self.model = Inner(cfg, dropout)
        d = cfg["head_dim"]
        inv = 1.0 / (cfg["rope_theta"] ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
        self.register_buffer("inv_freq", inv, persistent=False)
        self.apply(self._init)

    @staticmethod
    def _init(m: nn.Module) -> None:
        if isinstance(m, nn.Linear | nn.Embedding):
            nn.init.normal_(m.weight, std=0.02)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """(B, T) ids -> (B, T, V) float32 logits."""
        pos = torch.arange(ids.shape[1], device=ids.device, dtype=torch.float32)
        freqs = pos[:, None] * self.inv_freq[None]
        emb = torch.cat([freqs, freqs], dim=-1)
        x = self.model.embed_tokens(ids)
        cos, sin = emb.cos().to(x.dtype), emb.sin().to(x.dtype)
        for layer in self.model.layers:
            x = layer(x, cos, sin)
        x = self.model.norm(x)
        return (x @ self.model.embed_tokens.weight.T).float()
