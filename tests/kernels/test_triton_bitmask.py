"""The one-launch Triton bitmask against the torch reference: every bit pattern of a
word, vocabularies that end inside a word and inside a program's block, strided rows,
bitmasks wider than the vocabulary, and the sampler's in-place use on a row slice."""

from __future__ import annotations

import pytest
import torch
from triton_kit import DEVICE, needs_triton

from mmserve.structured.bitmask import apply_bitmask, bitmask_words


def _reference(logits: torch.Tensor, bitmask: torch.Tensor) -> torch.Tensor:
    from mmserve.kernels import settings

    with settings.override(triton=False):
        return apply_bitmask(logits.clone(), bitmask)


def _random_mask(rows: int, words: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(-(2**31), 2**31 - 1, (rows, words), generator=g, dtype=torch.int32)


@needs_triton
@pytest.mark.parametrize("vocab", (1, 31, 32, 33, 4096, 4097, 49152, 49155))
def test_matches_torch(vocab):
    from mmserve.kernels.triton_bitmask import cuda_apply_bitmask

    g = torch.Generator().manual_seed(vocab)
    logits = torch.randn(5, vocab, generator=g).to(DEVICE)
    mask = _random_mask(5, bitmask_words(vocab) + 2, vocab)  # wider than the vocabulary
    mask[0] = -1  # every token allowed
    mask[1] = 0  # none allowed
    want = _reference(logits.cpu(), mask)
    got = cuda_apply_bitmask(logits, mask.to(DEVICE))
    assert torch.equal(got.cpu(), want)


@needs_triton
def test_strided_rows_in_place():
    """A slice of a wider buffer (the sampler's contiguous constrained rows): masked in
    place, the rows outside the slice and the columns past the vocabulary untouched."""
    from mmserve.kernels.triton_bitmask import cuda_apply_bitmask

    vocab = 5000
    g = torch.Generator().manual_seed(3)
    base = torch.randn(6, vocab + 8, generator=g).to(DEVICE)
    before = base.clone()
    view = base[1:4, :vocab]
    mask = _random_mask(3, bitmask_words(vocab), 4)
    cuda_apply_bitmask(view, mask.to(DEVICE))
    assert torch.equal(base[[0, 4, 5]].cpu(), before[[0, 4, 5]].cpu())
    assert torch.equal(base[:, vocab:].cpu(), before[:, vocab:].cpu())
    assert torch.equal(base[1:4, :vocab].cpu(), _reference(before[1:4, :vocab].cpu(), mask))
