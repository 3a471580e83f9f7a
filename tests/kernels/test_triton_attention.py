"""Triton paged attention against the float64 textbook reference, and its batch invariance."""

from __future__ import annotations

import pytest
import torch
from triton_kit import DEVICE, DTYPE, ON_CUDA, TOL, needs_triton

from mmserve.kernels.attention import (
    AttentionMetadata,
    LayerKV,
    paged_attention,
    reference_attention,
)

pytestmark = needs_triton

PAGE, NUM_BLOCKS = 16, 160


def _setup(hkv: int, d: int, seed: int):
    torch.manual_seed(seed)
    kc = torch.randn(NUM_BLOCKS, PAGE, hkv, d, device=DEVICE).to(DTYPE)
    vc = torch.randn(NUM_BLOCKS, PAGE, hkv, d, device=DEVICE).to(DTYPE)
    return kc, vc


def _tables(ctx_lens: list[int]) -> list[list[int]]:
    """Disjoint, shuffled block tables (never contiguous: the gather must be right)."""
    perm = torch.randperm(NUM_BLOCKS).tolist()
    tables, used = [], 0
    for c in ctx_lens:
        n = -(-c // PAGE)
        tables.append(perm[used : used + n])
        used += n
    return tables


def _contiguous(cache: torch.Tensor, table: list[int], ctx: int) -> torch.Tensor:
    return cache[torch.tensor(table, device=cache.device)].flatten(0, 1)[:ctx]  # (L, Hkv, D)


def _run(q_lens, ctx_lens, hkv, g, d, window=None, seed=0):
    from mmserve.kernels.triton_attention import cuda_paged_attention

    kc, vc = _setup(hkv, d, seed)
    tables = _tables(ctx_lens)
    q = torch.randn(sum(q_lens), hkv * g, d, device=DEVICE).to(DTYPE)
    meta = AttentionMetadata.build(q_lens, ctx_lens, tables, PAGE, DEVICE)
    out = cuda_paged_attention(q, kc, vc, meta, d**-0.5, window)
    return q, kc, vc, tables, meta, out


@pytest.mark.parametrize("hkv,g,d", [(3, 3, 64), (2, 4, 128)])
@pytest.mark.parametrize("window", [None, 40])
def test_matches_textbook(hkv, g, d, window):
    q_lens = [1, 1, 5, 1, 37, 4]  # decodes, verifies (k+1), a prefill chunk
    ctx_lens = [1, 200, 77, 64, 150, 300]
    q, kc, vc, tables, _, out = _run(q_lens, ctx_lens, hkv, g, d, window, seed=hkv + d)
    start = 0
    for n, ctx, table in zip(q_lens, ctx_lens, tables, strict=True):
        pos = torch.arange(ctx - n, ctx, device=DEVICE)
        want = reference_attention(
            q[start : start + n].cpu(),
            _contiguous(kc, table, ctx).cpu(),
            _contiguous(vc, table, ctx).cpu(),
            pos.cpu(),
            d**-0.5,
            window,
        )
        got = out[start : start + n].cpu()
        torch.testing.assert_close(got.float(), want.float(), atol=TOL, rtol=TOL)
        start += n


def test_matches_plain_torch_kernel():
    q, kc, vc, _, meta, out = _run([1, 3, 1], [90, 33, 129], 2, 4, 64, seed=5)
    want = paged_attention(q.float(), LayerKV(kc.float(), vc.float()), meta, 64**-0.5)
    torch.testing.assert_close(out.float(), want, atol=TOL, rtol=TOL)


@pytest.mark.skipif(not ON_CUDA, reason="bits: the interpreter's numpy matmul varies by row place")
def test_row_bits_independent_of_step_shape():
    """The last token's output: identical bits alone, as a verify row, in a prefill chunk,
    and next to other sequences (decode and prefill) in the same launch."""
    from mmserve.kernels.triton_attention import cuda_paged_attention

    hkv, g, d, length = 3, 3, 64, 131
    kc, vc = _setup(hkv, d, 7)
    table, other = _tables([length, 150])
    q = torch.randn(length, hkv * g, d, device=DEVICE).to(DTYPE)

    def last_row(nq: int, neighbours: int) -> torch.Tensor:
        qs, lens, ctx, tables = [q[length - nq :]], [nq], [length], [table]
        for i in range(neighbours):
            n_other = 1 if i % 2 else 20
            qs.insert(0, torch.randn(n_other, hkv * g, d, device=DEVICE).to(DTYPE))
            lens.insert(0, n_other)
            ctx.insert(0, 150)
            tables.insert(0, other)
        meta = AttentionMetadata.build(lens, ctx, tables, PAGE, DEVICE)
        return cuda_paged_attention(torch.cat(qs), kc, vc, meta, d**-0.5)[-1]

    base = last_row(1, 0)
    for nq in (1, 2, 5, 8, 64, length):
        for neighbours in (0, 1, 4):
            assert torch.equal(last_row(nq, neighbours), base), (nq, neighbours)


def test_write_kv_matches_index_copy_and_skips_padding():
    from mmserve.kernels.attention import write_kv
    from mmserve.kernels.triton_attention import cuda_write_kv

    torch.manual_seed(3)
    hkv, d, n, pad = 3, 64, 11, 3
    qkv = torch.randn(n + pad, 5 * hkv * d, device=DEVICE).to(DTYPE)  # k, v: strided views
    k = qkv[:, hkv * d : 2 * hkv * d].reshape(n + pad, hkv, d)
    v = qkv[:, 3 * hkv * d : 4 * hkv * d].reshape(n + pad, hkv, d)
    slots = torch.randperm(NUM_BLOCKS * PAGE, device=DEVICE)[:n]
    want_k, want_v = _setup(hkv, d, 4)
    got_k, got_v = want_k.clone(), want_v.clone()
    cuda_write_kv(got_k, got_v, k, v, torch.cat([slots, torch.full((pad,), -1, device=DEVICE)]))
    # reference on CPU: index_copy_ of the real rows only (padding rows write nothing)
    ck, cv = want_k.cpu(), want_v.cpu()
    write_kv(LayerKV(ck, cv), k[:n].cpu(), v[:n].cpu(), slots.cpu())
    assert torch.equal(got_k.cpu(), ck) and torch.equal(got_v.cpu(), cv)


@pytest.mark.skipif(not ON_CUDA, reason="dispatch is by device: CUDA only")
def test_attention_module_dispatches_to_triton_on_cuda():
    q, kc, vc, _, meta, out = _run([1, 4], [50, 70], 2, 2, 64, seed=9)
    assert torch.equal(paged_attention(q, LayerKV(kc, vc), meta, 64**-0.5), out)


@pytest.mark.parametrize("window", [None, 40])
def test_block_prefetch_is_a_launch_option_only(monkeypatch, window):
    """Small grids prefetch the next key step's block ids, and its keys and values
    (``KernelConfig.kv_ahead``); the arithmetic is the loop's, so the output bits are the
    same every way (the engine picks by grid size)."""
    from mmserve.kernels import settings
    from mmserve.kernels import triton_attention as ta

    outs = []
    for limit, ahead in ((0, True), (1 << 30, False), (1 << 30, True)):  # never, ids, ids+kv
        monkeypatch.setattr(ta, "PREFETCH_MAX_PROGRAMS", limit)
        with settings.override(kv_ahead=ahead):
            outs.append(_run([1, 4, 1, 37], [1, 200, 129, 150], 2, 4, 128, window, seed=5)[-1])
    assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], outs[2])


@pytest.mark.parametrize("window", [None, 40])
def test_spread_splits_are_a_launch_option_only(monkeypatch, window):
    """Small grids give a group's key splits programs of their own, merged in order by
    the last to finish: the same bits as one program walking them all, at one split and
    many, decode and verify rows, a window; the groups' counters are left at 0."""
    from mmserve.kernels import settings
    from mmserve.kernels import triton_attention as ta

    index = torch.empty(0, device=DEVICE).device.index  # cuda:0, or None on CPU
    monkeypatch.setitem(ta.SPREAD["sms"], index, 132)  # spread on the interpreter too
    cases = [
        ([1], [1]),
        ([1], [129]),
        ([1], [300]),
        ([1, 5], [700, 260]),
        ([4, 1, 9], [1000, 128, 390]),
    ]
    for q_lens, ctx in cases:
        outs, runs = [], ta.SPREAD["runs"]
        for on in (False, True):
            with settings.override(spread=on):
                outs.append(_run(q_lens, ctx, 2, 4, 128, window, seed=len(ctx))[-1])
        assert ta.SPREAD["runs"] == runs + 1, "the second launch spread"
        assert torch.equal(outs[0], outs[1]), (q_lens, ctx)
        assert not ta.SPREAD["counts"][index].any()
    assert ta.spread_programs(64, DEVICE) == 1  # big grids keep a tile in one program


@pytest.mark.skipif(not ON_CUDA, reason="concurrent programs and CUDA graphs need the GPU")
def test_spread_launches_replayed_from_a_graph_give_the_serial_bits():
    """The interpreter runs a grid's programs one at a time, so only the GPU can show a race
    between a group's programs or a counter left unreset: a graph of four spread launches
    (a step's layers, the same counters each time), replayed with new contexts, gives the
    serial kernel's bits every time and leaves every counter at 0."""
    from mmserve.kernels import settings
    from mmserve.kernels import triton_attention as ta
    from mmserve.kernels.triton_attention import PagedMetadata, cuda_paged_attention

    hkv, g, d, b = 8, 4, 128, 2  # the Llama-3-8B heads, two sequences: 16 groups
    kc, vc = _setup(hkv, d, 11)
    blocks = NUM_BLOCKS // b
    tables = torch.randperm(NUM_BLOCKS, device=DEVICE).view(b, blocks).long()  # disjoint
    ctx = torch.ones(b, dtype=torch.long, device=DEVICE)
    meta = PagedMetadata(
        torch.full((b,), -1, dtype=torch.long, device=DEVICE),
        tables,
        ctx,
        torch.arange(b, device=DEVICE),
        torch.ones(b, dtype=torch.long, device=DEVICE),
        1,
    )
    q = torch.randn(b, hkv * g, d, device=DEVICE).to(DTYPE)

    def step() -> torch.Tensor:
        return torch.stack([cuda_paged_attention(q, kc, vc, meta, d**-0.5) for _ in range(4)])

    assert ta.spread_programs(b * hkv, q.device) > 1
    step()  # compiles, and makes the counters outside the capture
    runs = ta.SPREAD["runs"]
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()
    assert ta.SPREAD["runs"] == runs + 4, "the captured launches spread"
    gen = torch.Generator().manual_seed(12)
    contexts = [(1000, 300), (129, 1), (blocks * PAGE, 900), (257, 256)]
    contexts += [
        tuple(torch.randint(1, blocks * PAGE + 1, (b,), generator=gen).tolist()) for _ in range(24)
    ]
    for lens in contexts:
        ctx.copy_(torch.tensor(lens))
        graph.replay()
        torch.cuda.synchronize()
        assert not ta.SPREAD["counts"][q.device.index].any(), lens
        got = out.clone()
        with settings.override(spread=False):
            want = cuda_paged_attention(q, kc, vc, meta, d**-0.5)
        for layer in got:
            assert torch.equal(layer, want), lens
