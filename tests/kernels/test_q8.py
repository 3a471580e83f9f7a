"""Q8_0 blocks of an LM head (``kernels/q8.py``): found in the real models' float32 weights,
checked against the GGUF files' own bytes and against the ``gguf`` package's quantizer."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch
from triton_kit import ON_CUDA

from mmserve.kernels.q8 import BLOCK, Q8Weight, factor_q8, quantize_q8
from mmserve.models.weights import load_state_dict


def _gguf_blocks(path, name: str = "token_embd.weight") -> tuple[torch.Tensor, torch.Tensor]:
    """The file's Q8_0 blocks of ``name``: (N, K / 32) fp16 scales, (N, K) int8 values."""
    reader = gguf.GGUFReader(str(path))
    t = next(t for t in reader.tensors if t.name == name)
    assert t.tensor_type == gguf.GGMLQuantizationType.Q8_0
    n, k = int(t.shape[1]), int(t.shape[0])
    raw = np.asarray(t.data).reshape(n, k // BLOCK, 2 + BLOCK)  # a block: fp16 d, 32 int8
    d = torch.from_numpy(raw[:, :, :2].copy().view(np.float16)[..., 0])
    q = torch.from_numpy(raw[:, :, 2:].copy().view(np.int8)).reshape(n, k)
    return d, q


def _rows(w: Q8Weight) -> tuple[torch.Tensor, torch.Tensor]:
    """(N, K / 32) scales and (N, K) values of the block-major layout."""
    n, k = w.shape
    return w.scale.t(), w.q.permute(1, 0, 2).reshape(n, k)


def test_the_default_models_lm_head_is_its_gguf_q8_0_blocks(default_model_dir, default_gguf):
    """The converted model's float32 embedding (its tied LM head) factors into exactly the
    scales and values the GGUF file stores, and they give the bf16 and fp16 weights' bits."""
    w = load_state_dict(default_model_dir)["model.embed_tokens.weight"]
    blocks = factor_q8(w)
    assert blocks is not None and blocks.shape == tuple(w.shape)
    d, q = _gguf_blocks(default_gguf)
    scale, values = _rows(blocks)
    assert scale.dtype == torch.float32 and torch.equal(scale, d.float())
    assert torch.equal(values, q)
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        assert blocks.matches(w.to(dtype)), dtype


def test_quantize_q8_is_the_gguf_packages_q8_0():
    """Random rows (a zero block, a block with one value, mixed signs) through ours and
    ``gguf.quants.quantize``: the same scales and values."""
    torch.manual_seed(0)
    w = torch.randn(8, 4 * BLOCK) * torch.logspace(-3, 1, 8)[:, None]
    w[0, :BLOCK] = 0.0
    w[1, BLOCK : 2 * BLOCK] = 0.0
    w[1, BLOCK + 5] = -3.25
    ours = quantize_q8(w)
    raw = gguf.quants.quantize(w.numpy(), gguf.GGMLQuantizationType.Q8_0)
    raw = raw.reshape(8, 4, 2 + BLOCK)
    d = torch.from_numpy(raw[:, :, :2].copy().view(np.float16)[..., 0])
    q = torch.from_numpy(raw[:, :, 2:].copy().view(np.int8)).reshape(8, -1)
    scale, values = _rows(ours)
    assert torch.equal(scale, d.float())
    assert torch.equal(values, q)
    for rows in (8192, 3):  # and the factoring undoes it, whole or a few rows at a time
        back = factor_q8(ours.dequantize(torch.float32), rows=rows)
        assert back is not None and torch.equal(back.q, ours.q)
        assert torch.equal(back.scale, ours.scale)


@pytest.mark.parametrize(
    "case",
    [
        "random",
        "bf16_values",
        "one_element_off",
        "k_not_blocks",
        "inf",
        "scale_not_fp16",
        "bf16_tensor",
    ],
)
def test_factor_q8_refuses_what_it_cannot_reproduce(case):
    torch.manual_seed(1)
    w = quantize_q8(torch.randn(16, 2 * BLOCK)).dequantize(torch.float32)
    if case == "random":
        w = torch.randn(16, 2 * BLOCK)
    elif case == "bf16_values":  # a bf16 checkpoint's weights, widened
        w = torch.randn(16, 2 * BLOCK).bfloat16().float()
    elif case == "one_element_off":
        w[3, 7] = torch.nextafter(w[3, 7], torch.tensor(1e9))
    elif case == "k_not_blocks":
        w = w[:, : BLOCK + 16].contiguous()
    elif case == "inf":
        w[0, 0] = float("inf")
    elif case == "scale_not_fp16":  # integers times a scale fp16 cannot hold
        w[5, :BLOCK] = torch.arange(-15, 17).float() * (1 / 3)
        w[5, 0] = 127 / 3
    elif case == "bf16_tensor":
        w = w.bfloat16()
    assert factor_q8(w) is None


def test_a_block_too_small_for_an_fp16_scale_is_zeros():
    """An amax below fp16's range rounds the scale to 0: its values are 0 too (the kernel
    makes +0 of a zero scale whatever q is), and the factoring takes it back."""
    w = torch.randn(2, 2 * BLOCK)
    w[1, :BLOCK] *= 1e-9
    blocks = quantize_q8(w)
    assert blocks.scale[0, 1] == 0 and bool((blocks.q[0, 1] == 0).all())
    deq = blocks.dequantize(torch.float32)
    assert not bool(torch.signbit(deq[1, :BLOCK]).any())
    back = factor_q8(deq)
    assert back is not None and torch.equal(back.q, blocks.q)


def test_a_negative_zero_is_refused():
    """-0.0 is not d * q for an int8 q (the kernel would make +0): not reproduced, refused."""
    w = quantize_q8(torch.randn(2, BLOCK)).dequantize(torch.float32)
    w[0, 3] = -0.0
    assert factor_q8(w) is None


def test_a_block_of_zeros_factors_and_dequantizes_to_zeros():
    w = quantize_q8(torch.randn(4, 2 * BLOCK)).dequantize(torch.float32)
    w[2, BLOCK:] = 0.0
    blocks = factor_q8(w)
    assert blocks is not None and blocks.matches(w)
    assert torch.equal(blocks.dequantize(torch.float32)[2, BLOCK:], torch.zeros(BLOCK))


def test_matches_compares_bits():
    """A weight that differs in one element's last bit, or in shape, is not matched."""
    w32 = quantize_q8(torch.randn(4, 2 * BLOCK)).dequantize(torch.float32)
    blocks, w = factor_q8(w32), w32.bfloat16()
    assert blocks is not None and blocks.matches(w)
    off = w.clone()
    off.view(torch.int16)[1, 3] += 1
    assert not blocks.matches(off)
    assert not blocks.matches(w[:3])


def test_attach_q8_head_takes_only_blocks_with_the_weights_bits(tiny_llama):
    """A model takes blocks for its LM head only if they give its weight's bits; its logits
    do not change either way (on CPU the product never reads them)."""
    model = tiny_llama("cpu")
    assert model.lm_head_q8 is None  # built on CPU: never looked for
    head = model.lm_head_weight()
    h = torch.randn(3, head.shape[1]).bfloat16()
    assert not model.attach_q8_head(quantize_q8(head.float())) and model.lm_head_q8 is None
    w32 = quantize_q8(head.float()).dequantize(torch.float32)
    head.data.copy_(w32.bfloat16())
    want = model.compute_logits(h)
    blocks = factor_q8(w32)
    assert blocks is not None and model.attach_q8_head(blocks)
    assert model.q8_head() is blocks
    assert torch.equal(model.compute_logits(h), want)


def test_the_blocks_are_dropped_when_the_weight_changes(tiny_llama):
    """Written in place, cast or replaced after the blocks were checked: ``q8_head`` gives
    None (the product reads the weight), so the blocks never stand for another weight."""
    model = tiny_llama("cpu")
    head = model.lm_head_weight()
    w32 = quantize_q8(head.float()).dequantize(torch.float32)
    head.data.copy_(w32.bfloat16())
    blocks = factor_q8(w32)
    assert model.attach_q8_head(blocks) and model.q8_head() is blocks
    with torch.no_grad():
        model.lm_head_weight().mul_(1.0)  # in place: the weight's version moves
    assert model.q8_head() is None
    assert model.attach_q8_head(blocks) and model.q8_head() is blocks
    model.half()  # cast: another tensor, another dtype
    assert model.q8_head() is None


def test_a_model_built_under_inference_mode_keeps_its_blocks(tiny_llama):
    """Built under ``torch.inference_mode`` (the benchmarks do), the weights are inference
    tensors, which keep no version counter: the blocks still attach and are read."""
    with torch.inference_mode():
        model = tiny_llama("cpu")
        head = model.lm_head_weight()
        assert head.is_inference()
        w32 = quantize_q8(head.float()).dequantize(torch.float32)
        head.copy_(w32.bfloat16())
        blocks = factor_q8(w32)
        assert blocks is not None and model.attach_q8_head(blocks)
        assert model.q8_head() is blocks
        model.compute_logits(torch.randn(2, head.shape[1]).bfloat16())


@pytest.mark.skipif(not ON_CUDA, reason="the Q8_0 LM head is a CUDA path")
def test_the_default_model_reads_its_lm_head_as_q8_on_cuda(default_model_dir):
    """Loaded on CUDA in bf16, the default model's LM head has its blocks attached, and its
    logits (1-16 rows, and 40: the bf16 weight's GEMM) are those of the bf16 weight."""
    from mmserve.kernels import settings
    from mmserve.models.registry import load_model

    model = load_model(default_model_dir, torch.bfloat16, "cuda")
    assert model.lm_head_q8 is not None
    torch.manual_seed(0)
    h = torch.randn(40, model.lm_head_weight().shape[1], device="cuda").bfloat16()
    for m in (1, 4, 16, 40):
        with settings.override(q8_head=True):
            on = model.compute_logits(h[:m])
        with settings.override(q8_head=False):
            off = model.compute_logits(h[:m])
        assert torch.equal(on, off), m


def test_the_kernels_dequantize_arithmetic_is_exact_for_every_scale_and_value():
    """``triton_matmul._q8_dequant`` on CUDA: f = the float32 of bits 0x4B400000 + q, then
    fma(f, d, -(d * 3 * 2^22)) with one rounding. Emulated exactly in float64 (every
    operand and the exact sum fit) for every positive finite fp16 scale and every q: the
    float32 it rounds to is d * q, and -(d * 3 * 2^22) is exact in float32 too."""
    q = torch.arange(-127, 128, dtype=torch.int32)
    f = (q + 0x4B400000).view(torch.float32)
    assert torch.equal(f.double(), 12582912.0 + q.double())
    d = torch.arange(1, 0x7C00, dtype=torch.int16).view(torch.float16).float()  # > 0, finite
    c = d * -12582912.0
    assert torch.equal(c.double(), d.double() * -12582912.0)
    fma = (f.double()[None, :] * d.double()[:, None] + c.double()[:, None]).float()
    assert torch.equal(fma, d[:, None] * q.float()[None, :])


def test_the_q8_heads_tile_widens_only_where_its_programs_are_few(monkeypatch):
    """SmolLM2-135M's 49,152-row head (384 programs at the narrow tile on 132 SMs) takes the
    wide tile, Gemma-3-270M's 262,144 rows the narrow one (the H100's head-alone times);
    a fixed ``KernelConfig.q8_tile`` (benchmarks) wins."""
    from mmserve.kernels import settings
    from mmserve.kernels import triton_matmul as tm

    monkeypatch.setattr(tm, "CPU_SMS", 132)
    cpu = torch.device("cpu")
    assert tm.q8_tile(49152, cpu) == tm.Q8_TILE_FEW
    assert tm.q8_tile(262144, cpu) == tm.Q8_TILE_MANY
    assert tm.q8_tile(128 * 4 * 132 + 1, cpu) == tm.Q8_TILE_MANY
    monkeypatch.setattr(tm, "CPU_SMS", 16)  # a small GPU: SmolLM2's head is many there
    assert tm.q8_tile(49152, cpu) == tm.Q8_TILE_MANY
    monkeypatch.setattr(tm, "CPU_SMS", 132)
    with settings.override(q8_tile=tuple(tm.Q8_TILE_MANY)):
        assert tm.q8_tile(49152, cpu) == tm.Q8_TILE_MANY
