"""Programmatic dependent launch: where it is on, and that it changes no bit.

With PDL a kernel starts while its predecessor runs and waits for it at
``griddepcontrol.wait``; a kernel that read an activation before that wait would read
the previous step's values. Chains of dependent kernels, eager and replayed from a CUDA
graph, must give the bits they give with PDL off (CUDA, sm_90+)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from mmserve.kernels import settings
from mmserve.kernels.triton_pdl import pdl_launch

HOPPER = torch.cuda.is_available() and torch.cuda.get_device_capability()[0] >= 9
hopper_only = pytest.mark.skipif(not HOPPER, reason="PDL needs an sm_90+ GPU")


def test_pdl_is_off_on_cpu_and_when_disabled(monkeypatch):
    assert not pdl_launch(torch.zeros(1))
    if HOPPER:
        t = torch.zeros(1, device="cuda")
        assert pdl_launch(t)
        with settings.override(pdl=False):
            assert not pdl_launch(t)
        monkeypatch.setenv("TRITON_INTERPRET", "1")
        assert not pdl_launch(t)
    assert settings.current().pdl


def _chain(x, weights, norm, late=False):
    """A chain of dependent launches, each reading the one before's output (the layer
    ops: norm + GEMM, GEMM + residual, norm + GEMM + silu * up, plain GEMM). With
    ``late`` the GEMMs let the next kernel launch after their K loop, each followed by a
    PDL kernel that reads its output: a residual GEMM by a norm GEMM and by a plain GEMM,
    a gated GEMM without a norm by a residual GEMM, a plain GEMM by ``silu_mul``."""
    from mmserve.kernels import triton_fused
    from mmserve.kernels.triton_matmul import invariant_linear

    for w_in, w_out, w_gu, w_down, w_sq, w_hh in weights:
        h = triton_fused.norm_linear(x, norm, 1e-5, 0.0, w_in)
        x = triton_fused.linear_residual(h, w_out, x, late=late)
        g = triton_fused.norm_gate_up_silu(x, norm, 1e-5, 0.0, w_gu)
        x = triton_fused.linear_residual(g, w_down, x, late=late)
        x = invariant_linear(x, w_in[: x.shape[1]]) + x
        if late:
            g = triton_fused.gate_up_silu(x, w_sq, late=True)
            x = triton_fused.linear_residual(g, w_hh, x, late=True)
            g = triton_fused.silu_mul(invariant_linear(x, w_sq, late=True))
            x = triton_fused.linear_residual(g, w_hh, x)
    return x


@hopper_only
@pytest.mark.parametrize("rows", [1, 5, 64])
@pytest.mark.parametrize("late", [False, True])
def test_dependent_chain_same_bits_with_pdl_eager_and_in_a_graph(rows, late):
    gen = torch.Generator(device="cuda").manual_seed(0)

    def rand(*s):
        return (torch.randn(*s, device="cuda", generator=gen) * s[-1] ** -0.5).to(torch.bfloat16)

    h, inter = 576, 1536  # SmolLM2-135M's widths: K not a multiple of the prefetch stride
    weights = [
        (rand(960, h), rand(h, 960), rand(2 * inter, h), rand(h, inter), rand(2 * h, h), rand(h, h))
        for _ in range(6)
    ]
    norm = rand(h) + 1
    x0 = rand(rows, h) * 8
    with settings.override(pdl=False):
        want = _chain(x0, weights, norm, late)
    assert torch.equal(_chain(x0, weights, norm, late), want)  # eager, PDL on
    static_x = x0.clone()
    _chain(static_x, weights, norm, late)  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = _chain(static_x, weights, norm, late)
    for seed in range(3):  # new inputs each replay: a stale read would show
        static_x.copy_(rand(rows, h) * (seed + 1))
        graph.replay()
        with settings.override(pdl=False):
            ref = _chain(static_x, weights, norm, late)
        assert torch.equal(out, ref), seed


@hopper_only
@torch.inference_mode()
def test_model_decode_graph_same_logits_with_and_without_pdl(tiny_llama):
    """Graph decode of a 2-layer model (every kernel of a step, attention and the fused
    rope + KV write included) with PDL on and off: the same logits and KV bytes."""
    from mmserve.bench.engine_run import make_kv
    from mmserve.engine.cuda_graphs import DecodeGraphs

    model = tiny_llama()
    page, blocks = 16, 32
    rng = np.random.default_rng(1)
    table = rng.permutation(np.arange(1, blocks))[:8][None].astype(np.int64)
    prompt = rng.integers(0, 1000, 40).tolist()
    results = []
    for pdl in (False, True):
        with settings.override(pdl=pdl):
            kv = make_kv(model, blocks, torch.bfloat16)
            graphs = DecodeGraphs(model, kv, blocks, (1, 4), (16, 64), last_row_only=False)
            graphs.capture()
            graphs.run_verify([prompt[:33]], [0], table, page)  # prefill by the eager-shaped
            ids, logits = [prompt[33]], []
            for step in range(12):
                out = graphs.run([ids[-1]], [33 + step], table, page)
                logits.append(out.clone())
                ids.append(int(out[0].argmax()))
            results.append((torch.cat(logits), kv.clone(), ids))
    (want, want_kv, want_ids), (got, got_kv, got_ids) = results
    assert got_ids == want_ids
    assert torch.equal(got, want)
    assert torch.equal(got_kv, want_kv)
