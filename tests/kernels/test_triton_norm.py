"""Triton RMSNorm against the plain-torch reference, on strided and offset inputs."""

from __future__ import annotations

import pytest
import torch
from triton_kit import DEVICE, DTYPE, ON_CUDA, TOL, needs_triton

from mmserve.kernels.norm import rms_norm

pytestmark = needs_triton


@pytest.mark.parametrize("shape", [(7, 576), (3, 9, 64), (2, 4096)])
@pytest.mark.parametrize("offset", [0.0, 1.0])
def test_matches_reference(shape, offset):
    from mmserve.kernels.triton_norm import cuda_rms_norm

    torch.manual_seed(sum(shape))
    x = (torch.randn(*shape, device=DEVICE) * 3).to(DTYPE)
    w = torch.randn(shape[-1], device=DEVICE).to(DTYPE)
    got = cuda_rms_norm(x, w, 1e-6, offset)
    want = rms_norm(x.cpu().double(), w.cpu().double(), 1e-6, offset)
    torch.testing.assert_close(got.cpu().double(), want, atol=TOL, rtol=TOL)


def test_strided_rows():
    from mmserve.kernels.triton_norm import cuda_rms_norm

    torch.manual_seed(1)
    x = torch.randn(5, 3 * 128, device=DEVICE).to(DTYPE)[:, 128:256]  # a split view
    w = torch.randn(128, device=DEVICE).to(DTYPE)
    torch.testing.assert_close(
        cuda_rms_norm(x, w, 1e-5).cpu().double(),
        rms_norm(x.cpu().double(), w.cpu().double(), 1e-5),
        atol=TOL,
        rtol=TOL,
    )


@pytest.mark.skipif(not ON_CUDA, reason="dispatch is by device: CUDA only")
def test_norm_module_dispatches_on_cuda():
    from mmserve.kernels.triton_norm import cuda_rms_norm

    x, w = torch.randn(4, 256, device=DEVICE).to(DTYPE), torch.randn(256, device=DEVICE).to(DTYPE)
    assert torch.equal(rms_norm(x, w, 1e-6), cuda_rms_norm(x, w, 1e-6))
