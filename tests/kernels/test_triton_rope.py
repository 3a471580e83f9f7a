"""Triton rotary embedding: the same bits as RotaryTable.apply (so it can replace it)."""

from __future__ import annotations

import pytest
import torch
from triton_kit import ON_CUDA

from mmserve.kernels.rope import RotaryTable

pytestmark = pytest.mark.skipif(not ON_CUDA, reason="needs CUDA + triton (half precision)")


@pytest.mark.parametrize("heads,head_dim", [(9, 64), (8, 128), (3, 64)])
def test_bit_identical_to_reference(heads, head_dim):
    from mmserve.kernels.triton_rope import cuda_rope

    torch.manual_seed(heads * head_dim)
    table = RotaryTable(head_dim, 500000.0, 4096, device=torch.device("cuda"))
    qkv = (torch.randn(37, (heads + 2) * head_dim, device="cuda") * 4).to(torch.bfloat16)
    x = qkv[:, : heads * head_dim].reshape(37, heads, head_dim)  # a strided view, like q
    pos = torch.randint(0, 4096, (37,), device="cuda")
    got, want = cuda_rope(x, table.cos, table.sin, pos), table.rotate_reference(x, pos)
    # diagnostics: the same formula on CPU, to say which side moved if this ever fails
    cpu = RotaryTable(head_dim, 500000.0, 4096).rotate_reference(x.cpu(), pos.cpu())
    assert torch.equal(got, want), (
        f"{(got != want).sum()} differ; cuda ref == cpu ref: {torch.equal(want.cpu(), cpu)}"
        f"; triton == cpu ref: {torch.equal(got.cpu(), cpu)}"
    )
