"""Fused decoder-layer kernels against their unfused compositions; row bits across row counts
and tile shapes; padding slots left alone; a whole model fused vs unfused on CUDA."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F
from triton_kit import DEVICE, DTYPE, INTERPRET, ON_CUDA, TOL, needs_triton

from mmserve.kernels import fused
from mmserve.kernels.attention import LayerKV
from mmserve.kernels.rope import RotaryTable
from mmserve.kernels.triton_matmul import TileConfig

cuda_only = pytest.mark.skipif(not ON_CUDA, reason="bits and bf16 need CUDA + triton")
EPS = 1e-5
CONFIGS = (
    TileConfig(16, 16, 512, 4, 3),
    TileConfig(64, 32, 64, 4, 2),
    TileConfig(128, 64, 128, 8, 2),
    TileConfig(128, 128, 64, 8, 3),
)


def _rand(*shape, scale=1.0):
    return (torch.randn(*shape, device=DEVICE) * scale).to(DTYPE)


def _normed(x, w, offset):
    """The unfused norm's output (float32 math, rounded to x's dtype), in float64."""
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + EPS)
    return (xf * (offset + w.float())).to(x.dtype).double()


def _inputs(m, n, k, seed):
    torch.manual_seed(seed)
    return _rand(m, k, scale=3.0), _rand(k, scale=0.5) + 1, _rand(n, k, scale=k**-0.5)


@needs_triton
@pytest.mark.parametrize("m,n,k", [(1, 96, 576), (5, 200, 130), (70, 200, 2100), (300, 130, 64)])
@pytest.mark.parametrize("with_bias,offset", [(False, 0.0), (True, 1.0)])
def test_norm_linear_matches_composition(m, n, k, with_bias, offset):
    from mmserve.kernels.triton_fused import norm_linear

    x, nw, w = _inputs(m, n, k, m + n + k)
    b = _rand(n) if with_bias else None
    got = norm_linear(x, nw, EPS, offset, w, b)
    want = F.linear(_normed(x, nw, offset), w.double(), None if b is None else b.double())
    torch.testing.assert_close(got.double(), want, atol=TOL, rtol=TOL)


@needs_triton
@pytest.mark.parametrize("m,n,k", [(1, 96, 576), (70, 200, 2100), (300, 130, 64)])
def test_linear_residual_matches_composition(m, n, k):
    from mmserve.kernels.triton_fused import linear_residual
    from mmserve.kernels.triton_matmul import invariant_linear

    x, _, w = _inputs(m, n, k, m * n)
    r = _rand(m, n, scale=4.0)
    got = linear_residual(x, w, r)
    if ON_CUDA:  # the epilogue rounds as linear's output and torch's bf16 add do
        assert torch.equal(got, r + invariant_linear(x, w))
    want = r.double() + F.linear(x.double(), w.double())
    # one rounding of a sum of magnitude ~|r| (scale 4): an ulp of bf16 there is ~0.03
    torch.testing.assert_close(got.double(), want, atol=4 * TOL, rtol=TOL)


@needs_triton
@pytest.mark.parametrize("m,inter", [(1, 14336), (1, 48), (9, 1000), (300, 64)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_silu_mul_is_torchs_silu_times_up(m, inter, dtype):
    """torch's two kernels' bits on CUDA (bf16 and fp16); float32 under the interpreter."""
    from mmserve.kernels.triton_fused import silu_mul

    if not ON_CUDA:
        dtype = torch.float32
    torch.manual_seed(m + inter)
    x = (torch.randn(m, 2 * inter, device=DEVICE) * 4).to(dtype)
    gate, up = x.split(inter, dim=-1)
    want = F.silu(gate) * up
    for block in (1024, 64):
        got = silu_mul(x, block)
        if ON_CUDA:
            assert torch.equal(got, want)
        else:
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    wide = (torch.randn(m, 2 * inter + 8, device=DEVICE) * 4).to(dtype)[:, 3 : 3 + 2 * inter]
    gate, up = wide.split(inter, dim=-1)  # rows strided wider than the product
    torch.testing.assert_close(silu_mul(wide), F.silu(gate) * up, atol=TOL, rtol=TOL)
    if ON_CUDA:
        assert torch.equal(silu_mul(wide), F.silu(gate) * up)
        assert torch.equal(fused.silu_mul(x), want)  # the dispatch takes the kernel


@needs_triton
@pytest.mark.parametrize("m,inter,k", [(1, 48, 576), (9, 100, 130), (70, 160, 2100), (300, 64, 64)])
def test_norm_gate_up_silu_matches_composition(m, inter, k):
    from mmserve.kernels.triton_fused import norm_gate_up_silu

    x, nw, w = _inputs(m, 2 * inter, k, m + inter)
    got = norm_gate_up_silu(x, nw, EPS, 0.0, w)
    gate, up = F.linear(_normed(x, nw, 0.0), w.double()).split(inter, dim=-1)
    want = F.silu(gate) * up
    torch.testing.assert_close(got.double(), want, atol=TOL, rtol=TOL)


@needs_triton
@pytest.mark.parametrize("m,inter,k", [(1, 48, 576), (9, 100, 130), (70, 160, 2100)])
def test_gated_epilogue_is_silu_times_up_of_the_same_gemm(m, inter, k):
    """On CUDA the epilogue uses torch's silu arithmetic (precise expf, IEEE division): the
    same bits as ``F.silu(gate) * up`` of the fused norm GEMM's own halves."""
    from mmserve.kernels.triton_fused import norm_gate_up_silu, norm_linear

    x, nw, w = _inputs(m, 2 * inter, k, 7 * m + inter)
    nw = nw * 3.0  # gates far into both tails of silu, where an approximate exp shows
    got = norm_gate_up_silu(x, nw, EPS, 0.0, w)
    gate, up = norm_linear(x, nw, EPS, 0.0, w).split(inter, dim=-1)
    if ON_CUDA:
        assert torch.equal(got, F.silu(gate) * up)
    torch.testing.assert_close(got, F.silu(gate) * up, atol=TOL, rtol=TOL)


@needs_triton
@pytest.mark.parametrize("m,inter,k", [(1, 48, 576), (9, 100, 130), (16, 300, 2100)])
def test_gate_up_silu_is_silu_mul_of_the_plain_gemm(m, inter, k):
    """Without the norm prologue the gated epilogue has the bits of the plain invariant
    GEMM followed by ``silu_mul``, at every tile shape (and with the late PDL trigger on
    sm_90+; elsewhere PDL, and so ``late``, is off)."""
    from mmserve.kernels.triton_fused import gate_up_silu, silu_mul
    from mmserve.kernels.triton_matmul import invariant_linear

    x, _, w = _inputs(m, 2 * inter, k, 3 * m + inter)
    x = x * 3.0  # gates far into both tails of silu
    want = silu_mul(invariant_linear(x, w))
    for cfg, late in ((None, False), (None, True), (CONFIGS[0], False), (CONFIGS[1], True)):
        got = gate_up_silu(x, w, config=cfg, late=late)
        if ON_CUDA:
            assert torch.equal(got, want), (cfg, late)
        torch.testing.assert_close(got, want, atol=TOL, rtol=TOL)


def _qkv_views(n, hq, hkv, d):
    qkv = _rand(n, (hq + 2 * hkv) * d, scale=4.0)  # one product's output, like the model's
    q, k, v = qkv.split([hq * d, hkv * d, hkv * d], dim=-1)
    return q.reshape(n, hq, d), k.reshape(n, hkv, d), v.reshape(n, hkv, d)  # strided views


@needs_triton
@pytest.mark.parametrize("hq,hkv,d", [(9, 3, 64), (32, 8, 128), (4, 1, 256)])
def test_rope_write_kv_matches_rotate_and_write_kv(hq, hkv, d):
    from mmserve.kernels.triton_fused import rope_write_kv

    torch.manual_seed(hq * d)
    n, blocks, bs = 37, 8, 16
    table = RotaryTable(d, 500000.0, 4096, device=DEVICE)
    q, k, v = _qkv_views(n, hq, hkv, d)
    pos = torch.randint(0, 4096, (n,), device=DEVICE)
    slots = torch.randperm(blocks * bs, device=DEVICE)[:n]
    slots[[3, 20, 36]] = -1  # padding tokens: nothing written
    sentinel = torch.full((blocks, bs, hkv, d), 7.0, device=DEVICE).to(DTYPE)
    kc, vc = sentinel.clone(), sentinel.clone()
    got_q = rope_write_kv(q, k, v, pos, table.cos, table.sin, kc, vc, slots)
    want_q, want_k = table.rotate_reference(q, pos), table.rotate_reference(k, pos)
    real = slots >= 0
    kc_want, vc_want = sentinel.clone(), sentinel.clone()
    kc_want.view(-1, hkv, d)[slots[real]] = want_k[real]
    vc_want.view(-1, hkv, d)[slots[real]] = v[real]
    if ON_CUDA:  # bit-identical to the unfused kernels (rope.rotate + write_kv)
        from mmserve.kernels.triton_attention import cuda_write_kv
        from mmserve.kernels.triton_rope import cuda_rope

        assert torch.equal(got_q, cuda_rope(q, table.cos, table.sin, pos))
        assert torch.equal(got_q, want_q)
        ref_k, ref_v = sentinel.clone(), sentinel.clone()
        cuda_write_kv(ref_k, ref_v, cuda_rope(k, table.cos, table.sin, pos), v, slots)
        assert torch.equal(kc, ref_k) and torch.equal(vc, ref_v)
    torch.testing.assert_close(got_q, want_q, atol=TOL, rtol=TOL)
    torch.testing.assert_close(kc, kc_want, atol=TOL, rtol=TOL)
    assert torch.equal(vc, vc_want)  # copied, untouched at padding slots


def _qkv_rope_case(m, hq, hkv, d, k, with_bias, seed):
    """Inputs of ``qkv_rope``: x, norm weight, weight, bias, positions, slots (three of
    them padding), the rotary table and a sentinel cache."""
    torch.manual_seed(seed)
    n, blocks, bs = (hq + 2 * hkv) * d, 24, 16
    x, nw, w = _inputs(m, n, k, seed)
    b = _rand(n) if with_bias else None
    pos = torch.randint(0, 4096, (m,), device=DEVICE)
    slots = torch.randperm(blocks * bs, device=DEVICE)[:m]
    slots[torch.arange(m, device=DEVICE) % 7 == 3] = -1  # padding tokens: nothing written
    table = RotaryTable(d, 500000.0, 4096, device=DEVICE)
    sentinel = torch.full((blocks, bs, hkv, d), 7.0, device=DEVICE).to(DTYPE)
    return x, nw, w, b, pos, slots, table, sentinel


@needs_triton
@pytest.mark.parametrize("hq,hkv,d", [(9, 3, 64), (8, 2, 128)])
@pytest.mark.parametrize("m", [1, 5, 17, 70])
@pytest.mark.parametrize("norm,with_bias", [(True, False), (False, False), (False, True)])
def test_qkv_rope_is_the_product_then_rope_write_kv(hq, hkv, d, m, norm, with_bias):
    """The rope + cache-write epilogue against the product (``norm_linear`` with the norm,
    else the invariant GEMM) followed by ``rope_write_kv``: on CUDA the same bits of q and
    of both caches, padding slots left alone."""
    from mmserve.kernels.triton_fused import norm_linear, qkv_rope, rope_write_kv
    from mmserve.kernels.triton_matmul import invariant_linear

    k = 576 if norm else 1000
    x, nw, w, b, pos, slots, table, sentinel = _qkv_rope_case(
        m, hq, hkv, d, k, with_bias, m + d + norm
    )
    if norm:
        prod = norm_linear(x, nw, EPS, 0.0, w, b)
    else:
        prod = invariant_linear(x, w, b)
    q, kk, v = prod.split([hq * d, hkv * d, hkv * d], dim=-1)
    kc_want, vc_want = sentinel.clone(), sentinel.clone()
    q_want = rope_write_kv(
        q.reshape(m, hq, d),
        kk.reshape(m, hkv, d),
        v.reshape(m, hkv, d),
        pos,
        table.cos,
        table.sin,
        kc_want,
        vc_want,
        slots,
    )
    kc, vc = sentinel.clone(), sentinel.clone()
    got = qkv_rope(
        x, w, b, (nw, EPS, 0.0) if norm else None, hq, hkv, pos, table.cos, table.sin, kc, vc, slots
    )
    assert got.shape == (m, hq, d)
    if ON_CUDA:
        assert torch.equal(got, q_want)
        assert torch.equal(kc, kc_want) and torch.equal(vc, vc_want)
    torch.testing.assert_close(got, q_want, atol=TOL, rtol=TOL)
    torch.testing.assert_close(kc, kc_want, atol=TOL, rtol=TOL)
    torch.testing.assert_close(vc, vc_want, atol=TOL, rtol=TOL)
    untouched = torch.ones(sentinel.shape[:2], dtype=torch.bool, device=DEVICE).view(-1)
    untouched[slots[slots >= 0]] = False
    assert (kc.view(-1, hkv, d)[untouched] == 7.0).all()
    assert (vc.view(-1, hkv, d)[untouched] == 7.0).all()


@cuda_only
@pytest.mark.parametrize("norm", [True, False])
def test_qkv_rope_row_bits_independent_of_row_count_and_tile(norm):
    """A row's q and cache bytes do not depend on how many rows share the step or on the
    tile (widths 16 to 128: a rotated tile's pairs come from one head)."""
    from mmserve.kernels.triton_fused import qkv_rope

    hq, hkv, d = 8, 2, 128
    x, nw, w, _, pos, slots, table, sentinel = _qkv_rope_case(300, hq, hkv, d, 2600, False, 9)
    slots[0] = 5

    def run(m, cfg=None):
        kc, vc = sentinel.clone(), sentinel.clone()
        q = qkv_rope(
            x[:m],
            w,
            None,
            (nw, EPS, 0.0) if norm else None,
            hq,
            hkv,
            pos[:m],
            table.cos,
            table.sin,
            kc,
            vc,
            slots[:m],
            config=cfg,
        )
        return q[0], kc.view(-1, hkv, d)[5], vc.view(-1, hkv, d)[5]

    base = run(1)
    for m in (2, 16, 17, 64, 65, 300):
        assert all(torch.equal(a, c) for a, c in zip(run(m), base, strict=True)), m
    for cfg in CONFIGS:
        assert all(torch.equal(a, c) for a, c in zip(run(96, cfg), base, strict=True)), cfg


try:
    import triton
    import triton.language as tl
except ImportError:  # CPU-only installs: the tests that need it skip
    triton = None

if triton is not None:
    from mmserve.kernels.triton_fused import norm_partials, pair_sum, row_sumsq

    @triton.jit
    def _norm_sums_kernel(
        x_ptr,
        y_ptr,
        ps_ptr,
        rows_ptr,
        tree_ptr,
        M,
        K,
        G,
        BM: tl.constexpr,
        CH: tl.constexpr,
        UNROLL: tl.constexpr,
        GP: tl.constexpr,
    ):
        """``_norm_sums``' one program."""
        rm = tl.arange(0, BM)
        row_ok = rm < M
        tl.store(
            rows_ptr + rm,
            row_sumsq(x_ptr + rm[:, None] * K, row_ok, K, BM, CH, UNROLL, ""),
            mask=row_ok,
        )
        for g in range(0, G):  # the producers: one 16-column group each
            rn = g * 16 + tl.arange(0, 16)
            ok = row_ok[:, None] & (rn[None, :] < K)
            xo = tl.load(x_ptr + rm[:, None] * K + rn[None, :], mask=ok, other=0.0)
            norm_partials(
                xo.to(tl.float32),
                y_ptr,
                tl.full([16], 1.0, tl.float32),
                ps_ptr,
                rm,
                rn,
                row_ok,
                ok,
                g,
                G,
                K,
                0.0,
            )
        tl.debug_barrier()  # the subtrees other threads stored
        gi = tl.arange(0, GP)
        ps = tl.load(
            ps_ptr + rm[:, None] * G + gi[None, :],
            mask=row_ok[:, None] & (gi[None, :] < G),
            other=0.0,
        )
        tl.store(tree_ptr + rm, pair_sum(ps, GP), mask=row_ok)


def _tree_sum(v: torch.Tensor) -> torch.Tensor:
    """The fused norm's sum (float32): the perfect pairwise tree of adjacent elements over
    the last dim padded with zeros to a power of two, each level one elementwise add."""
    width = 1 << max(1, (v.shape[-1] - 1).bit_length())
    v = F.pad(v, (0, width - v.shape[-1]))
    while v.shape[-1] > 1:
        v = v[..., 0::2] + v[..., 1::2]
    return v[..., 0]


def _norm_sums(x: torch.Tensor, chunk: int, unroll: int, bm: int):
    """The kernels' two ways to that sum, run: from the rows (``row_sumsq``: chunks of
    ``chunk`` columns, ``unroll`` a round) and from 16-column subtrees (``pair_sum`` of the
    subtrees as the stack's producers store them, ``norm_partials``)."""
    m, k = x.shape
    g = -(-k // 16)
    rows, tree = (torch.empty(m, dtype=torch.float32, device=x.device) for _ in range(2))
    y = torch.empty_like(x)
    ps = torch.empty(m, g, dtype=torch.float32, device=x.device)
    _norm_sums_kernel[(1,)](
        x,
        y,
        ps,
        rows,
        tree,
        m,
        k,
        g,
        BM=bm,
        CH=chunk,
        UNROLL=unroll,
        GP=max(2, 1 << (g - 1).bit_length()),
    )
    return rows, tree, y


@needs_triton
@pytest.mark.parametrize("k", [16, 48, 576, 600, 2040])
@pytest.mark.parametrize("chunk,unroll", [(64, 1), (64, 8), (32, 3), (128, 2)])
def test_norm_sum_of_squares_is_the_pairwise_tree(k, chunk, unroll):
    """The fused norm's sum of squares, from the rows in any chunking and from 16-column
    subtrees, is bit for bit the pairwise tree computed by torch (float32 adds are exact
    IEEE on both sides), so the decode stack's hand-over gives the layered kernels' bits;
    the handed-over operand is the rows times the weight, rounded."""
    torch.manual_seed(k)
    x = _rand(5, k, scale=3.0)
    rows, tree, y = _norm_sums(x, chunk, unroll, 8)
    want = _tree_sum(x.float() * x.float())
    assert torch.equal(rows, want)
    assert torch.equal(tree, want)
    assert torch.equal(y, x)  # a weight of ones: the rows themselves


@cuda_only
@pytest.mark.parametrize("op", ["norm_linear", "linear_residual", "norm_gate_up_silu"])
def test_row_bits_independent_of_row_count_and_tile_shape(op):
    from mmserve.kernels import triton_fused

    torch.manual_seed(1)
    k, n = 2600, 384  # K not a multiple of the norm chunk or of any BK
    x, nw, w = _inputs(300, n, k, 2)
    b, r = _rand(n), _rand(300, n // 2 if "gate" in op else n)

    def run(m, cfg=None):
        if op == "norm_linear":
            return triton_fused.norm_linear(x[:m], nw, EPS, 0.0, w, b, config=cfg)
        if op == "linear_residual":
            return triton_fused.linear_residual(x[:m, :1024], w[:, :1024], r[:m], config=cfg)
        return triton_fused.norm_gate_up_silu(x[:m], nw, EPS, 0.0, w, config=cfg)

    base = run(1)[0]
    for m in (1, 2, 7, 16, 17, 64, 65, 200, 257, 300):
        assert torch.equal(run(m)[0], base), m
    for cfg in CONFIGS:
        assert torch.equal(run(96, cfg)[0], base), cfg


def test_residual_config_deepens_thin_long_k_tiles_where_two_fit_an_sm(monkeypatch):
    from mmserve.kernels import settings, triton_fused
    from mmserve.kernels.triton_matmul import pick_config

    cuda = torch.device("cuda", 0)
    for major, deep in ((9, True), (10, True), (8, False), (12, False)):
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d, major=major: (major, 0))
        triton_fused._DEEP.clear()
        for k, stages in ((14336, 7), (8192, 7), (4096, 6), (2048, 4), (576, 4)):
            cfg = triton_fused.residual_config(1, 4096, k, cuda)
            assert cfg == pick_config(1, 4096)._replace(stages=stages if deep else 4), (major, k)
        assert triton_fused.residual_config(64, 4096, 14336, cuda) == pick_config(64, 4096)
        # another thin tile (a gate_up width's) keeps its own stages
        assert triton_fused.residual_config(1, 28672, 4096, cuda) == pick_config(1, 28672)
    assert triton_fused.residual_config(1, 4096, 14336, torch.device("cpu")) == pick_config(1, 4096)
    with settings.override(tiles=((16, (16, 32, 128, 4, 3)),)):  # a bench's tile stays as set
        assert triton_fused.residual_config(1, 4096, 14336, cuda) == TileConfig(16, 32, 128, 4, 3)
    triton_fused._DEEP.clear()


@cuda_only
@pytest.mark.parametrize("k", [14336, 4096])
def test_deep_residual_pipeline_is_the_same_bits(k):
    from mmserve.kernels import triton_fused
    from mmserve.kernels.triton_matmul import invariant_linear, pick_config

    x, _, w = _inputs(16, 256, k, k)
    r = _rand(16, 256, scale=4.0)
    four = pick_config(1, 256)._replace(stages=4)
    if triton_fused.residual_config(1, 256, k, x.device).stages == 4:
        pytest.skip("a GPU without the deeper pipeline (sm_90 / sm_100 only)")
    for m in (1, 5, 16):
        got = triton_fused.linear_residual(x[:m], w, r[:m])
        assert torch.equal(got, triton_fused.linear_residual(x[:m], w, r[:m], config=four)), m
        assert torch.equal(got, r[:m] + invariant_linear(x[:m], w)), m


def test_thin_gated_config_takes_wide_gate_ups_of_thin_steps():
    from mmserve.kernels import settings, triton_fused

    assert triton_fused.thin_gated_config(1, 28672) == triton_fused.GATED_THIN
    assert triton_fused.thin_gated_config(16, 16384) == triton_fused.GATED_THIN
    assert triton_fused.thin_gated_config(17, 28672) is None  # prefill: GEMM + silu_mul
    assert triton_fused.thin_gated_config(1, 3072) is None  # SmolLM2-135M: fused norm anyway
    assert triton_fused.thin_gated_config(1, 2 * 18944 + 2) is None  # above MLP_MAX_WIDTH
    with settings.override(tiles=((16, (16, 16, 256, 2, 4)),)):
        assert triton_fused.thin_gated_config(1, 28672) is None  # a bench set the thin tile


@cuda_only
def test_wide_thin_steps_take_the_gated_epilogue_with_the_compositions_bits(monkeypatch):
    """A wide model's MLP (no fused norm) at <= 16 rows runs silu * up in gate_up's
    epilogue: the bits of the norm, the invariant GEMM and ``silu_mul``; 17 rows keep the
    composition."""
    from mmserve.kernels import triton_fused
    from mmserve.kernels.norm import rms_norm
    from mmserve.kernels.triton_matmul import invariant_linear

    calls = {"gated": 0}
    real = triton_fused.gate_up_silu

    def counted(*a, **kw):
        calls["gated"] += 1
        return real(*a, **kw)

    monkeypatch.setattr(triton_fused, "gate_up_silu", counted)
    k, inter = 4096, 8192
    assert k > fused.FUSE_MAX_HIDDEN
    x, nw, w = _inputs(17, 2 * inter, k, 11)
    for m in (1, 5, 16, 17):
        got = fused.norm_gate_up_silu(x[:m], nw, EPS, 0.0, w)
        want = fused.silu_mul(invariant_linear(rms_norm(x[:m], nw, EPS, 0.0), w))
        assert torch.equal(got, want), m
    assert calls["gated"] == 3


def test_unfused_path_is_the_plain_composition():
    """CPU (or fusion off): each op is exactly the calls the models made before fusion."""
    from mmserve.kernels.attention import write_kv
    from mmserve.kernels.linear import linear
    from mmserve.kernels.norm import rms_norm

    torch.manual_seed(3)
    x, nw, w = torch.randn(5, 64), torch.randn(64), torch.randn(96, 64)
    r = torch.randn(5, 96)
    assert torch.equal(fused.norm_linear(x, nw, EPS, 1.0, w), linear(rms_norm(x, nw, EPS, 1.0), w))
    assert torch.equal(fused.linear_residual(x, w, r), r + linear(x, w))
    g, u = linear(rms_norm(x, nw, EPS), w).split(48, dim=-1)
    assert torch.equal(fused.norm_gate_up_silu(x, nw, EPS, 0.0, w), F.silu(g) * u)
    table = RotaryTable(16, 10000.0, 64)
    qkv = torch.randn(5, 4 * 16)
    q, k, v = (t.reshape(5, -1, 16) for t in qkv.split([32, 16, 16], dim=-1))
    pos, slots = torch.arange(5), torch.tensor([3, 9, 4, 0, 12])
    kv, kv_want = (LayerKV(torch.zeros(2, 8, 1, 16), torch.zeros(2, 8, 1, 16)) for _ in "ab")
    got = fused.rope_write_kv(q, k, v, pos, table, kv, slots)
    write_kv(kv_want, table.rotate(k, pos), v, slots)
    assert torch.equal(got, table.rotate(q, pos))
    assert torch.equal(kv.k, kv_want.k) and torch.equal(kv.v, kv_want.v)
    # the QKV product with rope in its epilogue is CUDA's only: the model composes the above
    assert (
        fused.qkv_rope(x, nw, EPS, 0.0, torch.randn(64, 64), None, 2, 1, pos, table, kv, slots)
        is None
    )


def _tiny_llama(h=256, inter=512, heads=4, kv_heads=2):
    from mmserve.models.registry import build_model

    layers, vocab = 2, 1000
    cfg = dict(
        model_type="llama",
        hidden_size=h,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        intermediate_size=inter,
        vocab_size=vocab,
        head_dim=64,
        tie_word_embeddings=False,
        max_position_embeddings=512,
        rms_norm_eps=EPS,
    )
    torch.manual_seed(0)
    names = {
        "model.embed_tokens.weight": (vocab, h),
        "lm_head.weight": (vocab, h),
        "model.norm.weight": (h,),
    }
    for i in range(layers):
        p = f"model.layers.{i}"
        names |= {
            f"{p}.self_attn.q_proj.weight": (h, h),
            f"{p}.self_attn.k_proj.weight": (64 * kv_heads, h),
            f"{p}.self_attn.v_proj.weight": (64 * kv_heads, h),
            f"{p}.self_attn.o_proj.weight": (h, h),
            f"{p}.mlp.gate_proj.weight": (inter, h),
            f"{p}.mlp.up_proj.weight": (inter, h),
            f"{p}.mlp.down_proj.weight": (h, inter),
            f"{p}.input_layernorm.weight": (h,),
            f"{p}.post_attention_layernorm.weight": (h,),
        }
    sd = {
        k: torch.randn(s) * (0.3 if len(s) == 1 else s[-1] ** -0.5) + (len(s) == 1)
        for k, s in names.items()
    }
    return build_model(cfg, sd, torch.bfloat16, "cuda")


def _run(model, prompt, tokens):
    """Logits of the prompt's last position, then of each given token fed in turn."""
    from mmserve.models.harness import SequenceRunner

    runner = SequenceRunner(model, 96)
    out = [runner.step(prompt, 0)[-1]]
    for i, t in enumerate(tokens):
        out.append(runner.step([t], len(prompt) + i)[-1])
    return torch.stack(out)  # (steps, V) float32


@cuda_only
@pytest.mark.parametrize("qkv_rope", [True, False])
def test_whole_model_fused_matches_unfused(monkeypatch, qkv_rope):
    from mmserve.kernels import settings, triton_fused

    # the layered fused ops
    layered = dataclasses.replace(settings.current(), decode_stack=False, qkv_rope=qkv_rope)
    monkeypatch.setattr(settings, "_installed", [layered])

    calls = {"n": 0}
    for name in (
        "norm_linear",
        "linear_residual",
        "norm_gate_up_silu",
        "rope_write_kv",
        "qkv_rope",
    ):
        real = getattr(triton_fused, name)

        def counted(*a, _real=real, **kw):
            calls["n"] += 1
            return _real(*a, **kw)

        monkeypatch.setattr(triton_fused, name, counted)
    model = _tiny_llama()
    prompt = torch.randint(0, 1000, (21,), generator=torch.Generator().manual_seed(5)).tolist()
    with settings.override(fused=False):
        plain = _run(model, prompt, [])
        tokens = []  # the unfused model's greedy continuation
        for _ in range(8):
            tokens.append(int(plain[-1].argmax()))
            plain = _run(model, prompt, tokens)
    assert calls["n"] == 0
    got = _run(model, prompt, tokens[:-1])  # the same inputs, fused
    # 8 steps x 2 layers x 5 fused ops (4 with rope and the cache write in the QKV product)
    assert calls["n"] == 8 * 2 * (4 if qkv_rope else 5)
    want = plain[:-1]
    # only rare 1-ulp flips can differ (the norm's sum order, silu's exp): logits ~ N(0, 1)
    torch.testing.assert_close(got, want, atol=0.05, rtol=0.02)
    top2 = want.topk(2, dim=-1).values
    clear = (top2[:, 0] - top2[:, 1]) > 0.05  # greedy agrees wherever it is not a near tie
    assert clear.sum() >= 4
    assert torch.equal(got.argmax(-1)[clear], want.argmax(-1)[clear])
    gen = _run(model, prompt, [])  # fused greedy itself: same tokens while no near tie
    fused_tokens = []
    for _ in range(8):
        fused_tokens.append(int(gen[-1].argmax()))
        gen = _run(model, prompt, fused_tokens)
    first_tie = int((~clear).nonzero()[0]) if (~clear).any() else 8
    assert fused_tokens[:first_tie] == tokens[:first_tie]


@cuda_only
@pytest.mark.parametrize("qkv_rope", [True, False])
def test_wide_model_fused_is_the_unfused_bits(monkeypatch, qkv_rope):
    """Above FUSE_MAX_HIDDEN no norm is fused, so the fused ops there (the residual
    epilogues, rope + cache write on their own or in the QKV product's epilogue, silu *
    up) have the unfused path's bits: the whole model's logits are equal, prefill and
    decode."""
    from mmserve.kernels import settings, triton_fused

    monkeypatch.setattr(
        settings, "_installed", [dataclasses.replace(settings.current(), qkv_rope=qkv_rope)]
    )
    calls = {"n": 0}
    for name in ("linear_residual", "qkv_rope" if qkv_rope else "rope_write_kv", "silu_mul"):
        real = getattr(triton_fused, name)

        def counted(*a, _real=real, **kw):
            calls["n"] += 1
            return _real(*a, **kw)

        monkeypatch.setattr(triton_fused, name, counted)
    h = 64 * 33
    assert h > fused.FUSE_MAX_HIDDEN
    model = _tiny_llama(h=h, inter=1024, heads=33, kv_heads=3)
    prompt = torch.randint(0, 1000, (21,), generator=torch.Generator().manual_seed(6)).tolist()
    tokens = [5, 17, 900, 3, 3, 41]
    got = _run(model, prompt, tokens)
    # 7 steps x 2 layers x (o, down, rope + write, silu * up)
    assert calls["n"] == 7 * 2 * 4
    with settings.override(fused=False):
        want = _run(model, prompt, tokens)
    assert calls["n"] == 56
    assert torch.equal(got, want)


if INTERPRET and not ON_CUDA:  # the interpreter runs float32 only (triton_kit)
    assert DTYPE == torch.float32


@cuda_only
@pytest.mark.parametrize("hq,hkv,d", [(9, 3, 64), (32, 8, 128)])
def test_rope_write_kv_into_fp8_cache_is_rotate_then_quantising_write(hq, hkv, d):
    """fp8 cache: the fused kernel stores the bytes and scales of the unfused kernels
    (rope, then the quantising ``cuda_write_kv``); padding slots keep their old bytes."""
    from mmserve.kernels.fp8 import FP8_DTYPE
    from mmserve.kernels.triton_attention import cuda_write_kv
    from mmserve.kernels.triton_fused import rope_write_kv
    from mmserve.kernels.triton_rope import cuda_rope

    torch.manual_seed(hq + d)
    n, blocks, bs = 37, 8, 16
    table = RotaryTable(d, 500000.0, 4096, device=DEVICE)
    q, k, v = _qkv_views(n, hq, hkv, d)
    k[5] = 0.0  # an all-zero head: scale 0, zeros stored
    pos = torch.randint(0, 4096, (n,), device=DEVICE)
    slots = torch.randperm(blocks * bs, device=DEVICE)[:n]
    slots[[3, 20, 36]] = -1

    def caches():
        c = [torch.full((blocks, bs, hkv, d), 3.0, device=DEVICE).to(FP8_DTYPE) for _ in "kv"]
        return c + [torch.full((blocks, bs, hkv), 0.5, device=DEVICE) for _ in "kv"]

    kc, vc, ks, vs = caches()
    got_q = rope_write_kv(q, k, v, pos, table.cos, table.sin, kc, vc, slots, ks, vs)
    rk, rv, rks, rvs = caches()
    cuda_write_kv(rk, rv, cuda_rope(k, table.cos, table.sin, pos), v, slots, rks, rvs)
    assert torch.equal(got_q, cuda_rope(q, table.cos, table.sin, pos))
    for got, want in ((kc, rk), (vc, rv)):
        assert torch.equal(got.view(torch.uint8), want.view(torch.uint8))
    assert torch.equal(ks, rks) and torch.equal(vs, rvs)
