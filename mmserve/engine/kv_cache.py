"""The paged KV cache: one tensor allocated once, viewed per layer, written by slot index.

Layout ``(num_layers, 2, num_blocks, block_size, num_kv_heads, head_dim)``; index 0 of the
second axis is K, 1 is V. Position ``p`` of a sequence lives at flat slot
``block_id * block_size + offset`` (see ``BlockManager``), the same slot in every layer;
attention writes there through ``k.view(-1, Hkv, D)`` (``kernels.attention.write_kv``).
All layers share ``num_kv_heads`` and ``head_dim`` (true for Llama, Qwen, Gemma-3), so one
tensor suffices. The bookkeeping (which blocks belong to whom) lives in ``block_manager``
and is re-exported here.

fp8. With ``dtype=torch.float8_e4m3fn`` the cache stores e4m3 values plus ``scales``
``(num_layers, 2, num_blocks, block_size, num_kv_heads)`` float32: one scale per token and
kv head, computed from the vector itself when it is written (``kernels.fp8``), so no
calibration is needed. A block then costs ``D + 4`` bytes per token and head instead of
``2 D`` (bf16), so a memory budget holds about twice the blocks. Blocks are shared by
refcount and never copied, so nothing else has to carry the scales.
"""

from __future__ import annotations

import torch

from mmserve.config import FP8_KV_CACHE_DTYPES
from mmserve.engine.block_manager import BlockManager, BlockTable, ExtraKey, block_hash
from mmserve.kernels.attention import LayerKV
from mmserve.kernels.fp8 import FP8_DTYPE, is_fp8

__all__ = ["BlockManager", "BlockTable", "ExtraKey", "KVCache", "block_hash", "kv_cache_dtype"]

SCALE_DTYPE = torch.float32


def kv_cache_dtype(name: str, model_dtype: torch.dtype) -> torch.dtype:
    """``EngineConfig.kv_cache_dtype`` -> the cache's storage dtype ("auto": the model's)."""
    if name in FP8_KV_CACHE_DTYPES:
        return FP8_DTYPE
    assert name == "auto", f"unvalidated kv_cache_dtype {name!r}"
    return model_dtype


class KVCache:
    """The KV memory of every layer: ``data`` is allocated once and never grows."""

    def __init__(
        self,
        num_layers: int,
        num_blocks: int,
        block_size: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
    ):
        for name, value in (
            ("num_layers", num_layers),
            ("num_blocks", num_blocks),
            ("block_size", block_size),
            ("num_kv_heads", num_kv_heads),
            ("head_dim", head_dim),
        ):
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        _check_dtype(dtype)
        self.num_layers, self.num_blocks, self.block_size = num_layers, num_blocks, block_size
        self.num_kv_heads, self.head_dim = num_kv_heads, head_dim
        # (L, 2, N, B, Hkv, D); zeros, not empty: padded reads must never see NaN garbage
        self.data = torch.zeros(
            num_layers,
            2,
            num_blocks,
            block_size,
            num_kv_heads,
            head_dim,
            dtype=dtype,
            device=device,
        )
        # (L, 2, N, B, Hkv) per-token, per-head scales of an fp8 cache; zeros read back as zeros
        self.scales = (
            torch.zeros(
                num_layers,
                2,
                num_blocks,
                block_size,
                num_kv_heads,
                dtype=SCALE_DTYPE,
                device=device,
            )
            if is_fp8(dtype)
            else None
        )
        self._layers = [self._layer_views(i) for i in range(num_layers)]

    def _layer_views(self, i: int) -> LayerKV:
        if self.scales is None:
            return LayerKV(self.data[i, 0], self.data[i, 1])
        return LayerKV(self.data[i, 0], self.data[i, 1], self.scales[i, 0], self.scales[i, 1])

    @staticmethod
    def bytes_per_block(
        num_layers: int, block_size: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype
    ) -> int:
        """Bytes one block takes across all layers, K and V (and their scales, for fp8)."""
        _check_dtype(dtype)
        per_vector = head_dim * dtype.itemsize + (SCALE_DTYPE.itemsize if is_fp8(dtype) else 0)
        return num_layers * 2 * block_size * num_kv_heads * per_vector

    @classmethod
    def blocks_for_budget(
        cls,
        budget_bytes: int,
        num_layers: int,
        block_size: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
    ) -> int:
        """How many blocks fit in ``budget_bytes``; ValueError if fewer than 2."""
        per_block = cls.bytes_per_block(num_layers, block_size, num_kv_heads, head_dim, dtype)
        num_blocks = budget_bytes // per_block
        if num_blocks < 2:
            raise ValueError(
                f"KV cache budget of {budget_bytes} bytes holds {num_blocks} blocks of "
                f"{per_block} bytes; at least 2 are needed: raise kv_cache_memory_mb or "
                f"lower block_size"
            )
        return num_blocks

    @classmethod
    def from_budget(
        cls,
        budget_bytes: int,
        num_layers: int,
        block_size: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
    ) -> KVCache:
        num_blocks = cls.blocks_for_budget(
            budget_bytes, num_layers, block_size, num_kv_heads, head_dim, dtype
        )
        return cls(num_layers, num_blocks, block_size, num_kv_heads, head_dim, dtype, device)

    @property
    def dtype(self) -> torch.dtype:
        return self.data.dtype

    @property
    def device(self) -> torch.device:
        return self.data.device

    @property
    def nbytes(self) -> int:
        scales = 0 if self.scales is None else self.scales.numel() * self.scales.element_size()
        return self.data.numel() * self.data.element_size() + scales

    def layer(self, i: int) -> LayerKV:
        """``(k, v)`` views of layer ``i``, each ``(num_blocks, block_size, Hkv, D)``; an fp8
        cache adds ``(k_scale, v_scale)`` views, each ``(num_blocks, block_size, Hkv)``."""
        return self._layers[i]


def _check_dtype(dtype: torch.dtype) -> None:
    if dtype.is_floating_point and dtype.itemsize == 1 and not is_fp8(dtype):
        raise ValueError(f"fp8 KV cache stores {FP8_DTYPE} only, got {dtype}")
