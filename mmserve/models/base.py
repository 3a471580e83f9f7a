"""The interface every model family implements for the engine.

Token ids (or embeddings) in, hidden states out; the engine owns the KV cache and
passes each layer its view. Models never see HF cache objects.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch
from torch import nn

from mmserve.kernels.attention import AttentionMetadata, KVLike
from mmserve.kernels.linear import logits_linear
from mmserve.kernels.q8 import Q8Weight


class CausalLM(nn.Module, ABC):
    """A decoder-only LM over a flat token batch.

    Invariant: a token's hidden state depends only on its own sequence's tokens
    (or embedding spans) at positions up to its own — never on the batch.
    """

    num_layers: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    max_position_embeddings: int
    embed_tokens: nn.Embedding
    # the LM head's weight as Q8_0 blocks, when it is exactly that (``attach_q8_head``), and
    # which weight they were checked against (id, address, dtype, version)
    lm_head_q8: Q8Weight | None = None
    _q8_checked: tuple | None = None

    @classmethod
    @abstractmethod
    def from_hf_config(cls, config: dict) -> CausalLM:
        """Build with empty weights from an HF ``config.json`` dict."""

    @abstractmethod
    def load_hf_state_dict(self, state_dict: dict[str, torch.Tensor]) -> None:
        """Load weights named as in HF transformers (fusing q/k/v and gate/up)."""

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        """(N,) ids -> (N, H) input embeddings; embedding spans live in this same space."""
        return self.embed_tokens(input_ids)

    @abstractmethod
    def forward(
        self,
        input_ids: torch.Tensor | None,
        positions: torch.Tensor,
        meta: AttentionMetadata,
        kv_cache: KVLike,
        inputs_embeds: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """-> (N, H) final hidden states. ``kv_cache``: a ``KVCache`` or a plain
        (layers, 2, blocks, bs, Hkv, D) tensor (see ``kernels.attention.kv_layer``)."""

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """(M, H) -> (M, V) float32 logits."""
        return logits_linear(hidden, self.lm_head_weight(), self.q8_head())

    def lm_head_weight(self) -> torch.Tensor:
        return self.embed_tokens.weight

    def placed(self) -> None:
        """Called once the weights are on their device and dtype (``build_model``), before
        any CUDA graph holds their addresses: a family may lay them out anew here."""

    def attach_q8_head(self, blocks: Q8Weight) -> bool:
        """Let the LM head read ``blocks`` (``q8.factor_q8`` of its float32 weight, as a
        GGUF's Q8_0 token embedding gives) if they dequantize to the placed weight bit for
        bit; -> whether they do. Speed only: ``logits_linear`` computes the same bits."""
        w = self.lm_head_weight()
        blocks = blocks.to(w.device)
        ok = blocks.matches(w.detach())
        self.lm_head_q8 = blocks if ok else None
        self._q8_checked = _weight_key(w) if ok else None
        return ok

    def q8_head(self) -> Q8Weight | None:
        """The attached blocks while the LM head's weight is still the one they were checked
        against (not moved, cast, replaced or written in place since), else None."""
        if self.lm_head_q8 is None or self._q8_checked != _weight_key(self.lm_head_weight()):
            return None
        return self.lm_head_q8


def _weight_key(w: torch.Tensor) -> tuple:
    # a model built under inference_mode has inference tensors, which keep no version
    return id(w), w.data_ptr(), w.dtype, None if w.is_inference() else w._version


def load_into(module: nn.Module, tensors: dict[str, torch.Tensor]) -> None:
    """Copy tensors into parameters by name; every parameter must be covered."""
    params = dict(module.named_parameters())
    missing = [name for name in params if name not in tensors]
    unexpected = [name for name in tensors if name not in params]
    if missing or unexpected:
        raise ValueError(f"weight mismatch: missing {missing[:5]}, unexpected {unexpected[:5]}")
    for name, p in params.items():
        t = tensors[name]
        if t.shape != p.shape:
            raise ValueError(f"{name}: checkpoint shape {tuple(t.shape)} != {tuple(p.shape)}")
        owner_name, _, leaf = name.rpartition(".")
        owner = module.get_submodule(owner_name) if owner_name else module
        # replace (not copy into) the parameter: models are built on the meta device
        setattr(owner, leaf, nn.Parameter(t.to(p.dtype).contiguous(), requires_grad=False))
