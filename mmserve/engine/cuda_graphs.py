"""CUDA-graph capture and replay of the decode step (one new token per sequence).

A decode step of a small model is a few hundred tiny kernels; launching them from
Python costs more than running them. Here the whole step (embedding -> layers ->
logits) is captured once per batch size in ``batch_sizes`` and replayed:

* inputs live in fixed-shape device buffers (ids, positions, slot mapping, context
  lengths, block tables), filled from one pinned host buffer with one copy a step;
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

from mmserve.kernels.triton_attention import PagedMetadata
from mmserve.models.base import CausalLM

DEFAULT_SIZES = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 256)


@dataclass
class CaptureReport:
    batch_sizes: list[int]
    seconds: float  # wall time of warm-up + capture of every size
    pool_bytes: int  # device memory taken by capturing (free-memory delta: pool + graphs)


class DecodeGraphs:
    """Captured decode steps of ``model`` over ``kv_cache`` for a set of batch sizes."""

    def __init__(self, model: CausalLM, kv_cache: torch.Tensor, max_blocks_per_seq: int,
                 batch_sizes: tuple[int, ...] = DEFAULT_SIZES) -> None:
        self.model, self.kv = model, kv_cache
        self.device = kv_cache.device
        self.sizes = sorted(batch_sizes)
        b, mb = self.sizes[-1], max_blocks_per_seq
        self.max_batch, self.max_blocks = b, mb
        # one flat int64 buffer: ids | positions | slots | context lens | tables (B, MB)
        cuda = self.device.type == "cuda"  # CPU: eager only (tests under Triton's interpreter)
        self._host = torch.zeros(4 * b + b * mb, dtype=torch.long, pin_memory=cuda)
        self._host_np = self._host.numpy()
        self._buf = torch.zeros_like(self._host, device=self.device)
        self._copied = torch.cuda.Event() if cuda else None
        self.ids, self.positions = self._buf[:b], self._buf[b : 2 * b]
        self.slots, self.context_lens = self._buf[2 * b : 3 * b], self._buf[3 * b : 4 * b]
        self.tables = self._buf[4 * b :].view(b, mb)
        self.query_start = torch.arange(b, dtype=torch.long, device=self.device)
        self.query_lens = torch.ones(b, dtype=torch.long, device=self.device)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.logits: dict[int, torch.Tensor] = {}

    def _meta(self, bs: int) -> PagedMetadata:
        return PagedMetadata(self.slots[:bs], self.tables[:bs], self.context_lens[:bs],
                             self.query_start[:bs], self.query_lens[:bs], 1)

    def _forward(self, bs: int) -> torch.Tensor:
        hidden = self.model(self.ids[:bs], self.positions[:bs], self._meta(bs), self.kv)
        return self.model.compute_logits(hidden)

    @torch.inference_mode()
    def capture(self) -> CaptureReport:
        """Capture every size, largest first, all in one private memory pool."""
        torch.cuda.synchronize()
        free_before = torch.cuda.mem_get_info(self.device)[0]
        start = time.perf_counter()
        self._fill_padding(0, self.max_batch)  # inputs: all padding, so no KV is written
        self._buf.copy_(self._host)
        pool = torch.cuda.graph_pool_handle()
        for bs in reversed(self.sizes):
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):  # warm-up: Triton compiles outside the capture
                self._forward(bs)
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self.logits[bs] = self._forward(bs)
            self.graphs[bs] = graph
        torch.cuda.synchronize()
        return CaptureReport(self.sizes, time.perf_counter() - start,
                             free_before - torch.cuda.mem_get_info(self.device)[0])

    def fits(self, n: int) -> bool:
        return 0 < n <= self.max_batch and bool(self.graphs)

    @torch.inference_mode()
    def run(self, ids: list[int], positions: list[int], block_tables: np.ndarray,
            block_size: int) -> torch.Tensor:
        """One decode step -> (n, V) float32 logits (a view, valid until the next run).

        ``block_tables``: (n, >= blocks in use) int array; the new token of row ``i``
        sits at ``positions[i]`` and its context is ``positions[i] + 1`` tokens.
        """
        n = len(ids)
        if not self.fits(n):
            return self.run_eager(ids, positions, block_tables, block_size)
        bs = self.sizes[bisect.bisect_left(self.sizes, n)]
        assert self._copied is not None
        self._copied.synchronize()  # the last step's copy has left the pinned buffer
        self._fill(ids, positions, block_tables, block_size)
        self._buf.copy_(self._host, non_blocking=True)
        self._copied.record()
        self.graphs[bs].replay()
        return self.logits[bs][:n]

    def _fill(self, ids, positions, tables, block_size: int) -> None:
        b, n, h = self.max_batch, len(ids), self._host_np
        pos = np.asarray(positions, dtype=np.int64)
        used = min(tables.shape[1], self.max_blocks)
        h[:n] = ids
        h[b : b + n] = pos
        t = h[4 * b :].reshape(b, self.max_blocks)
        t[:n, :used] = tables[:, :used]
        h[2 * b : 2 * b + n] = t[np.arange(n), pos // block_size] * block_size + pos % block_size
        h[3 * b : 3 * b + n] = pos + 1
        self._fill_padding(n, b)

    def _fill_padding(self, lo: int, hi: int) -> None:
        b, h = self.max_batch, self._host_np
        h[lo:hi] = 0
        h[b + lo : b + hi] = 0
        h[2 * b + lo : 2 * b + hi] = -1  # write nothing
        h[3 * b + lo : 3 * b + hi] = 1  # read key 0 of block table row 0..: finite, discarded

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
