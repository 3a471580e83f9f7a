"""Rope + cache write + paged attention in one launch against the two kernels it replaces.

The reference is ``triton_fused.rope_write_kv`` then ``cuda_paged_attention`` (each tested
against torch and the float64 textbook in their own files). On CUDA the output and the
cache bytes must be equal; under Triton's interpreter (float32) close.
"""

from __future__ import annotations

import pytest
import torch
from triton_kit import DEVICE, DTYPE, ON_CUDA, needs_triton

from mmserve.kernels.attention import AttentionMetadata
from mmserve.kernels.rope import RotaryTable

pytestmark = needs_triton

PAGE, BLOCKS = 16, 96


def _step(q_lens, ctx_lens, hq, hkv, d, seed):
    """Random caches and a step's qkv rows: sequence i has ``q_lens[i]`` new tokens ending
    its ``ctx_lens[i]``-token context, on shuffled disjoint blocks."""
    torch.manual_seed(seed)
    kc = torch.randn(BLOCKS, PAGE, hkv, d, device=DEVICE).to(DTYPE)
    vc = torch.randn(BLOCKS, PAGE, hkv, d, device=DEVICE).to(DTYPE)
    perm, tables, used = torch.randperm(BLOCKS).tolist(), [], 0
    for c in ctx_lens:
        tables.append(perm[used : used + -(-c // PAGE)])
        used += len(tables[-1])
    meta = AttentionMetadata.build(q_lens, ctx_lens, tables, PAGE, DEVICE)
    pairs = zip(q_lens, ctx_lens, strict=True)
    positions = torch.tensor([c - q + i for q, c in pairs for i in range(q)], device=DEVICE)
    qkv = torch.randn(sum(q_lens), (hq + 2 * hkv) * d, device=DEVICE).to(DTYPE)
    return kc, vc, meta, positions, qkv


def _two_kernels(qkv, hq, hkv, d, positions, table, kc, vc, meta, scale):
    from mmserve.kernels.triton_attention import cuda_paged_attention
    from mmserve.kernels.triton_fused import rope_write_kv

    n = qkv.shape[0]
    q, k, v = qkv.split([hq * d, hkv * d, hkv * d], dim=-1)
    q = rope_write_kv(
        q.reshape(n, hq, d),
        k.reshape(n, hkv, d),
        v.reshape(n, hkv, d),
        positions,
        table.cos,
        table.sin,
        kc,
        vc,
        meta.slot_mapping,
    )
    return cuda_paged_attention(q, kc, vc, meta, scale).reshape(n, hq * d)


CASES = {  # (query tokens, context lengths) a sequence
    "decodes": ([1, 1, 1], [1, 37, 130]),
    "verify blocks": ([5, 1, 9], [41, 200, 64]),
    "long contexts (spread splits)": ([1, 3], [600, 700]),
    "sixteen tokens": ([16], [300]),
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("hq,hkv,d", [(9, 3, 64), (8, 2, 128)])
def test_one_launch_equals_rope_write_then_attention(case, hq, hkv, d):
    from mmserve.kernels.triton_rope_attention import rope_attention

    q_lens, ctx_lens = CASES[case]
    kc, vc, meta, positions, qkv = _step(q_lens, ctx_lens, hq, hkv, d, seed=hq + d)
    meta.slot_mapping[0] = -1  # a padding token: its key and value written nowhere
    table = RotaryTable(d, 500000.0, 1024, device=DEVICE)
    kc_want, vc_want = kc.clone(), vc.clone()
    want = _two_kernels(qkv, hq, hkv, d, positions, table, kc_want, vc_want, meta, d**-0.5)
    for _ in range(2):  # again: the spread path's counters were left at zero
        got = rope_attention(qkv, hq, hkv, positions, table.cos, table.sin, kc, vc, meta, d**-0.5)
        if ON_CUDA:
            assert torch.equal(got, want), case
            assert torch.equal(kc, kc_want) and torch.equal(vc, vc_want), f"{case}: cache"
        else:
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
            torch.testing.assert_close(kc, kc_want, rtol=1e-5, atol=1e-5)
            assert torch.equal(vc, vc_want)
