"""Paged attention reference: correct against textbook attention, and batch-invariant."""

import torch

from mmserve.kernels.attention import (
    AttentionMetadata,
    LayerKV,
    paged_attention,
    reference_attention,
    write_kv,
)

BS, HKV, G, D = 16, 3, 3, 64


def _cache(num_blocks=64):
    return torch.zeros(num_blocks, BS, HKV, D), torch.zeros(num_blocks, BS, HKV, D)


def _fill(kc, vc, table, k, v):
    meta = AttentionMetadata.build([k.shape[0]], [k.shape[0]], [table], BS, torch.device("cpu"))
    write_kv(LayerKV(kc, vc), k, v, meta.slot_mapping)


def test_matches_textbook_attention_with_window():
    torch.manual_seed(0)
    kc, vc = _cache()
    length = 150
    k, v = torch.randn(length, HKV, D), torch.randn(length, HKV, D)
    table = [7, 3, 12, 40, 9, 2, 33, 21, 5, 17]
    _fill(kc, vc, table, k, v)
    q = torch.randn(20, HKV * G, D)
    pos = torch.arange(length - 20, length)
    for window in (None, 32):
        meta = AttentionMetadata.build([20], [length], [table], BS, torch.device("cpu"))
        got = paged_attention(q, LayerKV(kc, vc), meta, 0.125, window)
        want = reference_attention(q, k, v, pos, 0.125, window)
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_row_result_independent_of_step_shape():
    """The last token's output is bit-identical as a decode, inside a prefill chunk,
    as one of k+1 verify rows, and next to other sequences."""
    torch.manual_seed(1)
    kc, vc = _cache()
    length = 97
    k, v = torch.randn(length, HKV, D), torch.randn(length, HKV, D)
    table = list(range(10, 17))
    _fill(kc, vc, table, k, v)
    other = list(range(30, 40))
    _fill(kc, vc, other, torch.randn(150, HKV, D), torch.randn(150, HKV, D))
    q = torch.randn(length, HKV * G, D)
    cpu = torch.device("cpu")

    def last_row(nq, with_other):
        qs, lens, ctx, tables = [q[length - nq :]], [nq], [length], [table]
        if with_other:
            qs.insert(0, torch.randn(5, HKV * G, D))
            lens.insert(0, 5)
            ctx.insert(0, 150)
            tables.insert(0, other)
        meta = AttentionMetadata.build(lens, ctx, tables, BS, cpu)
        return paged_attention(torch.cat(qs), LayerKV(kc, vc), meta, 0.125)[-1]

    base = last_row(1, False)
    for nq in (1, 2, 5, 9, 64, length):
        for with_other in (False, True):
            assert torch.equal(last_row(nq, with_other), base), (nq, with_other)
