"""CUDA-graph capture and replay of the decode step (one new token per sequence).

A decode step of a small model is a few hundred tiny kernels; launching them from
Python costs more than running them. Here the whole step (embedding -> layers ->
logits) is captured once per batch size in ``batch_sizes`` and replayed:

* inputs live in fixed-shape device buffers (ids, positions, slot mapping, context
  lengths, block tables), filled from one pinned host buffer with one copy a step (of
  the part the replayed graph reads);
* a batch of ``n`` sequences replays the smallest captured size ``>= n``; the padding
  rows write no KV (slot ``-1``, skipped by the Triton writer) and read one real
  key, so they stay finite and their rows are dropped;
* a batch larger than every captured size runs the same forward eagerly
  (:meth:`DecodeGraphs.run` decides), with the same kernels, so a row's result is the
  same either way: the kernels are batch-invariant (attention has one reduction order
  per row, the GEMM one reduction tree per element), so padding never changes a row.

Attention sees :class:`~mmserve.kernels.triton_attention.PagedMetadata` (tensors
only), never the CPU path's per-sequence objects; the CPU path is untouched.
"""

from __future__ import annotations

import bisect
import time
from dataclasses import dataclass

import numpy as np
import torch

from mmserve.kernels import decode_stack
from mmserve.kernels.attention import KVLike, kv_layer
from mmserve.kernels.triton_attention import SPLIT, PagedMetadata
from mmserve.models.base import CausalLM

DEFAULT_SIZES = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 256)
# One prompt chunk alone in a step (a request arriving at an idle server) replays a
# batch-1 graph of the smallest of these lengths that holds it, its rows past the chunk
# padding: eagerly, a SmolLM2-135M prefill is ~190 launches from Python, ~10 ms on the
# H200 for a ~300-token prompt, most of a short answer's time (bench/NOTES.md, session 4).
PREFILL_SIZES = (16, 32, 64, 128, 256, 512, 1024, 2048)
# Shapes the one-launch decode stack runs get a second graph of its variant that keeps a
# tile's key splits in one program (fewer registers: no spread path), replayed while no
# sequence of the step has more than this many keys: one split, where there is nothing
# to spread. H200, SmolLM2-135M, batch 1 (bench/NOTES.md, session 11): 784 us against 822
# at 128 cached tokens; with three splits the spread kernel is ahead (834 against 863 at
# 320, session 10); two splits were not measured.
SERIAL_MAX_KEYS = SPLIT


@dataclass
class CaptureReport:
    batch_sizes: list[int]
    seconds: float  # wall time of warm-up + capture of every size
    pool_bytes: int  # device memory taken by capturing (free-memory delta: pool + graphs)


class DecodeGraphs:
    """Captured decode and verify steps of ``model`` over ``kv_cache``.

    One graph per (batch size, query tokens per sequence ``q``): ``q = 1`` is a decode
    step; ``q = k + 1`` a verify step whose sequences bring up to ``q`` tokens each (the
    last sampled token and up to ``k`` drafts). Sequence ``i`` owns rows
    ``i*q .. i*q+q-1`` of the flat batch; rows past its own tokens are padding.
    """

    def __init__(self, model: CausalLM, kv_cache: KVLike, max_blocks_per_seq: int,
                 batch_sizes: tuple[int, ...] = DEFAULT_SIZES,
                 query_sizes: tuple[int, ...] = (1,), last_row_only: bool = False) -> None:
        self.model, self.kv = model, kv_cache
        # prefill graphs: logits of each sequence's last real row only (a 512-token chunk's
        # every row would be 512 x vocab floats, and only the last one samples)
        self.last_row_only = last_row_only
        self.device = kv_layer(kv_cache, 0).k.device
        self.sizes = sorted(batch_sizes)
        self.qsizes = sorted(set(query_sizes) | {1})
        b, mb, r = self.sizes[-1], max_blocks_per_seq, self.sizes[-1] * self.qsizes[-1]
        self.max_batch, self.max_blocks, self.max_q = b, mb, self.qsizes[-1]
        # one flat int64 buffer: ids | positions | slots (rows) | context lens | query lens
        # (sequences) | tables (B, MB)
        cuda = self.device.type == "cuda"  # CPU: eager only (tests under Triton's interpreter)
        self._host = torch.zeros(3 * r + 2 * b + b * mb, dtype=torch.long, pin_memory=cuda)
        self._host_np = self._host.numpy()
        self._buf = torch.zeros_like(self._host, device=self.device)
        self._copied = torch.cuda.Event() if cuda else None
        self.ids, self.positions, self.slots = (self._buf[i * r : (i + 1) * r] for i in range(3))
        self.context_lens = self._buf[3 * r : 3 * r + b]
        self.query_lens = self._buf[3 * r + b : 3 * r + 2 * b]
        self.tables = self._buf[3 * r + 2 * b :].view(b, mb)
        self._rows = r
        self.query_start = {q: torch.arange(b, dtype=torch.long, device=self.device) * q
                            for q in self.qsizes}
        self.graphs: dict[tuple[int, int], torch.cuda.CUDAGraph] = {}
        self.logits: dict[tuple[int, int], torch.Tensor] = {}
        # the decode stack's serial-split variant of the shapes it runs (SERIAL_MAX_KEYS)
        self.serial_max_keys = SERIAL_MAX_KEYS
        self.serial: dict[tuple[int, int], tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self.serial_replays = 0

    def _meta(self, bs: int, q: int) -> PagedMetadata:
        return PagedMetadata(self.slots[: bs * q], self.tables[:bs], self.context_lens[:bs],
                             self.query_start[q][:bs], self.query_lens[:bs], q)

    def _forward(self, bs: int, q: int) -> torch.Tensor:
        n = bs * q
        hidden = self.model(self.ids[:n], self.positions[:n], self._meta(bs, q), self.kv)
        if self.last_row_only:  # row i*q + len_i - 1, read from the buffers at replay
            hidden = hidden[self.query_start[q][:bs] + self.query_lens[:bs] - 1]
        return self.model.compute_logits(hidden)

    @torch.inference_mode()
    def capture(self) -> CaptureReport:
        """Capture every (size, q), largest first, all in one private memory pool."""
        torch.cuda.synchronize()
        free_before = torch.cuda.mem_get_info(self.device)[0]
        start = time.perf_counter()
        self._fill_padding(0, self.max_batch, 1)  # inputs: all padding, so no KV is written
        self._buf.copy_(self._host)
        pool = torch.cuda.graph_pool_handle()
        for q in reversed(self.qsizes):
            for bs in reversed(self.sizes):
                stacked = decode_stack.runs()
                self.graphs[(bs, q)], self.logits[(bs, q)] = self._capture(bs, q, pool)
                if decode_stack.runs() > stacked and self.serial_max_keys > 0:
                    with decode_stack.serial_splits():
                        self.serial[(bs, q)] = self._capture(bs, q, pool)
        # one replay each (all padding: nothing is written): a graph's first launch uploads
        # it to the device, ~1 ms on the H200 (a first verify step took 2.5 ms, later ones
        # 1.6); left to the first real step, that cost lands on a request and in the
        # speculation controller's cost curves
        for graph in [*self.graphs.values(), *(g for g, _ in self.serial.values())]:
            graph.replay()
        torch.cuda.synchronize()
        return CaptureReport(self.sizes, time.perf_counter() - start,
                             free_before - torch.cuda.mem_get_info(self.device)[0])

    def _capture(self, bs: int, q: int, pool) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):  # warm-up: Triton compiles outside the capture
            self._forward(bs, q)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=pool):
            logits = self._forward(bs, q)
        return graph, logits

    def fits(self, n: int, q: int = 1) -> bool:
        return 0 < n <= self.max_batch and q <= self.max_q and bool(self.graphs)

    @torch.inference_mode()
    def run(self, ids: list[int], positions: list[int], block_tables: np.ndarray,
            block_size: int) -> torch.Tensor:
        """One decode step -> (n, V) float32 logits (a view, valid until the next run).

        ``block_tables``: (n, >= blocks in use) int array; the new token of row ``i``
        sits at ``positions[i]`` and its context is ``positions[i] + 1`` tokens.
        """
        if not self.fits(len(ids)):
            return self.run_eager(ids, positions, block_tables, block_size)
        logits, _ = self.run_verify([[t] for t in ids], positions, block_tables, block_size)
        return logits

    @torch.inference_mode()
    def run_verify(self, tokens: list[list[int]], starts: list[int], block_tables: np.ndarray,
                   block_size: int) -> tuple[torch.Tensor, int]:
        """Sequence ``i`` runs ``tokens[i]`` from position ``starts[i]`` -> (logits of
        ``n * q`` rows, a view valid until the next run; ``q``): its rows are ``i*q + j``.
        With ``last_row_only``: ``n`` rows, row ``i`` for sequence ``i``'s last token."""
        n, longest = len(tokens), max(len(t) for t in tokens)
        assert self.fits(n, longest), (n, longest)
        bs = self.sizes[bisect.bisect_left(self.sizes, n)]
        q = self.qsizes[bisect.bisect_left(self.qsizes, longest)]
        assert self._copied is not None
        self._copied.synchronize()  # the last step's copy has left the pinned buffer
        self._fill(tokens, starts, block_tables, block_size, q)
        # the flat buffer up to the end of table row bs - 1: all this graph reads (the
        # whole buffer is ~1 MiB at 256 x 512 blocks, ~40 us of a ~1 ms batch-1 step)
        used = 3 * self._rows + 2 * self.max_batch + bs * self.max_blocks
        self._buf[:used].copy_(self._host[:used], non_blocking=True)
        self._copied.record()
        graph, logits = self.graphs[(bs, q)], self.logits[(bs, q)]
        serial = self.serial.get((bs, q))
        if serial is not None and max(s + len(t) for s, t in zip(starts, tokens, strict=True)
                                      ) <= self.serial_max_keys:
            graph, logits = serial
            self.serial_replays += 1
        graph.replay()
        return logits[: n if self.last_row_only else n * q], q

    def _fill(self, tokens, starts, tables, block_size: int, q: int) -> None:
        b, r, n, h = self.max_batch, self._rows, len(tokens), self._host_np
        used = min(tables.shape[1], self.max_blocks)
        t = h[3 * r + 2 * b :].reshape(b, self.max_blocks)
        t[:n, :used] = tables[:, :used]
        self._fill_padding(0, b, q)
        for i, (toks, start) in enumerate(zip(tokens, starts, strict=True)):
            pos = np.arange(start, start + len(toks), dtype=np.int64)
            rows = slice(i * q, i * q + len(toks))
            h[rows] = toks
            h[r + rows.start : r + rows.stop] = pos
            h[2 * r + rows.start : 2 * r + rows.stop] = (
                t[i, pos // block_size] * block_size + pos % block_size)
            h[3 * r + i] = start + len(toks)
            h[3 * r + b + i] = len(toks)

    def _fill_padding(self, lo: int, hi: int, q: int) -> None:
        """Sequences lo..hi-1 (and every row of the buffer from lo*q on) become padding."""
        b, r, h = self.max_batch, self._rows, self._host_np
        h[lo * q : r] = 0
        h[r + lo * q : 2 * r] = 0
        h[2 * r + lo * q : 3 * r] = -1  # write nothing
        h[3 * r + lo : 3 * r + hi] = 1  # read key 0 of block table row 0..: finite, discarded
        h[3 * r + b + lo : 3 * r + b + hi] = 1

    @torch.inference_mode()
    def run_eager(self, ids: list[int], positions: list[int], tables: np.ndarray,
                  block_size: int) -> torch.Tensor:
        """The same step without a graph (any batch size); same kernels, same row bits."""
        dev = self.device
        pos = np.asarray(positions, dtype=np.int64)
        t = torch.as_tensor(np.ascontiguousarray(tables), dtype=torch.long).to(dev)
        slots = np.asarray(tables)[np.arange(len(ids)), pos // block_size] * block_size
        n = len(ids)
        meta = PagedMetadata(torch.as_tensor(slots + pos % block_size).to(dev), t,
                             torch.as_tensor(pos + 1).to(dev),
                             torch.arange(n, device=dev), torch.ones(n, dtype=torch.long,
                                                                     device=dev), 1)
        hidden = self.model(torch.as_tensor(ids, device=dev), torch.as_tensor(pos).to(dev), meta,
                            self.kv)
        return self.model.compute_logits(hidden)
