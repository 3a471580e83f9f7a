"""fp8 (e4m3) KV cache: quantisation bounds, scale layout, error against a float32 cache,
and batch invariance; on CUDA, the Triton writer/attention against the plain-torch path."""

from __future__ import annotations

import pytest
import torch
from triton_kit import ON_CUDA

from mmserve.engine.kv_cache import KVCache
from mmserve.kernels.attention import (
    AttentionMetadata,
    LayerKV,
    paged_attention,
    reference_attention,
    write_kv,
)
from mmserve.kernels.fp8 import FP8_DTYPE, FP8_MAX, dequantize_fp8, quantize_fp8

BS, HKV, G, D = 16, 3, 3, 64
CPU = torch.device("cpu")
# relative error of the attention output, fp8 vs float32 cache: measured 0.039-0.048 over
# seeds 0-5 (a bf16 cache: 0.003); the bound leaves ~2x headroom
ATTN_REL_ERR = 0.09


def _rel(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got.double() - want.double()).norm() / want.double().norm()).item()


def _kv(n: int, seed: int, device=CPU) -> tuple[torch.Tensor, torch.Tensor]:
    """Random keys/values (n, HKV, D) whose magnitudes vary per token and head."""
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(n, HKV, D, generator=g) * (0.1 + 3 * torch.rand(n, HKV, 1, generator=g))
    v = torch.randn(n, HKV, D, generator=g) * (0.1 + torch.rand(n, HKV, 1, generator=g))
    return k.to(device), v.to(device)


def _tables(ctx_lens: list[int], num_blocks: int, seed: int) -> list[list[int]]:
    """Disjoint, shuffled block tables (never contiguous: the gather must be right)."""
    perm = torch.randperm(num_blocks, generator=torch.Generator().manual_seed(seed)).tolist()
    tables, used = [], 0
    for c in ctx_lens:
        n = -(-c // BS)
        tables.append(perm[used : used + n])
        used += n
    return tables


def _filled(dtype: torch.dtype, ctx_lens, tables, k, v, num_blocks=64) -> LayerKV:
    cache = KVCache(1, num_blocks, BS, HKV, D, dtype)
    meta = AttentionMetadata.build(ctx_lens, ctx_lens, tables, BS, CPU)
    write_kv(cache.layer(0), k, v, meta.slot_mapping)
    return cache.layer(0)


def test_quantisation_error_is_bounded_per_element():
    """e4m3 keeps 3 mantissa bits: |x - deq| <= 2^-4 |x| (normals) or 2^-10 s (subnormals)."""
    k, _ = _kv(500, 0)
    k[0, 0, 5] = 1e-6  # a tiny element next to large ones: lands in e4m3's subnormal range
    values, scale = quantize_fp8(k)
    assert values.dtype == FP8_DTYPE and scale.dtype == torch.float32
    assert scale.shape == (500, HKV)
    torch.testing.assert_close(scale, k.abs().amax(-1) / FP8_MAX, rtol=0, atol=0)
    assert values.float().abs().amax(-1).eq(FP8_MAX).all()  # each vector uses the full range
    err = (dequantize_fp8(values, scale, torch.float32) - k).abs()
    bound = 2**-4 * k.abs() + 2**-10 * scale[..., None]
    assert (err <= bound * (1 + 1e-6)).all()
    rel = _rel(dequantize_fp8(values, scale, torch.float32), k)
    assert 0.005 < rel < 0.04, rel  # measured 0.024: lossy, but only by e4m3's rounding


def test_zero_vectors_round_trip_to_exact_zeros():
    k, v = _kv(40, 1)
    k[3] = 0.0  # a whole token
    v[7, 1] = 0.0  # one head of one token
    kv = _filled(FP8_DTYPE, [40], [[5, 9, 2]], k, v)
    meta = AttentionMetadata.build([40], [40], [[5, 9, 2]], BS, CPU)
    slot = meta.slot_mapping
    assert kv.k_scale is not None and kv.v_scale is not None
    assert kv.k_scale.view(-1, HKV)[slot[3]].eq(0).all()
    assert kv.v_scale.view(-1, HKV)[slot[7], 1] == 0 and kv.v_scale.view(-1, HKV)[slot[7], 0] > 0
    kq = dequantize_fp8(kv.k.view(-1, HKV, D)[slot], kv.k_scale.view(-1, HKV)[slot], torch.float32)
    vq = dequantize_fp8(kv.v.view(-1, HKV, D)[slot], kv.v_scale.view(-1, HKV)[slot], torch.float32)
    assert kq[3].eq(0).all() and vq[7, 1].eq(0).all() and not vq[7, 0].eq(0).all()
    assert not kq.isnan().any() and not vq.isnan().any()
    # all-zero values: attention reads back exact zeros (and no NaN from a 0 scale)
    zero = _filled(FP8_DTYPE, [40], [[5, 9, 2]], k, torch.zeros_like(v))
    out = paged_attention(torch.randn(40, HKV * G, D), zero, meta, D**-0.5)
    assert out.eq(0).all()


def test_scale_layout_and_sizes():
    cache = KVCache(3, 5, BS, HKV, D, FP8_DTYPE)
    assert cache.data.dtype == FP8_DTYPE and cache.data.shape == (3, 2, 5, BS, HKV, D)
    assert cache.scales is not None and cache.scales.dtype == torch.float32
    assert cache.scales.shape == (3, 2, 5, BS, HKV) and cache.scales.eq(0).all()
    assert cache.data.float().eq(0).all()  # zero-initialised: padded reads are zeros
    kv = cache.layer(1)
    assert kv.k_scale is not None and kv.v_scale is not None
    assert kv.k_scale.shape == kv.v_scale.shape == (5, BS, HKV)
    k, v = _kv(2, 2)
    slots = torch.tensor([2 * BS + 3, 4 * BS])  # (block 2, offset 3), (block 4, offset 0)
    write_kv(kv, k, v, slots)
    _, k_scale = quantize_fp8(k)
    _, v_scale = quantize_fp8(v)
    assert torch.equal(cache.scales[1, 0, 2, 3], k_scale[0])  # the views alias `scales`
    assert torch.equal(cache.scales[1, 1, 4, 0], v_scale[1])
    assert torch.count_nonzero(cache.scales) == 4 * HKV  # nothing else was written
    assert torch.equal(
        cache.data[1, 0, 2, 3].view(torch.uint8), quantize_fp8(k)[0][0].view(torch.uint8)
    )
    assert cache.nbytes == 3 * 2 * 5 * BS * HKV * (D + 4)
    assert cache.layer(0).k_scale is not None and KVCache(3, 5, BS, HKV, D).layer(0).k_scale is None


def test_budget_holds_more_fp8_blocks():
    per32 = KVCache.bytes_per_block(30, BS, HKV, D, torch.float32)
    per8 = KVCache.bytes_per_block(30, BS, HKV, D, FP8_DTYPE)
    per16 = KVCache.bytes_per_block(30, BS, HKV, D, torch.bfloat16)
    assert per8 == 30 * 2 * BS * HKV * (D + 4)  # e4m3 values + a float32 scale per vector
    budget = 64 << 20
    blocks = {
        dt: KVCache.blocks_for_budget(budget, 30, BS, HKV, D, dt)
        for dt in (torch.float32, torch.bfloat16, FP8_DTYPE)
    }
    assert blocks[FP8_DTYPE] == budget // per8
    assert blocks[FP8_DTYPE] >= 1.85 * blocks[torch.bfloat16]  # 2 D / (D + 4) = 1.88
    assert blocks[FP8_DTYPE] >= 3.7 * blocks[torch.float32]  # 4 D / (D + 4) = 3.76
    assert per16 * 2 == per32
    cache = KVCache.from_budget(budget, 2, BS, HKV, D, FP8_DTYPE)
    assert cache.nbytes <= budget and cache.scales is not None
    with pytest.raises(ValueError, match="float8_e4m3fn only"):
        KVCache(1, 2, BS, HKV, D, torch.float8_e5m2)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("window", [None, 40])
def test_attention_error_bounded_against_float32_cache(seed, window):
    """Decodes, a verify, a prefill chunk: fp8 within ATTN_REL_ERR of the float32 cache, and
    equal (to fp32 rounding) to textbook attention over the dequantised keys/values."""
    ctx_lens, q_lens = [1, 200, 77, 150], [1, 1, 5, 37]
    tables = _tables(ctx_lens, 64, seed)
    k, v = _kv(sum(ctx_lens), seed)
    full, fp8 = (_filled(dt, ctx_lens, tables, k, v) for dt in (torch.float32, FP8_DTYPE))
    q = torch.randn(sum(q_lens), HKV * G, D, generator=torch.Generator().manual_seed(seed + 9))
    meta = AttentionMetadata.build(q_lens, ctx_lens, tables, BS, CPU)
    want = paged_attention(q, full, meta, D**-0.5, window)
    got = paged_attention(q, fp8, meta, D**-0.5, window)
    err = _rel(got, want)
    assert 0.005 < err < ATTN_REL_ERR, err  # lossy (so the fp8 path really ran), but bounded
    kq, kscale = quantize_fp8(k)
    vq, vscale = quantize_fp8(v)
    kd, vd = dequantize_fp8(kq, kscale, torch.float32), dequantize_fp8(vq, vscale, torch.float32)
    start, kstart = 0, 0
    for n, ctx in zip(q_lens, ctx_lens, strict=True):
        pos = torch.arange(ctx - n, ctx)
        ref = reference_attention(
            q[start : start + n],
            kd[kstart : kstart + ctx],
            vd[kstart : kstart + ctx],
            pos,
            D**-0.5,
            window,
        )
        torch.testing.assert_close(got[start : start + n], ref, atol=1e-5, rtol=1e-5)
        start, kstart = start + n, kstart + ctx


def test_stored_bits_independent_of_the_batch():
    """A token's e4m3 bytes and scales are the same written alone or among others."""
    k, v = _kv(30, 4)
    alone = KVCache(1, 8, BS, HKV, D, FP8_DTYPE)
    write_kv(alone.layer(0), k[7:8], v[7:8], torch.tensor([19]))
    batch = KVCache(1, 8, BS, HKV, D, FP8_DTYPE)
    slots = torch.arange(30) + 40
    slots[7] = 19
    write_kv(batch.layer(0), k, v, slots)
    assert alone.scales is not None and batch.scales is not None
    assert torch.equal(
        alone.data.view(torch.uint8)[:, :, 1, 3], batch.data.view(torch.uint8)[:, :, 1, 3]
    )
    assert torch.equal(alone.scales[:, :, 1, 3], batch.scales[:, :, 1, 3])


def test_row_bits_independent_of_step_shape():
    """With an fp8 cache the last token's output is bit-identical as a decode, inside a
    prefill chunk, as one of k+1 verify rows, and next to other sequences."""
    length, other_len = 97, 150
    table, other = list(range(10, 17)), list(range(30, 40))
    k, v = _kv(length + other_len, 5)
    kv = _filled(FP8_DTYPE, [length, other_len], [table, other], k, v)
    gen = torch.Generator().manual_seed(6)
    q = torch.randn(length, HKV * G, D, generator=gen)

    def last_row(nq: int, neighbours: int) -> torch.Tensor:
        qs, lens, ctx, tables = [q[length - nq :]], [nq], [length], [table]
        for i in range(neighbours):
            n_other = 1 if i % 2 else 20
            qs.insert(0, torch.randn(n_other, HKV * G, D, generator=gen))
            lens.insert(0, n_other)
            ctx.insert(0, other_len)
            tables.insert(0, other)
        meta = AttentionMetadata.build(lens, ctx, tables, BS, CPU)
        return paged_attention(torch.cat(qs), kv, meta, D**-0.5)[-1]

    base = last_row(1, 0)
    for nq in (1, 2, 5, 8, 64, length):
        for neighbours in (0, 1, 3):
            assert torch.equal(last_row(nq, neighbours), base), (nq, neighbours)


# --- CUDA: the Triton writer and kernel against the plain-torch path ---------------------

needs_cuda = pytest.mark.skipif(
    not ON_CUDA, reason="fp8 Triton kernels need CUDA (the interpreter has no fp8)"
)
CUDA_BLOCKS = 160


def _cuda_fp8_cache() -> KVCache:
    return KVCache(1, CUDA_BLOCKS, BS, HKV, D, FP8_DTYPE, "cuda")


def _cuda_case(q_lens, ctx_lens, seed):
    """An fp8 cache on CUDA filled by the Triton writer, bf16 queries, and its metadata."""
    tables = _tables(ctx_lens, CUDA_BLOCKS, seed)
    k, v = _kv(sum(ctx_lens), seed, "cuda")
    k, v = k.bfloat16(), v.bfloat16()
    cache = _cuda_fp8_cache()
    fill = AttentionMetadata.build(ctx_lens, ctx_lens, tables, BS, torch.device("cuda"))
    write_kv(cache.layer(0), k, v, fill.slot_mapping)
    g = torch.Generator(device="cuda").manual_seed(seed + 9)
    q = torch.randn(sum(q_lens), HKV * G, D, device="cuda", generator=g).bfloat16()
    meta = AttentionMetadata.build(q_lens, ctx_lens, tables, BS, torch.device("cuda"))
    return cache, q, k, v, tables, meta


def _on_cpu(kv: LayerKV) -> LayerKV:
    return LayerKV(*(t.cpu() if t is not None else None for t in kv))


@needs_cuda
def test_triton_write_matches_reference_bits_and_skips_padding():
    from mmserve.kernels.triton_attention import cuda_write_kv

    n, pad = 11, 3
    torch.manual_seed(3)
    qkv = torch.randn(n + pad, 5 * HKV * D, device="cuda").bfloat16()  # k, v: strided views
    k = qkv[:, HKV * D : 2 * HKV * D].reshape(n + pad, HKV, D)
    v = qkv[:, 3 * HKV * D : 4 * HKV * D].reshape(n + pad, HKV, D)
    k[2] = 0.0  # a zero vector: scale 0, exact zeros
    slots = torch.randperm(CUDA_BLOCKS * BS, device="cuda")[:n]
    got = _cuda_fp8_cache()
    prior_k, prior_v = _kv(4, 8, "cuda")  # something already in the cache stays untouched
    write_kv(got.layer(0), prior_k, prior_v, torch.arange(4, device="cuda"))
    want = KVCache(1, CUDA_BLOCKS, BS, HKV, D, FP8_DTYPE)
    want.data.copy_(got.data.cpu())
    assert want.scales is not None and got.scales is not None
    want.scales.copy_(got.scales.cpu())
    kv = got.layer(0)
    all_slots = torch.cat([slots, torch.full((pad,), -1, device="cuda")])
    cuda_write_kv(kv.k, kv.v, k, v, all_slots, kv.k_scale, kv.v_scale)
    write_kv(want.layer(0), k[:n].cpu(), v[:n].cpu(), slots.cpu())
    assert torch.equal(got.data.cpu().view(torch.uint8), want.data.view(torch.uint8))
    assert torch.equal(got.scales.cpu(), want.scales)


@needs_cuda
@pytest.mark.parametrize("window", [None, 40])
def test_triton_fp8_attention_matches_plain_torch_on_same_cache(window):
    q_lens, ctx_lens = [1, 1, 5, 1, 37, 4], [1, 200, 77, 64, 150, 300]
    cache, q, _, _, tables, meta = _cuda_case(q_lens, ctx_lens, 1)
    got = paged_attention(q, cache.layer(0), meta, D**-0.5, window)  # dispatches to Triton
    cpu_meta = AttentionMetadata.build(q_lens, ctx_lens, tables, BS, CPU)
    want = paged_attention(q.float().cpu(), _on_cpu(cache.layer(0)), cpu_meta, D**-0.5, window)
    torch.testing.assert_close(got.float().cpu(), want, atol=2e-2, rtol=2e-2)


@needs_cuda
def test_triton_fp8_error_bounded_against_bf16_cache():
    """Both against float64 textbook attention on the unquantised keys/values."""
    from mmserve.kernels.triton_attention import cuda_paged_attention

    q_lens, ctx_lens = [1, 1, 5, 37], [1, 200, 77, 150]
    cache, q, k, v, tables, meta = _cuda_case(q_lens, ctx_lens, 2)
    bf16 = KVCache(1, CUDA_BLOCKS, BS, HKV, D, torch.bfloat16, "cuda")
    fill = AttentionMetadata.build(ctx_lens, ctx_lens, tables, BS, torch.device("cuda"))
    write_kv(bf16.layer(0), k, v, fill.slot_mapping)
    out8 = paged_attention(q, cache.layer(0), meta, D**-0.5)
    out16 = cuda_paged_attention(q, bf16.data[0, 0], bf16.data[0, 1], meta, D**-0.5)
    start, kstart, refs = 0, 0, []
    for n, ctx in zip(q_lens, ctx_lens, strict=True):
        pos = torch.arange(ctx - n, ctx)
        refs.append(
            reference_attention(
                q[start : start + n].double().cpu(),
                k[kstart : kstart + ctx].double().cpu(),
                v[kstart : kstart + ctx].double().cpu(),
                pos,
                D**-0.5,
            )
        )
        start, kstart = start + n, kstart + ctx
    ref = torch.cat(refs)
    e8, e16 = _rel(out8.cpu(), ref), _rel(out16.cpu(), ref)
    assert e8 < ATTN_REL_ERR and e16 < e8 / 3, (e8, e16)  # bf16 alone: ~0.3 %


@needs_cuda
def test_triton_fp8_row_bits_independent_of_step_shape():
    from mmserve.kernels.triton_attention import cuda_paged_attention

    length, other_len = 131, 150
    cache, _, _, _, tables, _ = _cuda_case([1, 1], [length, other_len], 7)
    table, other = tables
    kv = cache.layer(0)
    q = torch.randn(length, HKV * G, D, device="cuda").bfloat16()

    def last_row(nq: int, neighbours: int) -> torch.Tensor:
        qs, lens, ctx, tabs = [q[length - nq :]], [nq], [length], [table]
        for i in range(neighbours):
            n_other = 1 if i % 2 else 20
            qs.insert(0, torch.randn(n_other, HKV * G, D, device="cuda").bfloat16())
            lens.insert(0, n_other)
            ctx.insert(0, other_len)
            tabs.insert(0, other)
        meta = AttentionMetadata.build(lens, ctx, tabs, BS, torch.device("cuda"))
        return cuda_paged_attention(
            torch.cat(qs), kv.k, kv.v, meta, D**-0.5, None, kv.k_scale, kv.v_scale
        )[-1]

    base = last_row(1, 0)
    for nq in (1, 2, 5, 8, 64, length):
        for neighbours in (0, 1, 4):
            assert torch.equal(last_row(nq, neighbours), base), (nq, neighbours)
