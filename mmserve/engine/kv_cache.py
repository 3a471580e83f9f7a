"""The paged KV cache: one tensor allocated once, viewed per layer, written by slot index.

Layout ``(num_layers, 2, num_blocks, block_size, num_kv_heads, head_dim)``; index 0 of the
second axis is K, 1 is V. Position ``p`` of a sequence lives at flat slot
``block_id * block_size + offset`` (see ``BlockManager``), the same slot in every layer;
attention writes there through ``k.view(-1, Hkv, D)`` (``kernels.attention.write_kv``).
All layers share ``num_kv_heads`` and ``head_dim`` (true for Llama, Qwen, Gemma-3), so one
tensor suffices. The bookkeeping (which blocks belong to whom) lives in ``block_manager``
and is re-exported here.
"""

from __future__ import annotations

import torch

from mmserve.engine.block_manager import BlockManager, BlockTable, ExtraKey, block_hash
from mmserve.kernels.attention import LayerKV

__all__ = ["BlockManager", "BlockTable", "ExtraKey", "KVCache", "block_hash"]


class KVCache:
    """The KV memory of every layer: ``data`` is allocated once and never grows."""

    def __init__(
        self, num_layers: int, num_blocks: int, block_size: int, num_kv_heads: int,
        head_dim: int, dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu",
    ):
        for name, value in (("num_layers", num_layers), ("num_blocks", num_blocks),
                            ("block_size", block_size), ("num_kv_heads", num_kv_heads),
                            ("head_dim", head_dim)):
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        self.num_layers, self.num_blocks, self.block_size = num_layers, num_blocks, block_size
        self.num_kv_heads, self.head_dim = num_kv_heads, head_dim
        # (L, 2, N, B, Hkv, D); zeros, not empty: padded reads must never see NaN garbage
        self.data = torch.zeros(num_layers, 2, num_blocks, block_size, num_kv_heads, head_dim,
                                dtype=dtype, device=device)
        self._layers = [LayerKV(self.data[i, 0], self.data[i, 1]) for i in range(num_layers)]

    @staticmethod
    def bytes_per_block(
        num_layers: int, block_size: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype
    ) -> int:
        """Bytes one block takes across all layers, K and V."""
        return num_layers * 2 * block_size * num_kv_heads * head_dim * dtype.itemsize

    @classmethod
    def blocks_for_budget(
        cls, budget_bytes: int, num_layers: int, block_size: int, num_kv_heads: int,
        head_dim: int, dtype: torch.dtype,
    ) -> int:
        """How many blocks fit in ``budget_bytes``; ValueError if fewer than 2."""
        per_block = cls.bytes_per_block(num_layers, block_size, num_kv_heads, head_dim, dtype)
        num_blocks = budget_bytes // per_block
        if num_blocks < 2:
            raise ValueError(
                f"KV cache budget of {budget_bytes} bytes holds {num_blocks} blocks of "
                f"{per_block} bytes; at least 2 are needed: raise kv_cache_memory_mb or "
                f"lower block_size")
        return num_blocks

    @classmethod
    def from_budget(
        cls, budget_bytes: int, num_layers: int, block_size: int, num_kv_heads: int,
        head_dim: int, dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu",
    ) -> KVCache:
        num_blocks = cls.blocks_for_budget(budget_bytes, num_layers, block_size, num_kv_heads,
                                           head_dim, dtype)
        return cls(num_layers, num_blocks, block_size, num_kv_heads, head_dim, dtype, device)

    @property
    def dtype(self) -> torch.dtype:
        return self.data.dtype

    @property
    def device(self) -> torch.device:
        return self.data.device

    @property
    def nbytes(self) -> int:
        return self.data.numel() * self.data.element_size()

    def layer(self, i: int) -> LayerKV:
        """``(k, v)`` views of layer ``i``, each ``(num_blocks, block_size, Hkv, D)``."""
        return self._layers[i]

