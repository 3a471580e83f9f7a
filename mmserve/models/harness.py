"""Run a model over whole sequences without the engine: for tests, parity checks and tools.

Allocates a private KV cache with contiguous block tables and runs one prefill
forward per call; ``greedy`` extends a prompt one decode step at a time.
"""

from __future__ import annotations

import torch

from mmserve.kernels.attention import AttentionMetadata
from mmserve.models.base import CausalLM


class SequenceRunner:
    """A single-sequence paged-KV driver for a model (block size 16)."""

    def __init__(self, model: CausalLM, max_len: int = 1024, block_size: int = 16) -> None:
        self.model, self.block_size = model, block_size
        p = next(model.parameters())
        blocks = -(-max_len // block_size)
        self.kv = torch.zeros(
            model.num_layers,
            2,
            blocks,
            block_size,
            model.num_kv_heads,
            model.head_dim,
            dtype=p.dtype,
            device=p.device,
        )
        self.table = list(range(blocks))
        self.device = p.device

    @torch.inference_mode()
    def step(self, ids: list[int], start: int, embeds: torch.Tensor | None = None) -> torch.Tensor:
        """Run tokens at positions start.. (KV before ``start`` already cached) -> logits (n, V)."""
        n = len(ids) if embeds is None else embeds.shape[0]
        meta = AttentionMetadata.build([n], [start + n], [self.table], self.block_size, self.device)
        positions = torch.arange(start, start + n, device=self.device)
        input_ids = torch.tensor(ids, device=self.device) if embeds is None else None
        hidden = self.model(input_ids, positions, meta, self.kv, inputs_embeds=embeds)
        return self.model.compute_logits(hidden)

    def greedy(self, prompt: list[int], max_new: int) -> list[int]:
        logits = self.step(prompt, 0)
        out = [int(logits[-1].argmax())]
        while len(out) < max_new:
            logits = self.step(out[-1:], len(prompt) + len(out) - 1)
            out.append(int(logits[-1].argmax()))
        return out
