"""Paged attention, batch-invariant plain-torch reference.

The contract of every attention backend: for each query token, the output depends
only on that token's query, the keys/values of its own sequence at positions
``<= its position`` (within the sliding window, if any) and nothing else — not
the number of sequences in the step, not how many query tokens its sequence
brings (one decode token, a prefill chunk, or k+1 verify tokens).

The reference meets it with fixed-shape products: query rows are padded to tiles
of ``ROW_TILE`` rows, keys are split into chunks of ``KEY_CHUNK`` positions,
every (tile, chunk) product is one batched matmul of a fixed shape, the max is
exact, and the per-chunk partial sums are added in chunk order. Chunks past a
row's context hold only masked keys: they add exact zeros, so a row sees the same
sequence of floating-point operations whatever else is in its tile or step.

An fp8 cache (``LayerKV`` with scales) is written quantised per token and kv head
(:mod:`mmserve.kernels.fp8`) and dequantised per gathered slot before the same products,
so the contract holds for it too.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

import torch

from mmserve.kernels.fp8 import dequantize_fp8, is_fp8, quantize_fp8
from mmserve.kernels.triton_dispatch import use_triton

ROW_TILE = 8
KEY_CHUNK = 64


class LayerKV(NamedTuple):
    """One layer's paged cache: ``k``/``v`` (blocks, block_size, Hkv, D).

    ``k_scale``/``v_scale`` (blocks, block_size, Hkv) float32 are set when the cache
    stores fp8: a stored vector times its scale is the key/value (None: stored as is).
    """

    k: torch.Tensor
    v: torch.Tensor
    k_scale: torch.Tensor | None = None
    v_scale: torch.Tensor | None = None


class HasLayers(Protocol):
    def layer(self, i: int) -> LayerKV: ...


KVLike = torch.Tensor | HasLayers  # (L, 2, blocks, bs, Hkv, D) tensor, or a KVCache


def kv_layer(kv: KVLike, i: int) -> LayerKV:
    """Layer ``i`` of a whole-model cache: a KVCache, or a plain (L, 2, ...) tensor."""
    if isinstance(kv, torch.Tensor):
        return LayerKV(kv[i, 0], kv[i, 1])
    return kv.layer(i)


@dataclass
class SeqSlice:
    """One sequence's part of a step, with the gather indices shared by all layers."""

    start: int  # first of its query rows in the flat token batch
    num_queries: int
    context_len: int  # cached + new tokens after this step
    key_slots: torch.Tensor  # (Lpad,) flat cache slots for key positions 0..Lpad-1 (pad: slot 0)
    _masks: dict[int | None, torch.Tensor] = field(default_factory=dict)

    def mask(self, window: int | None) -> torch.Tensor:
        """(num_queries, Lpad) bool: key visible to query (causal, optional sliding window)."""
        if window not in self._masks:
            lpad = self.key_slots.shape[0]
            qpos = torch.arange(self.context_len - self.num_queries, self.context_len)[:, None]
            kpos = torch.arange(lpad)[None, :]
            visible = kpos <= qpos
            if window is not None:
                visible &= qpos - kpos < window
            self._masks[window] = visible.to(self.key_slots.device)
        return self._masks[window]


@dataclass
class AttentionMetadata:
    """Everything attention needs about one step's flat token batch."""

    seqs: list[SeqSlice]
    slot_mapping: torch.Tensor  # (N,) flat cache slot where each new token's K/V is written

    @classmethod
    def build(
        cls,
        query_lens: list[int],
        context_lens: list[int],
        block_tables: list[list[int]],
        block_size: int,
        device: torch.device,
    ) -> AttentionMetadata:
        seqs, slots, start = [], [], 0
        for n, ctx, table in zip(query_lens, context_lens, block_tables, strict=True):
            assert len(table) * block_size >= ctx, "block table too short for the context"
            blocks = torch.tensor(table, dtype=torch.long)
            all_slots = (blocks[:, None] * block_size + torch.arange(block_size)).flatten()
            lpad = -(-ctx // KEY_CHUNK) * KEY_CHUNK
            key_slots = torch.zeros(lpad, dtype=torch.long)
            key_slots[:ctx] = all_slots[:ctx]
            seqs.append(SeqSlice(start, n, ctx, key_slots.to(device)))
            slots.append(all_slots[ctx - n : ctx])
            start += n
        slot_mapping = torch.cat(slots).to(device) if slots else torch.zeros(0, dtype=torch.long)
        return cls(seqs, slot_mapping)


def write_kv(kv: LayerKV, k: torch.Tensor, v: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """Store new keys/values (N, Hkv, D) at their slots of the paged cache (blocks, bs, Hkv, D).

    An fp8 cache (``kv.k_scale`` set) stores each token's vectors quantised with their own
    per-kv-head scales (:mod:`mmserve.kernels.fp8`).
    """
    if use_triton(k):  # CUDA: one launch; negative slots (graph padding) are skipped
        from mmserve.kernels.triton_attention import cuda_write_kv

        return cuda_write_kv(kv.k, kv.v, k, v, slot_mapping, kv.k_scale, kv.v_scale)
    if kv.k_scale is None:
        _copy_rows(kv.k, k, slot_mapping)
        _copy_rows(kv.v, v, slot_mapping)
        return
    assert kv.v_scale is not None, "an fp8 cache has both scales"
    for cache, scales, x in ((kv.k, kv.k_scale, k), (kv.v, kv.v_scale, v)):
        values, scale = quantize_fp8(x)
        _copy_rows(cache, values, slot_mapping)
        scales.view(-1, x.shape[1]).index_copy_(0, slot_mapping, scale)


def _copy_rows(cache: torch.Tensor, rows: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """cache (blocks, bs, Hkv, D)[slot] = rows (N, Hkv, D), by flat slot."""
    flat = cache.view(-1, rows.shape[1], rows.shape[2])
    if is_fp8(cache.dtype):  # index_copy_ has no fp8 kernel on CPU; the bytes are the same
        flat, rows = flat.view(torch.uint8), rows.view(torch.uint8)
    flat.index_copy_(0, slot_mapping, rows.to(flat.dtype))  # no-op unless the cache is narrower


def paged_attention(
    q: torch.Tensor,
    kv: LayerKV,
    meta: AttentionMetadata,
    scale: float,
    window: int | None = None,
) -> torch.Tensor:
    """q: (N, Hq, D) -> (N, Hq, D), reading keys/values from the paged cache.

    An fp8 cache is dequantised per gathered slot (values * scale, in ``q.dtype``) before
    the invariant product, so a row's result still depends only on its own sequence.
    """
    if use_triton(q):  # CUDA: the Triton kernel (same contract; tests compare the two)
        from mmserve.kernels.triton_attention import cuda_paged_attention

        return cuda_paged_attention(q, kv.k, kv.v, meta, scale, window, kv.k_scale, kv.v_scale)
    out = torch.empty_like(q)
    for s in meta.seqs:
        qs = q[s.start : s.start + s.num_queries]
        k = _gather(kv.k, kv.k_scale, s.key_slots, q.dtype)  # (Lpad, Hkv, D)
        v = _gather(kv.v, kv.v_scale, s.key_slots, q.dtype)
        out[s.start : s.start + s.num_queries] = attend(qs, k, v, s.mask(window), scale)
    return out


def _gather(
    cache: torch.Tensor, scales: torch.Tensor | None, slots: torch.Tensor, dtype: torch.dtype
) -> torch.Tensor:
    """The (len(slots), Hkv, D) vectors at flat ``slots``; fp8 ones dequantised to ``dtype``."""
    hkv, d = cache.shape[2], cache.shape[3]
    rows = cache.view(-1, hkv, d).index_select(0, slots)
    if scales is None:
        return rows.to(dtype)  # no-op unless the cache is narrower than the queries
    return dequantize_fp8(rows, scales.view(-1, hkv).index_select(0, slots), dtype)


def attend(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, visible: torch.Tensor, scale: float
) -> torch.Tensor:
    """Invariant attention of one sequence: q (n, Hq, D), k/v (Lpad, Hkv, D), visible (n, Lpad)."""
    n, hq, d = q.shape
    lpad, hkv = k.shape[0], k.shape[1]
    g = hq // hkv
    tiles = -(-n * g // ROW_TILE)
    nc = lpad // KEY_CHUNK
    rows = q.view(n, hkv, g, d).permute(1, 0, 2, 3).reshape(hkv, n * g, d)
    rows = torch.nn.functional.pad(rows, (0, 0, 0, tiles * ROW_TILE - n * g))
    rows = rows.view(hkv, tiles, 1, ROW_TILE, d)
    kc = k.permute(1, 0, 2).reshape(hkv, 1, nc, KEY_CHUNK, d)
    vc = v.permute(1, 0, 2).reshape(hkv, 1, nc, KEY_CHUNK, d)
    scores = torch.matmul(rows, kc.transpose(-1, -2)) * scale  # (Hkv, T, nC, R, C)
    mask = visible.repeat_interleave(g, dim=0)  # (n*g, Lpad): row = token * g + head
    mask = torch.nn.functional.pad(mask, (0, 0, 0, tiles * ROW_TILE - n * g), value=True)
    mask = mask.view(tiles, ROW_TILE, nc, KEY_CHUNK).permute(0, 2, 1, 3)  # (T, nC, R, C)
    scores = scores.masked_fill(~mask, float("-inf"))
    peak = scores.amax(dim=(2, 4), keepdim=True)  # exact, so independent of padding
    weights = torch.exp(scores - peak)
    denom_chunks = weights.sum(-1)  # (Hkv, T, nC, R)
    value_chunks = torch.matmul(weights, vc)  # (Hkv, T, nC, R, D)
    denom, acc = denom_chunks[:, :, 0], value_chunks[:, :, 0]
    for c in range(1, nc):  # fixed chunk order: padding chunks add exact zeros at the end
        denom = denom + denom_chunks[:, :, c]
        acc = acc + value_chunks[:, :, c]
    outs = (acc / denom[..., None]).reshape(hkv, tiles * ROW_TILE, d)[:, : n * g]
    return outs.view(hkv, n, g, d).permute(1, 0, 2, 3).reshape(n, hq, d)


def reference_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    positions: torch.Tensor,
    scale: float,
    window: int | None = None,
) -> torch.Tensor:
    """Textbook causal attention in float64 over a contiguous sequence, for tests.

    q: (n, Hq, D) at ``positions``; k, v: (L, Hkv, D) for positions 0..L-1.
    """
    g = q.shape[1] // k.shape[1]
    kk = k.double().repeat_interleave(g, dim=1)
    vv = v.double().repeat_interleave(g, dim=1)
    scores = torch.einsum("nhd,lhd->hnl", q.double(), kk) * scale
    kpos = torch.arange(k.shape[0])[None, :]
    visible = kpos <= positions[:, None]
    if window is not None:
        visible &= positions[:, None] - kpos < window
    scores = scores.masked_fill(~visible, float("-inf"))
    return torch.einsum("hnl,lhd->nhd", scores.softmax(-1), vv).to(q.dtype)
