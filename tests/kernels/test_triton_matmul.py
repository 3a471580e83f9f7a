"""Batch-invariant Triton GEMM against F.linear; its row bits across row counts and launches."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from triton_kit import DEVICE, DTYPE, ON_CUDA, TOL, needs_triton

pytestmark = needs_triton

try:
    import triton
    import triton.language as tl

    from mmserve.kernels.triton_matmul import _q8_dequant
except ImportError:  # CPU-only installs: every test here skips
    triton = None

if triton is not None:

    @triton.jit
    def _dequant_kernel(q_ptr, d_ptr, o_ptr, QB: tl.constexpr, BN: tl.constexpr, FMA: tl.constexpr):
        """``_q8_dequant`` alone: (programs x BN scales) x QB values."""
        rn = tl.program_id(0) * BN + tl.arange(0, BN)
        rk = tl.arange(0, QB)
        q = tl.load(q_ptr + rn[:, None] * QB + rk[None, :])
        w = _q8_dequant(q, tl.load(d_ptr + rn), o_ptr.dtype.element_ty, FMA)
        tl.store(o_ptr + rn[:, None] * QB + rk[None, :], w)


def _rand(*shape):
    return torch.randn(*shape, device=DEVICE).to(DTYPE)


@pytest.mark.parametrize("m,n,k", [(1, 96, 576), (5, 960, 576), (70, 200, 2100), (300, 130, 64)])
@pytest.mark.parametrize("with_bias", [False, True])
def test_matches_f_linear(m, n, k, with_bias):
    from mmserve.kernels.triton_matmul import invariant_linear

    torch.manual_seed(m + n + k)
    x, w = _rand(m, k), _rand(n, k) / k**0.5
    b = _rand(n) if with_bias else None
    got = invariant_linear(x, w, b)
    want = F.linear(x.double(), w.double(), None if b is None else b.double())
    torch.testing.assert_close(got.double(), want, atol=TOL, rtol=TOL)


@pytest.mark.skipif(not ON_CUDA, reason="half precision: the interpreter runs float32")
@pytest.mark.parametrize("m,n,k", [(1, 49152, 576), (5, 960, 576), (70, 200, 2100)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_float_out_is_the_product_rounded_then_cast(m, n, k, dtype):
    """The LM head's float32 logits: the same bits as the half product and ``.float()``."""
    from mmserve.kernels.linear import logits_linear
    from mmserve.kernels.triton_matmul import invariant_linear

    torch.manual_seed(m + n)
    x, w = _rand(m, k).to(dtype), (_rand(n, k) / k**0.5).to(dtype)
    want = invariant_linear(x, w).float()
    got = invariant_linear(x, w, float_out=True)
    assert got.dtype == torch.float32 and torch.equal(got, want)
    assert torch.equal(logits_linear(x, w), want)


@pytest.mark.skipif(not ON_CUDA, reason="bits: the interpreter's numpy matmul varies by shape")
def test_row_bits_independent_of_row_count_and_tile_shape():
    from mmserve.kernels.triton_matmul import TileConfig, invariant_linear

    torch.manual_seed(0)
    k, n = 2560, 384
    w, b = _rand(n, k) / k**0.5, _rand(n)
    x = _rand(600, k)
    base = invariant_linear(x[:1], w, b)[0]
    for m in (1, 2, 7, 16, 17, 64, 65, 200, 300, 600):
        assert torch.equal(invariant_linear(x[:m], w, b)[0], base), m
    for cfg in (
        TileConfig(16, 16, 512, 4, 3),
        TileConfig(64, 32, 64, 4, 2),
        TileConfig(128, 64, 128, 8, 4),
        TileConfig(128, 256, 64, 8, 3),
    ):
        assert torch.equal(invariant_linear(x[:96], w, b, config=cfg)[0], base), cfg


def test_a_vocabulary_over_a_narrow_hidden_takes_its_own_thin_tile():
    from mmserve.kernels.triton_matmul import TileConfig, pick_config

    assert pick_config(1, 49152, 576) == TileConfig(16, 128, 64, 4, 5)  # SmolLM2-135M
    assert pick_config(1, 128256, 4096) == pick_config(1, 128256)  # the 8B's lm_head
    assert pick_config(64, 49152, 576) == pick_config(64, 49152)  # only thin steps


@pytest.mark.skipif(not ON_CUDA, reason="bits: the interpreter's numpy matmul varies by shape")
def test_narrow_hidden_lm_head_rows_keep_their_bits():
    from mmserve.kernels.triton_matmul import TileConfig, invariant_linear

    torch.manual_seed(1)
    k, n = 576, 49152
    w, x = _rand(n, k) / k**0.5, _rand(64, k)
    base = invariant_linear(x[:1], w, float_out=True)[0]
    for m in (2, 16, 17, 64):
        assert torch.equal(invariant_linear(x[:m], w, float_out=True)[0], base), m
    old = TileConfig(16, 32, 256, 4, 4)  # another tile: the bits must not depend on it
    assert torch.equal(invariant_linear(x[:1], w, config=old, float_out=True)[0], base)


def _q8(n, k, seed):
    """A random (n, k) weight as Q8_0 blocks (as the shipped GGUFs store their LM heads)."""
    from mmserve.kernels.q8 import quantize_q8

    torch.manual_seed(seed)
    return quantize_q8(torch.randn(n, k) / k**0.5).to(DEVICE)


@pytest.mark.parametrize("m,n,k", [(1, 1000, 576), (5, 384, 640), (16, 130, 64), (17, 256, 96)])
def test_q8_linear_matches_f_linear_on_its_dequantized_weight(m, n, k):
    from mmserve.kernels.triton_matmul import q8_linear

    w8 = _q8(n, k, m + n)
    x = _rand(m, k)
    w = w8.dequantize(DTYPE)
    got = q8_linear(x, w8)
    assert got.dtype == DTYPE and got.shape == (m, n)
    want = F.linear(x.double(), w.double())
    torch.testing.assert_close(got.double(), want, atol=TOL, rtol=TOL)
    assert torch.equal(q8_linear(x, w8, float_out=True), got.float())


@pytest.mark.skipif(ON_CUDA, reason="the interpreter's form of the bits test below")
def test_q8_linear_is_the_gemm_at_its_tile_on_the_interpreter():
    """float32 (the interpreter's): dequantizing is exact, so with the same tile shape the
    two kernels hand numpy the same operands."""
    from mmserve.kernels.triton_matmul import invariant_linear, q8_linear, q8_tile

    w8 = _q8(300, 576, 3)
    x = _rand(5, 576)
    assert torch.equal(
        q8_linear(x, w8), invariant_linear(x, w8.dequantize(DTYPE), config=q8_tile(300, x.device))
    )


@pytest.mark.skipif(not ON_CUDA, reason="bits: the interpreter's numpy matmul varies by shape")
@pytest.mark.parametrize("n,k", [(49152, 576), (4096, 640), (1000, 2048)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_q8_linear_has_the_half_weights_bits(n, k, dtype):
    """Rows 1-16 (the batch-1 logits, a verify block): the bits of the half-precision
    weight's GEMM at its own tiles (wider K steps), as float32 logits and as dtype."""
    from mmserve.kernels.triton_matmul import TileConfig, invariant_linear, q8_linear

    w8 = _q8(n, k, n + k)
    w = w8.dequantize(dtype)
    torch.manual_seed(k)
    x = _rand(16, k).to(dtype)
    for m in (1, 2, 7, 16):
        want = invariant_linear(x[:m], w, float_out=True)
        assert torch.equal(q8_linear(x[:m], w8, float_out=True), want), m
        assert torch.equal(q8_linear(x[:m], w8), invariant_linear(x[:m], w)), m
    for cfg in (
        TileConfig(16, 64, 32, 4, 4),
        TileConfig(16, 128, 32, 4, 8),
        TileConfig(16, 256, 32, 8, 6),
        TileConfig(64, 64, 32, 4, 3),
    ):
        assert torch.equal(
            q8_linear(x, w8, config=cfg, float_out=True), invariant_linear(x, w, float_out=True)
        ), cfg


@pytest.mark.skipif(not ON_CUDA, reason="the Q8_0 LM head is a CUDA path")
def test_logits_linear_reads_q8_blocks_up_to_16_rows_with_the_same_bits():
    from mmserve.kernels import linear, settings

    w8 = _q8(4096, 576, 7)
    w = w8.dequantize(torch.bfloat16)
    x = _rand(40, 576)
    with settings.override(q8_head=True):
        for m in (1, 16, 17, 40):  # 17 and 40: the half weight's GEMM
            assert torch.equal(linear.logits_linear(x[:m], w, w8), linear.logits_linear(x[:m], w))
    with settings.override(q8_head=False):
        assert torch.equal(linear.logits_linear(x[:1], w, w8), linear.logits_linear(x[:1], w))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_q8_dequant_is_the_rounded_float32_product_for_every_scale(dtype):
    """``_q8_dequant`` itself (the kernel's fma form on CUDA, its two-op form under the
    interpreter) over every fp16 scale from 0 through the subnormals to the largest (every
    11th on CPU) and every int8 value: the bits of ``(q * d).to(dtype)`` (a zero scale with
    q = 0, as ``Q8Weight`` keeps them)."""
    if not ON_CUDA and dtype != torch.float32:
        pytest.skip("the interpreter runs float32")
    from mmserve.kernels.triton_matmul import _interpreting

    kernel = _dequant_kernel
    d = torch.arange(0, 0x7C00, 1 if ON_CUDA else 11, dtype=torch.int16).view(torch.float16)
    d = d.float()
    d = torch.cat([d, d.new_zeros((-d.numel()) % 64)])  # whole programs of 64 scales
    q = torch.arange(-127, 129, dtype=torch.int16).clamp(max=127).to(torch.int8)
    q = q[None, :].repeat(d.numel(), 1)  # every value (127 twice: 256 a row)
    q[d == 0] = 0
    want = (q.float() * d[:, None]).to(dtype)
    out = torch.empty(want.shape, dtype=dtype, device=DEVICE)
    kernel[(d.numel() // 64,)](
        q.to(DEVICE), d.to(DEVICE), out, QB=256, BN=64, FMA=not _interpreting()
    )
    bits = {2: torch.int16, 4: torch.int32}[want.element_size()]
    assert torch.equal(out.cpu().view(bits), want.view(bits))
