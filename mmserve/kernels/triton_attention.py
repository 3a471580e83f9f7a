"""Paged attention on CUDA in Triton: decode, verify and prefill chunks in one kernel.

Reference: :func:`mmserve.kernels.attention.paged_attention` (and
``reference_attention``); tests compare the two on random inputs.

Layout. The query rows of one (sequence, kv head) are its query tokens times the
``G = Hq / Hkv`` query heads that share the kv head, flattened as ``token * G + head``
(the reference's order). One program owns ``BLOCK_M`` such rows and walks the
sequence's keys in blocks of ``BLOCK_N`` absolute positions, gathering them through
the block table, with an online softmax.

Batch invariance. A row's result depends only on its own query, its sequence's
keys and its position: every tile has the same shape whatever the step holds, the
key blocks are aligned to absolute positions and visited in one order, there is
no split-K, and a key block a row cannot see (the tile runs to the reach of its
last row) adds exact zeros (``alpha = 1``, ``p = 0``). So a token's output is the
same bits as a decode, as one of k+1 verify rows, inside a prefill chunk, or next
to any other sequences.

Metadata. :class:`PagedMetadata` holds tensors only, so a step built from it can
be captured in a CUDA graph; :func:`paged_metadata` converts the CPU-path
:class:`~mmserve.kernels.attention.AttentionMetadata` once per step.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

try:  # Triton ships with CUDA builds of torch; the CPU path never needs it
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - CPU-only installs
    triton = None

BLOCK_M = 16  # query rows per program: the smallest tensor-core tile, one shape for all steps
BLOCK_N = 64  # keys per inner step, aligned to absolute positions


def available() -> bool:
    return triton is not None and torch.cuda.is_available()


@dataclass
class PagedMetadata:
    """Attention metadata as fixed-shape tensors (graph-capturable).

    Sequence ``i`` owns query rows ``query_start[i] : query_start[i] + query_lens[i]`` of
    the flat batch, at positions ``context_lens[i] - query_lens[i] ..context_lens[i] - 1``.
    Padding sequences have ``query_lens == 0`` (nothing computed) and padding tokens a
    negative ``slot_mapping`` (nothing written).
    """

    slot_mapping: torch.Tensor  # (N,) int: flat cache slot of each new token's K/V; < 0: skip
    block_tables: torch.Tensor  # (B, max_blocks) int: cache block of each logical block
    context_lens: torch.Tensor  # (B,) int: cached + new tokens after this step
    query_start: torch.Tensor  # (B,) int: first query row of each sequence
    query_lens: torch.Tensor  # (B,) int
    max_query_len: int  # host-side bound that sizes the launch grid


def paged_metadata(meta, block_size: int) -> PagedMetadata:
    """``AttentionMetadata`` (per-sequence Python objects) -> tensors; cached on ``meta``.

    Every layer of a step shares ``meta``, so the conversion runs once per step.
    """
    if isinstance(meta, PagedMetadata):
        return meta
    cached = meta.__dict__.get("_paged")
    if cached is not None and cached[0] == block_size:
        return cached[1]
    dev = meta.slot_mapping.device
    seqs = meta.seqs
    slots = torch.nn.utils.rnn.pad_sequence([s.key_slots for s in seqs], batch_first=True)
    # key_slots[j * bs] is the first slot of logical block j: its block id times bs
    tables = torch.div(slots[:, ::block_size], block_size, rounding_mode="floor")
    host = torch.tensor([[s.start, s.num_queries, s.context_len] for s in seqs],
                        dtype=torch.int32)
    host = host.to(dev, non_blocking=True)
    out = PagedMetadata(meta.slot_mapping, tables.to(torch.int32).contiguous(),
                        host[:, 2].contiguous(), host[:, 0].contiguous(),
                        host[:, 1].contiguous(), max(s.num_queries for s in seqs))
    meta.__dict__["_paged"] = (block_size, out)
    return out


if triton is not None:

    @triton.jit
    def _paged_attention_kernel(
        q_ptr, k_ptr, v_ptr, o_ptr, tables_ptr, ctx_ptr, qstart_ptr, qlen_ptr,
        scale_log2,
        stride_qn, stride_qh, stride_on, stride_oh,
        stride_kb, stride_ks, stride_kh, stride_bt,
        G: tl.constexpr, D: tl.constexpr, PAGE: tl.constexpr, WINDOW: tl.constexpr,
        BM: tl.constexpr, BN: tl.constexpr,
    ):
        seq = tl.program_id(0)
        tile = tl.program_id(1)
        kvh = tl.program_id(2)
        qlen = tl.load(qlen_ptr + seq)
        if tile * BM >= qlen * G:
            return
        ctx = tl.load(ctx_ptr + seq)
        qstart = tl.load(qstart_ptr + seq)
        rows = tile * BM + tl.arange(0, BM)
        row_ok = rows < qlen * G
        tok = rows // G
        head = kvh * G + rows % G
        qpos = ctx - qlen + tok  # (BM,) absolute position of each row's token
        d = tl.arange(0, D)
        q = tl.load(q_ptr + (qstart + tok)[:, None] * stride_qn + head[:, None] * stride_qh
                    + d[None, :], mask=row_ok[:, None], other=0.0)
        last_tok = tl.minimum(qlen - 1, ((tile + 1) * BM - 1) // G)
        hi = ctx - qlen + last_tok + 1  # keys the tile's last row can see
        lo = ctx * 0
        if WINDOW > 0:  # skip whole aligned blocks no row of the tile can see
            lo = tl.maximum(0, ctx - qlen + (tile * BM) // G - WINDOW + 1) // BN * BN
        m_i = tl.full([BM], float("-inf"), tl.float32)
        l_i = tl.zeros([BM], tl.float32)
        acc = tl.zeros([BM, D], tl.float32)
        for start in range(lo, hi, BN):
            kpos = start + tl.arange(0, BN)
            k_in = kpos < hi
            blk = tl.load(tables_ptr + seq * stride_bt + kpos // PAGE, mask=k_in, other=0)
            off = blk.to(tl.int64) * stride_kb + (kpos % PAGE) * stride_ks + kvh * stride_kh
            k = tl.load(k_ptr + off[:, None] + d[None, :], mask=k_in[:, None], other=0.0)
            s = tl.dot(q, tl.trans(k)) * scale_log2  # (BM, BN) fp32, log2 units
            visible = (kpos[None, :] <= qpos[:, None]) & k_in[None, :]
            if WINDOW > 0:
                visible = visible & (qpos[:, None] - kpos[None, :] < WINDOW)
            s = tl.where(visible, s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # nothing seen yet
            alpha = tl.exp2(m_i - m_safe)
            p = tl.exp2(s - m_safe[:, None])
            l_i = l_i * alpha + tl.sum(p, 1)
            v = tl.load(v_ptr + off[:, None] + d[None, :], mask=k_in[:, None], other=0.0)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
            m_i = m_new
        out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
        tl.store(o_ptr + (qstart + tok)[:, None] * stride_on + head[:, None] * stride_oh
                 + d[None, :], out.to(o_ptr.dtype.element_ty), mask=row_ok[:, None])

    @triton.jit
    def _write_kv_kernel(k_ptr, v_ptr, kc_ptr, vc_ptr, slot_ptr, stride_kn, stride_vn,
                         ROW: tl.constexpr, BLOCK: tl.constexpr):
        n = tl.program_id(0)
        slot = tl.load(slot_ptr + n).to(tl.int64)
        if slot < 0:  # a padding token: write nothing
            return
        for c in tl.static_range(0, ROW, BLOCK):
            i = c + tl.arange(0, BLOCK)
            ok = i < ROW
            tl.store(kc_ptr + slot * ROW + i, tl.load(k_ptr + n * stride_kn + i, mask=ok),
                     mask=ok)
            tl.store(vc_ptr + slot * ROW + i, tl.load(v_ptr + n * stride_vn + i, mask=ok),
                     mask=ok)


def cuda_paged_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                         meta, scale: float, window: int | None = None) -> torch.Tensor:
    """q: (N, Hq, D) -> (N, Hq, D); caches (blocks, bs, Hkv, D). ``meta``: either form."""
    n, hq, d = q.shape
    _, page, hkv, dk = k_cache.shape
    assert dk == d and hq % hkv == 0 and d & (d - 1) == 0, "head_dim must be a power of two"
    assert q.stride(-1) == 1 and k_cache.stride(-1) == 1 and k_cache.stride() == v_cache.stride()
    pm = paged_metadata(meta, page)
    g = hq // hkv
    out = torch.empty_like(q)
    b = pm.context_lens.shape[0]
    if b == 0 or n == 0:
        return out
    tiles = -(-pm.max_query_len * g // BLOCK_M)
    _paged_attention_kernel[(b, tiles, hkv)](
        q, k_cache, v_cache, out, pm.block_tables, pm.context_lens, pm.query_start,
        pm.query_lens, scale * 1.4426950408889634,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), pm.block_tables.stride(0),
        G=g, D=d, PAGE=page, WINDOW=window or 0, BM=BLOCK_M, BN=BLOCK_N, num_warps=4, num_stages=2)
    return out


def cuda_write_kv(k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor,
                  v: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """Store k, v (N, Hkv, D) at their flat slots; negative slots (padding) are skipped."""
    n, hkv, d = k.shape
    if n == 0:
        return
    assert k.stride(1) == d and k.stride(2) == 1 and v.stride(1) == d and v.stride(2) == 1
    assert k_cache.is_contiguous() and v_cache.is_contiguous()
    row = hkv * d
    block = min(1024, triton.next_power_of_2(row))
    _write_kv_kernel[(n,)](k, v, k_cache, v_cache, slot_mapping, k.stride(0), v.stride(0),
                           ROW=row, BLOCK=block, num_warps=4)
