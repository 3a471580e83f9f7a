"""The two-pass Triton argmax against torch's: first index of the maximum, NaN above all,
ties across and inside chunks, rows wider and narrower than a chunk, the graph's argmax."""

from __future__ import annotations

import pytest
import torch
from triton_kit import DEVICE, ON_CUDA, needs_triton

WIDTHS = (1, 7, 2048, 2049, 5000, 49152)


def _check(x: torch.Tensor, block: int = 2048) -> None:
    from mmserve.kernels.triton_argmax import cuda_argmax

    got = cuda_argmax(x, block)
    assert got.dtype == torch.int64 and got.shape == x.shape[:-1]
    assert torch.equal(got.cpu(), x.argmax(-1).cpu()), (got, x.argmax(-1))


@needs_triton
@pytest.mark.parametrize("v", WIDTHS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_random_rows_match_torch(v, dtype):
    if dtype is torch.bfloat16 and not ON_CUDA:
        pytest.skip("the interpreter runs float32")
    g = torch.Generator().manual_seed(v)
    x = (torch.randn(5, v, generator=g) * 4).to(dtype).to(DEVICE)
    _check(x)
    _check(x, block=64)  # many chunks a row, the second pass wider than one


@needs_triton
@pytest.mark.parametrize("v", (7, 2049, 5000))
def test_ties_take_the_first_index(v):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(6, v, generator=g)
    top = x.max() + 1
    x[0, [v - 1, 0]] = top  # first and last column
    x[1, [v // 2, v // 2 + 1, v - 1]] = top  # inside one chunk and across
    x[2, :] = 3.0  # every column equal
    x[3, :] = float("-inf")  # nothing but -inf: index 0, as torch
    x[4, [v - 1, v // 3]] = float("inf")
    x[5, [v // 3, 2 * v // 3]] = -0.0  # -0 and 0 are equal: the first wins
    x[5, [v // 3 - 1]] = 0.0
    x[5, torch.arange(v) > v // 3 + 1] = -1.0
    x[5, : v // 3 - 1] = -1.0
    _check(x.to(DEVICE), block=64)
    _check(x.to(DEVICE))


@needs_triton
@pytest.mark.parametrize("v", (7, 2049, 5000))
def test_nan_counts_above_everything(v):
    g = torch.Generator().manual_seed(2)
    x = torch.randn(4, v, generator=g)
    x[0, v - 1] = float("nan")
    x[1, [v // 2, 3]] = float("nan")  # the first NaN, not the first chunk's
    x[1, 0] = float("inf")
    x[2, :] = float("nan")
    x[3, [v - 2, v - 1]] = float("nan")
    x[3, 0] = float("-inf")
    _check(x.to(DEVICE), block=64)
    _check(x.to(DEVICE))


@needs_triton
def test_leading_dims_and_strided_rows():
    from mmserve.kernels.triton_argmax import cuda_argmax

    x = torch.randn(3, 4, 300, generator=torch.Generator().manual_seed(3)).to(DEVICE)
    assert torch.equal(cuda_argmax(x, 64).cpu(), x.argmax(-1).cpu())
    wide = torch.randn(5, 600, generator=torch.Generator().manual_seed(4)).to(DEVICE)
    view = wide[:, 100:400]  # rows strided by 600
    assert torch.equal(cuda_argmax(view, 64).cpu(), view.argmax(-1).cpu())
    assert cuda_argmax(torch.empty(0, 9, device=DEVICE)).shape == (0,)


@pytest.mark.skipif(not ON_CUDA, reason="the dispatch takes Triton on CUDA only")
def test_dispatch_on_cuda_is_the_triton_kernel(monkeypatch):
    from mmserve.kernels import argmax as module
    from mmserve.kernels import triton_argmax

    calls = []
    real = triton_argmax.cuda_argmax
    monkeypatch.setattr(triton_argmax, "cuda_argmax", lambda x: calls.append(1) or real(x))
    x = torch.randn(3, 49152, device="cuda")
    assert torch.equal(module.argmax(x), x.argmax(-1)) and calls == [1]


def test_dispatch_on_cpu_is_torch():
    from mmserve.kernels.argmax import argmax

    x = torch.randn(3, 100)
    x[1, 5] = float("nan")
    assert torch.equal(argmax(x), x.argmax(-1))
