"""Self-speculation: the target's first layers, its final norm and its LM head as the drafter.

For models with no small sibling (LayerSkip / "draft & verify" style early exit).
``TruncatedModel`` is a ``CausalLM`` view of a loaded target that runs only layers
``0..L-1``, then the target's own final norm and logits. It owns no weights: every
tensor is the target's (no copies), so it costs only its own KV (``L`` layers of it).
``SelfDrafter`` feeds that view to the same machinery as ``DraftModelDrafter``.

Supported families: the Llama family (one RoPE table, plain RMSNorm) and Gemma 3 (local
and global RoPE per layer, norms offset by 1, logit soft-capping via ``compute_logits``).
"""

from __future__ import annotations

import torch
from torch import nn

from mmserve.kernels.attention import AttentionMetadata, KVLike, kv_layer
from mmserve.kernels.norm import rms_norm
from mmserve.kernels.rope import RotaryTable
from mmserve.models.base import CausalLM
from mmserve.models.gemma3 import Gemma3ForCausalLM
from mmserve.models.llama import LlamaForCausalLM
from mmserve.speculative.draft_model import DraftModelDrafter


class TruncatedModel(CausalLM):
    """The first ``num_layers`` layers of ``target`` + its final norm + its LM head."""

    def __init__(self, target: CausalLM, num_layers: int) -> None:
        super().__init__()
        if not isinstance(target, LlamaForCausalLM | Gemma3ForCausalLM):
            raise ValueError(
                f"self-drafting supports Llama-family and Gemma 3 models, got "
                f"{type(target).__name__}"
            )
        if not 1 <= num_layers <= target.num_layers:
            raise ValueError(
                f"draft num_layers must be in 1..{target.num_layers} (the "
                f"target's layer count), got {num_layers}"
            )
        # a submodule: the view shares the target's parameters
        self.target: LlamaForCausalLM | Gemma3ForCausalLM = target
        self.num_layers = num_layers
        self.num_kv_heads, self.head_dim = target.num_kv_heads, target.head_dim
        self.vocab_size = target.vocab_size
        self.max_position_embeddings = target.max_position_embeddings
        self.embed_tokens = target.embed_tokens
        self._norm_offset = 1.0 if isinstance(target, Gemma3ForCausalLM) else 0.0

    @classmethod
    def from_hf_config(cls, config: dict) -> CausalLM:
        raise TypeError(
            "a TruncatedModel is a view of a loaded model: build it with "
            "TruncatedModel(target, num_layers)"
        )

    def load_hf_state_dict(self, state_dict: dict[str, torch.Tensor]) -> None:
        raise TypeError("a TruncatedModel owns no weights: load them into its target")

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.target.embed(input_ids)  # Gemma scales its embeddings

    def forward(
        self,
        input_ids: torch.Tensor | None,
        positions: torch.Tensor,
        meta: AttentionMetadata,
        kv_cache: KVLike,
        inputs_embeds: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """-> (N, H) hidden states after layer L-1 and the final norm; ``kv_cache`` has
        (at least) ``num_layers`` layers."""
        assert input_ids is not None or inputs_embeds is not None
        x = self.embed(input_ids) if inputs_embeds is None else inputs_embeds  # type: ignore[arg-type]
        for i in range(self.num_layers):
            x = self._layer(i)(x, positions, self._rope(i), meta, kv_layer(kv_cache, i))
        return rms_norm(x, self.target.norm, self.target.eps, self._norm_offset)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.target.compute_logits(hidden)  # Gemma soft-caps its logits

    def lm_head_weight(self) -> torch.Tensor:
        return self.target.lm_head_weight()

    def _layer(self, i: int) -> nn.Module:
        return self.target.layers[i]

    def _rope(self, i: int) -> RotaryTable:
        # resolved per call: the target may rebuild its tables (e.g. when moved)
        target = self.target
        if isinstance(target, Gemma3ForCausalLM):
            return target.local_rope if self._layer(i).sliding else target.global_rope
        return target.rope


class SelfDrafter(DraftModelDrafter):
    """``DraftModelDrafter`` over ``TruncatedModel(target, num_layers)``: no second model.

    ``num_blocks`` blocks of ``block_size`` tokens (default: as many as fit in
    ``draft_model.DEFAULT_KV_BYTES``) hold the draft KV of ``num_layers`` layers only; the
    target's KV pool is never touched.
    """

    def __init__(
        self,
        target: CausalLM,
        num_layers: int,
        num_blocks: int | None = None,
        block_size: int = 16,
        device: torch.device | str | None = None,
        temperature_aware: bool = False,
        seed: int = 0,
    ) -> None:
        super().__init__(
            TruncatedModel(target, num_layers),
            num_blocks,
            block_size,
            device,
            temperature_aware,
            seed,
        )
