"""Prefill chunks replayed from CUDA graphs against the eager forward (CUDA only).

A chunk runs in the smallest captured length that holds it, its other rows padding; the
kernels are batch-invariant, so the last row's logits and every KV byte written must be
the eager forward's exactly."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from mmserve.bench.engine_run import make_kv
from mmserve.engine.cuda_graphs import DecodeGraphs
from mmserve.kernels.triton_attention import PagedMetadata

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need CUDA")
PAGE = 16


def _eager_chunk(model, kv, ids, start, table):
    """The eager forward of one chunk (positions start..) -> its last row's logits."""
    n, dev = len(ids), "cuda"
    pos = np.arange(start, start + n)
    slots = table[pos // PAGE] * PAGE + pos % PAGE
    meta = PagedMetadata(
        torch.as_tensor(slots, device=dev),
        torch.as_tensor(table[None], device=dev),
        torch.tensor([start + n], device=dev),
        torch.tensor([0], device=dev),
        torch.tensor([n], device=dev),
        n,
    )
    hidden = model(torch.tensor(ids, device=dev), torch.as_tensor(pos, device=dev), meta, kv)
    return model.compute_logits(hidden[-1:])


@torch.inference_mode()
def test_prefill_graph_chunks_equal_the_eager_forward(tiny_llama):
    model = tiny_llama()
    blocks = 64
    graph_kv, eager_kv = (
        make_kv(model, blocks, torch.bfloat16),
        make_kv(model, blocks, torch.bfloat16),
    )
    graphs = DecodeGraphs(model, graph_kv, blocks, (1,), (16, 64, 256), last_row_only=True)
    graphs.capture()
    rng = np.random.default_rng(0)
    table = rng.permutation(np.arange(1, blocks))[:40]  # a shuffled block table
    prompt = rng.integers(0, 1000, 600).tolist()
    # chunks of a 600-token prompt: exact bucket sizes, one-off sizes, a chunk that
    # continues at position 37, one that needs the largest graph
    start = 0
    for n in (5, 16, 16, 40, 200, 256, 67):
        ids = prompt[start : start + n]
        got, top, q = graphs.run_verify([ids], [start], table[None].astype(np.int64), PAGE)
        assert torch.equal(top, got.argmax(-1))  # the graph's argmax is the host's
        assert q == min(b for b in (16, 64, 256) if b >= n) and got.shape[0] == 1
        want = _eager_chunk(model, eager_kv, ids, start, table)
        assert torch.equal(got, want), (start, n)
        start += n
    assert torch.equal(graph_kv, eager_kv)  # the same bytes in every slot, padding wrote none


@torch.inference_mode()
def test_serial_split_graphs_replay_short_contexts_with_the_same_bits(tiny_llama):
    """Shapes the decode stack runs get a second graph of its serial-split variant, taken
    while no sequence has more than ``serial_max_keys`` keys: decode and verify steps
    across that bound give the logits of graphs without it (and KV bytes), bit for bit."""
    model = tiny_llama()
    blocks = 64
    kvs = [make_kv(model, blocks, torch.bfloat16) for _ in range(2)]
    both = [DecodeGraphs(model, kv, 31, (1, 2), (1, 3)) for kv in kvs]
    both[1].serial_max_keys = 0  # the spread kernel for every step
    for g in both:
        g.capture()
    assert set(both[0].serial) == {(1, 1), (2, 1), (1, 3), (2, 3)} and not both[1].serial
    rng = np.random.default_rng(1)
    # disjoint block tables (two sequences share no block, as in the engine)
    tables = rng.permutation(np.arange(1, blocks))[:62].reshape(2, 31)
    prompt = rng.integers(0, 1000, (2, 300)).tolist()
    # 3-token verify steps of two sequences over 60 positions, decode steps of both, then
    # of the first alone (batch 1) across 128 keys, then verify steps of both again (the
    # second 40 positions behind) up to 290 keys: one, two and three 128-key splits
    steps = [([p[i : i + 3] for p in prompt], [i, i]) for i in range(0, 60, 3)]
    steps += [([[p[i]] for p in prompt], [i, i]) for i in range(60, 100)]
    steps += [([[prompt[0][i]]], [i]) for i in range(100, 140)]
    steps += [
        ([prompt[0][i : i + 3], prompt[1][i - 40 : i - 37]], [i, i - 40])
        for i in range(140, 288, 3)
    ]
    for tokens, starts in steps:
        t = tables[: len(tokens)]
        (got, top, _), (want, _, _) = (g.run_verify(tokens, starts, t, PAGE) for g in both)
        assert torch.equal(got, want), starts
        assert torch.equal(top, got.argmax(-1))
    assert 0 < both[0].serial_replays < len(steps)  # short steps serial, the rest spread
    assert torch.equal(kvs[0], kvs[1])


@torch.inference_mode()
def test_steps_fed_from_the_last_argmax_on_the_device_equal_steps_fed_from_the_host(tiny_llama):
    """Async scheduling's decode: each step's input ids are the last step's argmax still
    on the device (read in place from the graph's buffer by the step's copy kernel, which
    also sends them to pinned memory; the last step's by a copy of its own), against
    steps whose ids come from the host: the same tokens, logits and KV bytes, at batch 1
    and 3 (a padded graph)."""
    from mmserve.kernels import triton_copy

    model = tiny_llama()
    blocks = 64
    for n in (1, 3):
        kvs = [make_kv(model, blocks, torch.bfloat16) for _ in range(2)]
        graphs = [DecodeGraphs(model, kv, 20, (1, 4)) for kv in kvs]
        for g in graphs:
            g.capture()
        tables = np.arange(1, 1 + 20 * n).reshape(n, 20).astype(np.int64)
        first = [7 + 31 * i for i in range(n)]
        launches = triton_copy.launches()
        # from the host: the synchronous engine's steps
        toks, want_logits = [first], []
        for i in range(40):
            logits, top, _ = graphs[0].run_verify([[t] for t in toks[-1]], [i] * n, tables, PAGE)
            want_logits.append(logits.clone())
            toks.append(top[:n].tolist())
        # ahead: the argmax view is the next step's input, and the launch that copies it
        # in copies it out
        host = torch.full((n,), -1, dtype=torch.long).pin_memory()
        logits, top, _ = graphs[1].run_verify([[t] for t in first], [0] * n, tables, PAGE)
        got = [first]
        for i in range(1, 41):
            assert torch.equal(logits, want_logits[i - 1]), (n, i)
            picked = top[:n]
            sent = torch.cuda.Event()
            if i < 40:
                logits, top, _ = graphs[1].run_verify(
                    [[0]] * n, [i] * n, tables, PAGE, input_ids=picked, tokens_to=(host, sent)
                )
            else:
                triton_copy.copy_flat(host, picked)
                sent.record()
            sent.synchronize()
            got.append(host.tolist())
            host.fill_(-1)
        assert got == toks
        assert torch.equal(kvs[0], kvs[1])
        # inputs by kernel: the host's 40 steps and the first ahead step, 39 steps that
        # also sent the last step's tokens, and the last step's own copy
        assert triton_copy.launches() >= launches + 40 + 1 + 39 + 1


@torch.inference_mode()
def test_graphs_reading_the_q8_head_equal_graphs_reading_the_bf16_head(tiny_llama):
    """The LM head as Q8_0 blocks (a GGUF's storage) inside the captured decode graphs, at
    batch 1 and 3 (padded): the logits, tokens and KV bytes of graphs captured with the
    head read from its bf16 weight."""
    from mmserve.kernels import settings
    from mmserve.kernels.q8 import factor_q8, quantize_q8

    model = tiny_llama()
    head = model.lm_head_weight()
    w32 = quantize_q8(head.float()).dequantize(torch.float32)
    head.data.copy_(w32.to(head.dtype))
    blocks = factor_q8(w32)
    assert blocks is not None and model.attach_q8_head(blocks)
    for n in (1, 3):
        runs = []
        for q8 in (True, False):
            with settings.override(q8_head=q8):
                kv = make_kv(model, 64, torch.bfloat16)
                graphs = DecodeGraphs(model, kv, 20, (1, 4))
                graphs.capture()
                tables = np.arange(1, 1 + 20 * n).reshape(n, 20).astype(np.int64)
                toks, logits_seen = [[7 + 31 * i for i in range(n)]], []
                for i in range(24):
                    logits, top, _ = graphs.run_verify(
                        [[t] for t in toks[-1]], [i] * n, tables, PAGE
                    )
                    logits_seen.append(logits.clone())
                    toks.append(top[:n].tolist())
                runs.append((toks, logits_seen, kv.clone()))
        (toks_a, logits_a, kv_a), (toks_b, logits_b, kv_b) = runs
        assert toks_a == toks_b, n
        assert all(torch.equal(a, b) for a, b in zip(logits_a, logits_b, strict=True)), n
        assert torch.equal(kv_a, kv_b), n
