"""Turns a schedule into one model forward: flat batch tensors in, logits rows out.

The runner knows nothing of sampling or requests' lifecycles: it lays the
scheduled tokens of every sequence end to end, builds the attention metadata,
splices embedding spans in, runs the model and returns the logits of the rows
that produce tokens (the last real token of a sequence that reached its end, and
every draft position of a verify).

On CUDA a step replays captured graphs where it can:

- a decode or verify step: one decode graph;
- a prompt chunk alone: a batch-1 prefill graph;
- decodes and prompt chunks (a request arriving while others decode, a caption job's
  every admission): the decode graph for the decodes, then, with a span encoder
  attached, one replay of the several-chunk graphs for all the chunks (from their
  embeddings: images spliced in as the eager forward does), else a batch-1 prefill graph
  for each of up to ``SPLIT_CHUNKS`` (one from input embeddings for a chunk with an
  embedding span). Several chunks alone replay the several-chunk graphs too.

The kernels are batch-invariant, so splitting a step changes no row's bits. Eagerly, a
mixed step is one forward of ~190 launches from Python for a small model, which costs
about 9 ms with an image among its chunks on an H100, where a replay costs a few
launches and about a millisecond of GPU time, what a forward of a small model's ~240
kernels takes whatever its rows.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from mmserve.engine.cuda_graphs import DecodeGraphs
from mmserve.engine.kv_cache import KVCache
from mmserve.engine.scheduler import ScheduledSeq
from mmserve.kernels.attention import AttentionMetadata
from mmserve.kernels.triton_copy import copy_flat
from mmserve.models.base import CausalLM

SPLIT_CHUNKS = 8  # the most prompt chunks a mixed step replays one by one (more: eager)


class StepLogits(NamedTuple):
    logits: torch.Tensor  # (M, V) float32
    rows: list[list[int]]  # per scheduled seq: its rows in ``logits`` (empty: no tokens yet)
    num_rows: int  # query rows the forward computed (padding included), for cost models
    graph: bool = False  # the step replayed a captured CUDA graph
    argmax: torch.Tensor | None = None  # (M,): each row's argmax, where the graph took it


class ModelRunner:
    def __init__(
        self,
        model: CausalLM,
        kv: KVCache,
        block_size: int,
        graphs: DecodeGraphs | None = None,
        prefill_graphs: DecodeGraphs | None = None,
    ) -> None:
        self.model, self.kv, self.block_size = model, kv, block_size
        self.device = kv.device
        self.graphs = graphs  # CUDA: captured decode and verify steps
        self.prefill_graphs = prefill_graphs  # CUDA: batch-1 prompt chunks (last row's logits)
        # CUDA, with a span encoder: batch-1 prompt chunks from input embeddings (spans),
        # and several chunks of a step at once (text or spans, from their embeddings)
        self.span_prefill_graphs: DecodeGraphs | None = None
        self.chunk_graphs: DecodeGraphs | None = None
        self.split_steps = 0  # mixed steps run as replays (``_split``)

    @torch.inference_mode()
    def run(self, seqs: list[ScheduledSeq]) -> StepLogits:
        if (
            self.graphs is not None
            and self._decode_or_verify(seqs)
            and self.graphs.fits(len(seqs), max(s.num_tokens for s in seqs))
        ):
            return self._run_graph(seqs)
        if (
            self.prefill_graphs is not None
            and len(seqs) == 1
            and self._plain_chunk(seqs[0])
            and self.prefill_graphs.fits(1, seqs[0].num_tokens)
        ):
            return self._run_prefill_graph(seqs[0])
        chunks = self._split(seqs)
        if chunks:
            return self._run_split(seqs, chunks)
        ids: list[int] = []
        rows: list[list[int]] = []
        wanted: list[int] = []
        for s in seqs:
            offset = len(ids)
            ids += s.req.all_ids[s.start : s.start + s.num_real] + s.draft
            mine = list(range(offset + s.num_real - 1, offset + s.num_tokens)) if s.samples else []
            rows.append(list(range(len(wanted), len(wanted) + len(mine))))
            wanted += mine
        return StepLogits(self._eager(seqs, self.device_ids(ids), wanted), rows, len(ids))

    def _eager(
        self, seqs: list[ScheduledSeq], input_ids: torch.Tensor, wanted: list[int]
    ) -> torch.Tensor:
        """One eager forward of the sequences' tokens end to end (``input_ids``, on the
        device; spans spliced in) -> the logits of rows ``wanted`` (ascending), or an
        empty tensor when none is wanted."""
        positions: list[int] = []
        for s in seqs:
            positions += range(s.start, s.start + s.num_tokens)
        meta = AttentionMetadata.build(
            [s.num_tokens for s in seqs],
            [s.start + s.num_tokens for s in seqs],
            [s.req.table.block_ids for s in seqs],  # type: ignore[union-attr]
            self.block_size,
            self.device,
        )
        embeds = self._embeds(seqs, input_ids)
        hidden = self.model(
            None if embeds is not None else input_ids,
            self.device_ids(positions),
            meta,
            self.kv,
            inputs_embeds=embeds,
        )
        if not wanted:
            return hidden.new_zeros(0, 0)
        if len(wanted) < hidden.shape[0]:  # (all rows, in order: no gather)
            hidden = hidden[self.device_ids(wanted)]
        return self.model.compute_logits(hidden)

    @torch.inference_mode()
    def run_ahead(
        self,
        seqs: list[ScheduledSeq],
        input_ids: torch.Tensor,
        tokens_to: tuple[torch.Tensor, torch.cuda.Event] | None = None,
        chunks: list[ScheduledSeq] | None = None,
    ) -> StepLogits:
        """A decode step of one token a sequence whose tokens are still on the device (the
        last step's picks, not yet on the host: async scheduling), then ``chunks``: prompt
        chunks from the host that each reach their prompt's end -> row ``i`` for sequence
        ``i`` of ``seqs + chunks``. The same kernels and graphs as ``run``, so the same
        row bits; nothing in it waits for the device (the host's inputs go through pinned
        memory), so it queues behind the step still running. ``tokens_to``: (pinned
        buffer, event): ``input_ids`` are copied there and the event recorded before the
        step's work is queued (with a graph, by the launch that copies the step's inputs)."""
        chunks = chunks or []
        d, n = len(seqs), len(seqs) + len(chunks)
        rows = [[i] for i in range(n)]
        if self.graphs is not None and self.graphs.fits(d):
            logits, argmax, q = self.graphs.run_verify(
                [[0]] * d,
                [s.start for s in seqs],
                [s.req.table.block_ids for s in seqs],  # type: ignore[union-attr]
                self.block_size,
                input_ids=input_ids,
                tokens_to=tokens_to,
            )
            if not chunks:
                return StepLogits(logits, rows, d * q, graph=True, argmax=argmax)
            got_logits, got_top, computed = self._run_chunks(chunks)
            return StepLogits(
                torch.cat([logits, *got_logits]),
                rows,
                d * q + computed,
                argmax=torch.cat([argmax, *got_top]),
            )
        if tokens_to is not None:
            copy_flat(tokens_to[0], input_ids)
            tokens_to[1].record()
        prompt = [s.req.all_ids[s.start : s.start + s.num_real] for s in chunks]
        ids = torch.cat([input_ids, self.device_ids([t for p in prompt for t in p])])
        ends, at = list(range(d)), d  # each row's last token: a decode's one, a chunk's last
        for s in chunks:
            at += s.num_real
            ends.append(at - 1)
        return StepLogits(self._eager(seqs + chunks, ids, ends), rows, len(ids))

    def fits_ahead(self, decodes: int, chunks: list[tuple[int, bool]]) -> bool:
        """Whether a step launched ahead of ``decodes`` decodes and prompt chunks of (at
        most) these (length, has an embedding span) replays graphs throughout, as ``run``
        would replay it (no graphs: it runs eagerly, as everything does)."""
        if self.graphs is None or not chunks:
            return True
        return (
            self.prefill_graphs is not None
            and self.graphs.fits(decodes)
            and self._chunks_replay(chunks, decodes)
        )

    def _chunks_replay(self, chunks: list[tuple[int, bool]], decodes: int) -> bool:
        """Whether prompt chunks of these (length, has an embedding span), after
        ``decodes`` decodes, replay graphs: together in the several-chunk graphs, or (after
        at least one decode, at most ``SPLIT_CHUNKS``) each in a batch-1 prefill graph of
        its kind (a span's graphs are the plain ones up to a shorter length)."""
        n = len(chunks)
        if self._fit_together([q for q, _ in chunks]):
            return True
        if (decodes == 0 and n > 1) or n > SPLIT_CHUNKS:
            return False
        for q, span in chunks:
            graphs = self.span_prefill_graphs if span else self.prefill_graphs
            if graphs is None or not graphs.fits(1, q):
                return False
        return True

    def device_ids(self, ids: list[int]) -> torch.Tensor:
        """Host integers on the device without waiting for it: through pinned memory on
        CUDA (a copy from pageable memory would first wait for the stream's queued work)."""
        t = torch.tensor(ids, dtype=torch.long)
        if self.device.type != "cuda":
            return t
        return t.pin_memory().to(self.device, non_blocking=True)

    def copy_to_host(self, host: torch.Tensor, tokens: torch.Tensor) -> torch.cuda.Event:
        """Queue ``host[:] = tokens`` (a pinned buffer, written by a kernel) -> an event
        recorded after it."""
        copy_flat(host, tokens)
        ready = torch.cuda.Event()
        ready.record()
        return ready

    @staticmethod
    def _decode_or_verify(seqs: list[ScheduledSeq]) -> bool:
        """Every sequence runs exactly its one newest token (plus drafts), with no span."""
        for s in seqs:  # a loop, not all(genexpr): this runs every step for every sequence
            if s.num_real != 1 or not s.samples or (s.req.spans and _in_span(s)):
                return False
        return True

    @staticmethod
    def _decodes(s: ScheduledSeq) -> bool:
        """``_decode_or_verify`` of one sequence."""
        return s.num_real == 1 and s.samples and not (s.req.spans and _in_span(s))

    @staticmethod
    def _plain_chunk(s: ScheduledSeq) -> bool:
        """A prompt chunk of the request's own tokens: no drafts, no embedding span."""
        return not s.draft and not _in_span(s)

    def _run_prefill_graph(self, s: ScheduledSeq) -> StepLogits:
        """One chunk alone, replayed from the smallest prefill graph that holds it: the
        eager forward's kernels and bits (they are batch-invariant, so padding rows change
        no real row). Reported as no graph step: its cost is not a decode step's."""
        assert self.prefill_graphs is not None
        ids = s.req.table.block_ids  # type: ignore[union-attr]
        logits, argmax, q = self.prefill_graphs.run_verify(
            [s.req.all_ids[s.start : s.start + s.num_real]], [s.start], [ids], self.block_size
        )
        return StepLogits(logits, [[0] if s.samples else []], q, argmax=argmax)

    def _split(self, seqs: list[ScheduledSeq]) -> int:
        """How many prompt chunks end a step that runs as replays (0: it runs eager): the
        decodes (and verifies) come first, as the scheduler orders them, and fit the
        decode graphs; the chunks fit the several-chunk graphs together, or (after at
        least one decode) each fits a batch-1 prefill graph of its kind."""
        if self.graphs is None or self.prefill_graphs is None:
            return 0
        n = len(seqs)
        d = 0
        while d < n and self._decodes(seqs[d]):
            d += 1
        if d == n or (d and not self.graphs.fits(d, max(s.num_tokens for s in seqs[:d]))):
            return 0
        if any(s.draft for s in seqs[d:]):
            return 0
        chunks = [(s.num_tokens, _in_span(s)) for s in seqs[d:]]
        return n - d if self._chunks_replay(chunks, d) else 0

    def _run_split(self, seqs: list[ScheduledSeq], chunks: int) -> StepLogits:
        """A step of decodes and prompt chunks as replays: the decodes in one decode-graph
        replay, the last ``chunks`` sequences (prompt chunks) in one several-chunk replay
        or a prefill graph each; the rows gathered into one logits tensor in the step's
        order (decode rows as ``_run_graph`` lays them, then one row a chunk that
        samples). A graph's output buffers are read before the next replay of that
        graph (a one-by-one chunk's row is cloned: two chunks may share a length)."""
        assert self.prefill_graphs is not None
        self.split_steps += 1
        d = len(seqs) - chunks
        rows: list[list[int]] = []
        logits: list[torch.Tensor] = []
        top: list[torch.Tensor] = []
        at = computed = 0
        if d:
            rows, dec_logits, dec_top, q = self._replay_decodes(seqs[:d])
            logits.append(dec_logits)
            top.append(dec_top)
            at = computed = d * q
        got_logits, got_top, computed_chunks = self._run_chunks(seqs[d:])
        logits += got_logits
        top += got_top
        computed += computed_chunks
        for s in seqs[d:]:
            rows.append([at] if s.samples else [])
            at += s.samples
        return StepLogits(torch.cat(logits), rows, computed, argmax=torch.cat(top))

    def _run_chunks(
        self, chunks: list[ScheduledSeq]
    ) -> tuple[list[torch.Tensor], list[torch.Tensor], int]:
        """Prompt chunks as replays: together (``chunk_graphs``) or a prefill graph each
        -> the logits and argmax rows of the chunks that sample, in order, and the rows
        computed. A one-by-one chunk's row is cloned: two chunks may share a length."""
        assert self.prefill_graphs is not None
        if self._batched(chunks):
            got_logits, got_top, computed = self._replay_chunks(chunks)
            return [got_logits], [got_top], computed
        logits: list[torch.Tensor] = []
        top: list[torch.Tensor] = []
        computed = 0
        for s in chunks:
            table = s.req.table.block_ids  # type: ignore[union-attr]
            ids = s.req.all_ids[s.start : s.start + s.num_real]
            if _in_span(s):
                graphs = self.span_prefill_graphs
                assert graphs is not None
                x = self._embeds([s], self.device_ids(ids))
                got = graphs.run_verify([ids], [s.start], [table], self.block_size, embeds=x)
            else:
                got = self.prefill_graphs.run_verify([ids], [s.start], [table], self.block_size)
            computed += got.q
            if s.samples:
                logits.append(got.logits[:1].clone())
                top.append(got.argmax[:1].clone())
        return logits, top, computed

    def _batched(self, chunks: list[ScheduledSeq]) -> bool:
        """Whether prompt chunks replay together (``chunk_graphs``)."""
        lengths = [s.num_tokens for s in chunks]
        return self._fit_together(lengths) and not any(s.draft for s in chunks)

    def _fit_together(self, lengths: list[int]) -> bool:
        """Whether prompt chunks of these lengths fit one replay of the several-chunk
        graphs."""
        graphs = self.chunk_graphs
        return len(lengths) > 1 and graphs is not None and graphs.fits(len(lengths), max(lengths))

    def _replay_chunks(self, chunks: list[ScheduledSeq]) -> tuple[torch.Tensor, torch.Tensor, int]:
        """Prompt chunks in one replay of the several-chunk graphs, from their embeddings
        (every chunk's ids embedded in one call, span rows spliced in: the eager
        forward's input) -> the logits and argmax of the chunks that sample, and the
        rows computed."""
        graphs = self.chunk_graphs
        assert graphs is not None
        tokens = [s.req.all_ids[s.start : s.start + s.num_real] for s in chunks]
        flat = self.device_ids([t for ids in tokens for t in ids])
        embeds = self._embeds(chunks, flat)
        got = graphs.run_verify(
            tokens,
            [s.start for s in chunks],
            [s.req.table.block_ids for s in chunks],  # type: ignore[union-attr]
            self.block_size,
            embeds=self.model.embed(flat) if embeds is None else embeds,
        )
        picked = [j for j, s in enumerate(chunks) if s.samples]
        n = len(chunks)
        if len(picked) == n:  # every chunk samples (views: read before the next replay)
            return got.logits[:n], got.argmax[:n], n * got.q
        src = self.device_ids(picked)
        return (
            got.logits.index_select(0, src),
            got.argmax.index_select(0, src),
            n * got.q,
        )

    def _replay_decodes(
        self, seqs: list[ScheduledSeq]
    ) -> tuple[list[list[int]], torch.Tensor, torch.Tensor, int]:
        assert self.graphs is not None
        logits, argmax, q = self.graphs.run_verify(
            [[s.req.token(s.start), *s.draft] for s in seqs],
            [s.start for s in seqs],
            [s.req.table.block_ids for s in seqs],  # type: ignore[union-attr]
            self.block_size,
        )
        rows = [list(range(i * q, i * q + s.num_tokens)) for i, s in enumerate(seqs)]
        return rows, logits, argmax, q

    def _run_graph(self, seqs: list[ScheduledSeq]) -> StepLogits:
        rows, logits, argmax, q = self._replay_decodes(seqs)
        return StepLogits(logits, rows, len(seqs) * q, graph=True, argmax=argmax)

    def _embeds(self, seqs: list[ScheduledSeq], input_ids: torch.Tensor) -> torch.Tensor | None:
        """Token embeddings with span vectors spliced in, or None when no span is in play."""
        if not any(_in_span(s) for s in seqs):
            return None
        x = self.model.embed(input_ids)
        offset = 0
        for s in seqs:
            lo, hi = s.start, s.start + s.num_real
            for sp in s.req.spans:
                a, b = max(lo, sp.start), min(hi, sp.end)
                if a < b:
                    assert sp.vectors is not None, "pending span reached the runner"
                    rows = sp.vectors[a - sp.start : b - sp.start]
                    x[offset + a - lo : offset + b - lo] = rows.to(x.dtype)
            offset += s.num_tokens
        return x


def _in_span(s: ScheduledSeq) -> bool:
    """Whether any of the step's real tokens of ``s`` lies in one of its embedding spans."""
    return any(sp.start < s.start + s.num_real and sp.end > s.start for sp in s.req.spans)
