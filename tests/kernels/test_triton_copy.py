"""The step's copy kernel (``triton_copy``): ``dst[:] = src`` with a head from another
tensor (also written to a third: the tokens' way to the host), at sizes around a
program's block; on CUDA between pinned host memory and the device, both ways, against
``Tensor.copy_`` (the DMA path it replaces)."""

from __future__ import annotations

import pytest
import torch
from triton_kit import DEVICE, ON_CUDA, needs_triton

SIZES = (1, 5, 1023, 1024, 1025, 3000)


def _expected(src: torch.Tensor, head: torch.Tensor | None) -> torch.Tensor:
    out = src.clone()
    if head is not None:
        out[: head.numel()] = head
    return out


@needs_triton
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("heads", (None, 0, 1, "all"))
@pytest.mark.parametrize("out", (False, True))
def test_kernel_copies_and_takes_the_head(n, heads, out):
    from mmserve.kernels.triton_copy import BLOCK, _copy_kernel

    if out and heads is None:
        pytest.skip("the head's second copy needs a head")
    g = torch.Generator().manual_seed(n)
    src = torch.randint(-(2**40), 2**40, (n,), generator=g).to(DEVICE)
    k = n if heads == "all" else heads
    head = None if k is None else torch.randint(0, 50_000, (k,), generator=g).to(DEVICE)
    dst = torch.full((n,), -7, dtype=torch.long, device=DEVICE)
    h = head if head is not None else src
    sent = torch.full((h.numel() + 3,), -5, dtype=torch.long, device=DEVICE)
    _copy_kernel[(-(-n // BLOCK),)](
        dst, src, h, sent, n, 0 if head is None else head.numel(), BLOCK=BLOCK, OUT=out
    )
    assert torch.equal(dst.cpu(), _expected(src, head).cpu())
    # the second copy: the head's elements, nothing past them
    k = head.numel() if out else 0
    want = torch.cat([h[:k].cpu(), torch.full((h.numel() + 3 - k,), -5, dtype=torch.long)])
    assert torch.equal(sent.cpu(), want)


@pytest.mark.skipif(not ON_CUDA, reason="needs CUDA: pinned host memory")
@pytest.mark.parametrize("n", SIZES)
def test_pinned_host_to_device_and_back_by_the_kernel(n):
    from mmserve.kernels import settings, triton_copy

    g = torch.Generator().manual_seed(n + 1)
    host = torch.randint(-(2**40), 2**40, (n,), generator=g).pin_memory()
    head = torch.randint(0, 50_000, (min(n, 3),), generator=g).cuda()
    dev = torch.full((n,), -7, dtype=torch.long, device="cuda")
    sent = torch.full(head.shape, -3, dtype=torch.long).pin_memory()
    before = triton_copy.launches()
    triton_copy.copy_flat(dev, host, head, sent)
    back = torch.full((n,), -9, dtype=torch.long).pin_memory()
    triton_copy.copy_flat(back, dev)
    torch.cuda.synchronize()
    assert triton_copy.launches() == before + 2  # the kernel ran, not the DMA fallback
    want = _expected(host, head.cpu())
    assert torch.equal(dev.cpu(), want) and torch.equal(back, want)
    assert torch.equal(sent, head.cpu())  # the head also to the host, in the same launch
    # the DMA fallback computes the same
    with settings.override(copy_kernel=False):
        dev2 = torch.full((n,), -7, dtype=torch.long, device="cuda")
        sent2 = torch.full(head.shape, -3, dtype=torch.long).pin_memory()
        triton_copy.copy_flat(dev2, host, head, sent2)
        torch.cuda.synchronize()
        assert triton_copy.launches() == before + 2 and torch.equal(dev2.cpu(), want)
        assert torch.equal(sent2, head.cpu())


def test_without_a_kernel_it_is_a_plain_copy():
    from mmserve.kernels.triton_copy import copy_flat

    src, head = torch.arange(10), torch.tensor([70, 71])
    dst, sent = torch.zeros(10, dtype=torch.long), torch.zeros(2, dtype=torch.long)
    copy_flat(dst, src, head, sent)
    assert dst.tolist() == [70, 71, *range(2, 10)] and sent.tolist() == [70, 71]
