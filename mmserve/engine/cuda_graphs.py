"""CUDA-graph capture and replay of the decode step (one new token per sequence).

A decode step of a small model is a few hundred tiny kernels; launching them from
Python costs more than running them. Here the whole step (embedding -> layers ->
logits) is captured once per batch size in ``batch_sizes`` and replayed:

* inputs live in fixed-shape device buffers (ids, positions, slot mapping, context
  lengths, block tables), filled from one pinned host buffer by one copy kernel a step
  (of the part the replayed graph reads; ``triton_copy``);
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
import itertools
import time
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch

from mmserve.kernels import decode_stack
from mmserve.kernels.argmax import argmax
from mmserve.kernels.attention import KVLike, kv_layer
from mmserve.kernels.triton_attention import PagedMetadata, split_keys
from mmserve.kernels.triton_copy import copy_flat
from mmserve.models.base import CausalLM

DEFAULT_SIZES = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 256)
# One prompt chunk alone in a step (a request arriving at an idle server) replays a
# batch-1 graph of the smallest of these lengths that holds it, its rows past the chunk
# padding: eagerly, a SmolLM2-135M prefill is ~190 launches from Python, most of a short
# answer's time (the figure: docs/performance.md).
PREFILL_SIZES = (16, 32, 64, 128, 256, 512, 1024, 2048)
# Shapes the one-launch decode stack runs get a second graph of its variant that keeps a
# tile's key splits in one program (fewer registers: no spread path), replayed while no
# sequence of the step has more than this many splits' keys (``serial_max_keys``): one or
# two splits, where spreading gains less than its registers cost; from three splits the
# spread kernel is ahead (docs/performance.md).
SERIAL_MAX_SPLITS = 2


def serial_max_keys(head_dim: int) -> int:
    """The most keys a step's sequences may have to replay the serial-split graph."""
    return SERIAL_MAX_SPLITS * split_keys(head_dim)


class Replayed(NamedTuple):
    logits: torch.Tensor  # (rows, V) float32
    argmax: torch.Tensor  # (rows,) int64: each row's argmax (ties: lowest id)
    q: int  # the query bucket the step replayed: sequence i's rows start at i * q


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

    def __init__(
        self,
        model: CausalLM,
        kv_cache: KVLike,
        max_blocks_per_seq: int,
        batch_sizes: tuple[int, ...] = DEFAULT_SIZES,
        query_sizes: tuple[int, ...] = (1,),
        last_row_only: bool = False,
        embeds_input: bool = False,
    ) -> None:
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
        # two pinned buffers, used in turn, each with the event of its last copy out: a
        # step launched while the last one still runs (async scheduling) fills the other
        # buffer, never waiting on the last step's copy, which may sit behind other work
        # (a mixed step's decode replay goes before its chunks' copy)
        self._hosts = [
            torch.zeros(3 * r + 2 * b + b * mb, dtype=torch.long, pin_memory=cuda) for _ in range(2)
        ]
        self._copies = [torch.cuda.Event() if cuda else None for _ in range(2)]
        self._host_nps = [h.numpy() for h in self._hosts]
        self._turn = 0
        self._host, self._host_np = self._hosts[0], self._host_nps[0]
        self._buf = torch.zeros_like(self._host, device=self.device)
        # the stream the last input copy went on: fetching it by ``current_stream()`` each
        # step costs the host far more than checking the current stream's id
        self._index = self.device.index if self.device.index is not None else 0
        self._stream = torch.cuda.current_stream(self.device) if cuda else None
        # (bs, turn) -> (dst, src)
        self._views: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = {}
        self.ids, self.positions, self.slots = (self._buf[i * r : (i + 1) * r] for i in range(3))
        self.context_lens = self._buf[3 * r : 3 * r + b]
        self.query_lens = self._buf[3 * r + b : 3 * r + 2 * b]
        self.tables = self._buf[3 * r + 2 * b :].view(b, mb)
        self._rows = r
        # ``embeds_input``: the graphs start from input embeddings (a chunk with embedding
        # spans: the runner embeds its ids and splices the spans in, as the eager forward
        # does) read from this buffer; the ids buffer still feeds the step's positions
        self.embeds: torch.Tensor | None = None
        if embeds_input:
            table = model.embed_tokens.weight
            self.embeds = torch.zeros(r, table.shape[1], dtype=table.dtype, device=self.device)
        self.query_start = {
            q: torch.arange(b, dtype=torch.long, device=self.device) * q for q in self.qsizes
        }
        self.graphs: dict[tuple[int, int], torch.cuda.CUDAGraph] = {}
        self.logits: dict[tuple[int, int], torch.Tensor] = {}
        # each graph's logits rows' argmax, computed in the graph: a greedy step's tokens
        # without an argmax launch from the host (tens of microseconds of host time); on
        # CUDA the two-pass Triton argmax, in the step's PDL chain
        self.argmax: dict[tuple[int, int], torch.Tensor] = {}
        # the serial-split variant of the shapes whose kernels spread splits: the decode
        # stack and the layered attention (SERIAL_MAX_SPLITS)
        self.serial_max_keys = serial_max_keys(kv_layer(kv_cache, 0).k.shape[-1])
        self.serial: dict[
            tuple[int, int], tuple[torch.cuda.CUDAGraph, torch.Tensor, torch.Tensor]
        ] = {}
        self.serial_replays = 0

    def _meta(self, bs: int, q: int) -> PagedMetadata:
        return PagedMetadata(
            self.slots[: bs * q],
            self.tables[:bs],
            self.context_lens[:bs],
            self.query_start[q][:bs],
            self.query_lens[:bs],
            q,
        )

    def _forward(self, bs: int, q: int) -> torch.Tensor:
        n = bs * q
        if self.embeds is not None:
            hidden = self.model(
                None, self.positions[:n], self._meta(bs, q), self.kv, inputs_embeds=self.embeds[:n]
            )
        else:
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
                spread = decode_stack.spread_runs()
                key = (bs, q)
                self.graphs[key], self.logits[key], self.argmax[key] = self._capture(bs, q, pool)
                if decode_stack.spread_runs() > spread and self.serial_max_keys > 0:
                    with decode_stack.serial_splits():
                        self.serial[(bs, q)] = self._capture(bs, q, pool)
        # one replay each (all padding: nothing is written): a graph's first launch uploads
        # it to the device (about a millisecond); left to the first real step, that cost
        # lands on a request and in the speculation controller's cost curves
        for graph in [*self.graphs.values(), *(g for g, _, _ in self.serial.values())]:
            graph.replay()
        torch.cuda.synchronize()
        return CaptureReport(
            self.sizes,
            time.perf_counter() - start,
            free_before - torch.cuda.mem_get_info(self.device)[0],
        )

    def _capture(
        self, bs: int, q: int, pool
    ) -> tuple[torch.cuda.CUDAGraph, torch.Tensor, torch.Tensor]:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):  # warm-up: Triton compiles outside the capture
            argmax(self._forward(bs, q))
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=pool):
            logits = self._forward(bs, q)
            rows = argmax(logits)  # row-wise: a row's argmax is the one outside
        return graph, logits, rows

    def fits(self, n: int, q: int = 1) -> bool:
        return 0 < n <= self.max_batch and q <= self.max_q and bool(self.graphs)

    @torch.inference_mode()
    def run(
        self, ids: list[int], positions: list[int], block_tables: np.ndarray, block_size: int
    ) -> torch.Tensor:
        """One decode step -> (n, V) float32 logits (a view, valid until the next run).

        ``block_tables``: (n, >= blocks in use) int array; the new token of row ``i``
        sits at ``positions[i]`` and its context is ``positions[i] + 1`` tokens.
        """
        if not self.fits(len(ids)):
            return self.run_eager(ids, positions, block_tables, block_size)
        return self.run_verify([[t] for t in ids], positions, block_tables, block_size).logits

    @torch.inference_mode()
    def run_verify(
        self,
        tokens: list[list[int]],
        starts: list[int],
        tables: np.ndarray | list[list[int]],
        block_size: int,
        input_ids: torch.Tensor | None = None,
        tokens_to: tuple[torch.Tensor, torch.cuda.Event] | None = None,
        embeds: torch.Tensor | None = None,
    ) -> Replayed:
        """Sequence ``i`` runs ``tokens[i]`` from position ``starts[i]`` -> the logits of
        ``n * q`` rows (its rows are ``i*q + j``), their argmax, and ``q``: views valid
        until the next run. With ``last_row_only``: ``n`` rows, row ``i`` for sequence
        ``i``'s last token. ``tables``: each sequence's block ids (lists, or an (n, >=
        blocks in use) int array, zero-padded). ``input_ids``: a decode step's (n,)
        tokens on the device, in place of ``tokens``' (whose lengths still say one token
        a sequence). ``tokens_to``: (pinned (n,) buffer, event): the input copy's launch
        also writes ``input_ids`` there (the last step's tokens on their way to the host:
        one launch for both copies), and the event is recorded right after it.
        ``embeds``: with ``embeds_input``, the sequences' input embeddings end to end
        ((sum of lengths, H), sequence ``i``'s rows placed at ``i*q`` on)."""
        n = len(tokens)
        longest = max(map(len, tokens))
        assert self.fits(n, longest), (n, longest)
        bs = self.sizes[bisect.bisect_left(self.sizes, n)]
        q = self.qsizes[bisect.bisect_left(self.qsizes, longest)]
        turn = self._turn = self._turn ^ 1
        copied = self._copies[turn]
        assert copied is not None
        copied.synchronize()  # this buffer's copy, two runs ago, has left it
        self._host, self._host_np = self._hosts[turn], self._host_nps[turn]
        keys = self._fill(tokens, starts, tables, block_size, q)
        # the flat buffer up to the end of table row bs - 1: all this graph reads (the
        # whole buffer is ~1 MiB at 256 x 512 blocks, ~40 us of a ~1 ms batch-1 step)
        view = self._views.get((bs, turn))
        if view is None:
            used = 3 * self._rows + 2 * self.max_batch + bs * self.max_blocks
            view = self._views[bs, turn] = (self._buf[:used], self._host[:used])
        if input_ids is not None:  # the first n elements of the buffer: the ids
            assert q == 1 and input_ids.shape == (n,), (q, input_ids.shape)
        assert tokens_to is None or input_ids is not None
        # one kernel (no DMA copy: its hand-offs left the stream idle ~2-7 us each)
        copy_flat(view[0], view[1], input_ids, None if tokens_to is None else tokens_to[0])
        stream = self._current_stream()
        copied.record(stream)
        if tokens_to is not None:
            tokens_to[1].record(stream)
        assert (embeds is not None) == (self.embeds is not None)
        if embeds is not None and self.embeds is not None:
            self._place_embeds(embeds, tokens, q)
        key = (bs, q)
        graph, logits, argmax = self.graphs[key], self.logits[key], self.argmax[key]
        serial = self.serial.get(key)
        if serial is not None and keys <= self.serial_max_keys:
            graph, logits, argmax = serial
            self.serial_replays += 1
        graph.replay()
        rows = n if self.last_row_only else n * q
        return Replayed(logits[:rows], argmax[:rows], q)

    def _place_embeds(self, embeds: torch.Tensor, tokens: list[list[int]], q: int) -> None:
        """``embeds`` (sequences end to end) into the buffer's rows, sequence i at i*q; the
        rows between stay as they were (padding: finite, never written to the cache)."""
        assert self.embeds is not None
        lens = [len(t) for t in tokens]
        assert embeds.shape[0] == sum(lens), (embeds.shape, lens)
        if len(lens) == 1:
            self.embeds[: lens[0]].copy_(embeds)
            return
        rows = np.concatenate([np.arange(i * q, i * q + n) for i, n in enumerate(lens)])
        self.embeds.index_copy_(0, torch.from_numpy(rows).to(self.device), embeds)

    def _current_stream(self) -> torch.cuda.Stream:
        """``torch.cuda.current_stream()``, without building a Stream object each step."""
        assert self._stream is not None
        if torch._C._cuda_getCurrentStream(self._index)[0] != self._stream.stream_id:
            self._stream = torch.cuda.current_stream(self.device)
        return self._stream

    def _fill(
        self,
        tokens: list[list[int]],
        starts: list[int],
        tables: np.ndarray | list[list[int]],
        block_size: int,
        q: int,
    ) -> int:
        """The step's inputs into the pinned buffer, every sequence at once (a numpy call
        a field, not one per sequence) -> the most keys a sequence of the step has. One
        sequence takes Python scalars and list slices: numpy's small-array calls cost more
        than the work at batch 1 (host figures: docs/performance.md)."""
        b, r, n, h = self.max_batch, self._rows, len(tokens), self._host_np
        t = h[3 * r + 2 * b :].reshape(b, self.max_blocks)
        self._fill_padding(0, b, q)
        if n == 1:
            return self._fill_one(tokens[0], int(starts[0]), tables[0], block_size, t)
        if not isinstance(tables, np.ndarray):
            tables = block_tables(tables)
        used = min(tables.shape[1], self.max_blocks)
        t[:n, :used] = tables[:, :used]
        st = np.asarray(starts, dtype=np.int64)
        lens = np.fromiter(map(len, tokens), dtype=np.int64, count=n)
        total = int(lens.sum())
        flat = np.fromiter(itertools.chain.from_iterable(tokens), dtype=np.int64, count=total)
        if total == n:  # one token a sequence (decode steps)
            seq = np.arange(n)
            rows, pos = seq * q, st
        else:
            seq = np.repeat(np.arange(n), lens)
            within = np.arange(total) - np.repeat(np.cumsum(lens) - lens, lens)
            rows, pos = seq * q + within, st[seq] + within
        h[rows] = flat
        h[r + rows] = pos
        h[2 * r + rows] = t[seq, pos // block_size] * block_size + pos % block_size
        ends = st + lens
        h[3 * r : 3 * r + n] = ends
        h[3 * r + b : 3 * r + b + n] = lens
        return int(ends.max())

    def _fill_one(self, tokens: list[int], start: int, ids, block_size: int, t: np.ndarray) -> int:
        """``_fill`` for one sequence: its block ids (a list or an array row), its rows
        0..len-1 (the rest stay padding)."""
        b, r, h, n = self.max_batch, self._rows, self._host_np, len(tokens)
        used = min(len(ids), self.max_blocks)
        t[0, :used] = ids[:used]
        if n == 1:
            h[0], h[r] = tokens[0], start
            h[2 * r] = int(ids[start // block_size]) * block_size + start % block_size
        else:
            h[:n] = tokens
            h[r : r + n] = range(start, start + n)
            h[2 * r : 2 * r + n] = [
                int(ids[p // block_size]) * block_size + p % block_size
                for p in range(start, start + n)
            ]
        h[3 * r], h[3 * r + b] = start + n, n
        return start + n

    def _fill_padding(self, lo: int, hi: int, q: int) -> None:
        """Sequences lo..hi-1 (and every row of the buffer from lo*q on) become padding."""
        b, r, h = self.max_batch, self._rows, self._host_np
        h[lo * q : r] = 0
        h[r + lo * q : 2 * r] = 0
        h[2 * r + lo * q : 3 * r] = -1  # write nothing
        h[3 * r + lo : 3 * r + hi] = 1  # read key 0 of block table row 0..: finite, discarded
        h[3 * r + b + lo : 3 * r + b + hi] = 1

    @torch.inference_mode()
    def run_eager(
        self, ids: list[int], positions: list[int], tables: np.ndarray, block_size: int
    ) -> torch.Tensor:
        """The same step without a graph (any batch size); same kernels, same row bits."""
        dev = self.device
        pos = np.asarray(positions, dtype=np.int64)
        t = torch.as_tensor(np.ascontiguousarray(tables), dtype=torch.long).to(dev)
        slots = np.asarray(tables)[np.arange(len(ids)), pos // block_size] * block_size
        n = len(ids)
        meta = PagedMetadata(
            torch.as_tensor(slots + pos % block_size).to(dev),
            t,
            torch.as_tensor(pos + 1).to(dev),
            torch.arange(n, device=dev),
            torch.ones(n, dtype=torch.long, device=dev),
            1,
        )
        hidden = self.model(
            torch.as_tensor(ids, device=dev), torch.as_tensor(pos).to(dev), meta, self.kv
        )
        return self.model.compute_logits(hidden)


def block_tables(ids: list[list[int]]) -> np.ndarray:
    """Block id lists -> one (n, longest) int64 array, zero-padded: a numpy call a step, not
    one a sequence."""
    lens = np.fromiter(map(len, ids), dtype=np.int64, count=len(ids))
    out = np.zeros((len(ids), int(lens.max())), dtype=np.int64)
    out[np.arange(out.shape[1]) < lens[:, None]] = np.fromiter(
        itertools.chain.from_iterable(ids), dtype=np.int64, count=int(lens.sum())
    )
    return out
