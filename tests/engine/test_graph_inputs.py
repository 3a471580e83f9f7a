"""The CUDA graphs' input buffer, filled for a step (CPU: the buffer is host memory).

``DecodeGraphs._fill`` lays every sequence out at once with numpy; the reference here is
the layout written out one sequence at a time (the loop it replaced): the same bytes in
the whole buffer, padding included, step after step, for decode and verify steps of
ragged lengths."""

from __future__ import annotations

import numpy as np

from mmserve.bench.engine_run import make_kv
from mmserve.engine.cuda_graphs import DecodeGraphs, block_tables

PAGE = 16


def _reference(h: np.ndarray, g: DecodeGraphs, tokens, starts, tables, q: int) -> int:
    b, r, n = g.max_batch, g._rows, len(tokens)
    used = min(tables.shape[1], g.max_blocks)
    t = h[3 * r + 2 * b :].reshape(b, g.max_blocks)
    t[:n, :used] = tables[:, :used]
    h[:r] = 0
    h[r : 2 * r] = 0
    h[2 * r : 3 * r] = -1
    h[3 * r : 3 * r + b] = 1
    h[3 * r + b : 3 * r + 2 * b] = 1
    for i, (toks, start) in enumerate(zip(tokens, starts, strict=True)):
        pos = np.arange(start, start + len(toks), dtype=np.int64)
        rows = slice(i * q, i * q + len(toks))
        h[rows] = toks
        h[r + rows.start : r + rows.stop] = pos
        h[2 * r + rows.start : 2 * r + rows.stop] = t[i, pos // PAGE] * PAGE + pos % PAGE
        h[3 * r + i] = start + len(toks)
        h[3 * r + b + i] = len(toks)
    return max(s + len(t) for s, t in zip(starts, tokens, strict=True))


def test_fill_lays_out_every_sequence_as_the_per_sequence_loop(tiny_llama):
    model = tiny_llama("cpu")
    g = DecodeGraphs(
        model, make_kv(model, 64, model.embed_tokens.weight.dtype), 12, (1, 2, 4, 8), (1, 3, 5)
    )
    ref = np.zeros_like(g._host_np)
    rng = np.random.default_rng(0)
    # big steps then small ones: what a step leaves behind must not leak into the next
    steps = [
        (8, 5),
        (1, 1),
        (8, 1),
        (3, 3),
        (4, 5),
        (2, 1),
        (8, 3),
        (1, 5),
        (1, 3),
        (1, 5),
        (1, 1),
        (1, 3),
    ]
    for i, (n, q) in enumerate(steps):
        lens = [q] * n if q == 1 else rng.integers(1, q + 1, n).tolist()
        tokens = [rng.integers(0, 1000, k).tolist() for k in lens]
        starts = rng.integers(0, 120, n).tolist()
        tables = rng.integers(1, 64, (n, int(rng.integers(9, 12)))).astype(np.int64)
        # as the runner passes them (lists; one sequence takes a scalar path), and as an
        # array (the benches, the graphs' tests)
        given = [row.tolist() for row in tables] if i % 2 else tables
        keys = g._fill(tokens, starts, given, PAGE, q)
        assert keys == _reference(ref, g, tokens, starts, tables, q)
        assert np.array_equal(g._host_np, ref), (n, q)


def test_block_tables_pad_ragged_lists_with_zeros():
    got = block_tables([[5, 3, 9], [7], [2, 4]])
    assert got.dtype == np.int64
    assert got.tolist() == [[5, 3, 9], [7, 0, 0], [2, 4, 0]]
    assert block_tables([[1]]).tolist() == [[1]]
