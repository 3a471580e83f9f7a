"""Pending embedding spans made ready: batched encodes and an encoder-output cache.

The engine knows nothing of images. A request may carry pending spans (an opaque
``payload``, its content hash ``source``, a row count; ``EmbeddingSpan``); before a
step's forward, ``SpanMaterializer.fill`` computes the vectors of every pending span
that the step's prompt chunks touch, with ONE call of the registered ``SpanEncoder``
for all the step's requests together. Encodings are kept in ``EncoderCache`` by
``source``, so a payload seen before (the same image in another request) costs no
encode; a span whose blocks all came from the prefix cache is never touched, so it
costs none either (its digest is in the block keys).

    schedule -> materialize(pending spans of the scheduled chunks) -> run -> update
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from mmserve.engine.request import EmbeddingSpan, Request


class SpanEncoder(ABC):
    """Computes span vectors from payloads; registered with the engine (``LLMEngine``).

    Contract:
    - ``encode(payloads)`` returns one ``(n_i, hidden)`` tensor per payload, in order,
      on the engine's device, in the space of ``model.embed(ids)``; ``n_i`` is the
      same for a payload whatever else is in the batch, and every span cut from it
      has ``offset + length <= n_i``.
    - A payload's encoding depends on that payload alone (batch invariance up to the
      kernels' own rounding), so a cached encoding can stand in for a fresh one.
    - It never keeps references to the payloads, and it may be called from the
      engine's thread only.
    """

    hidden_size: int

    @abstractmethod
    def encode(self, payloads: Sequence[Any]) -> list[torch.Tensor]:
        """One batched encode of ``payloads`` -> one ``(n_i, hidden)`` tensor each."""


@dataclass
class EncoderStats:
    """Counters (monotonic) for ``/metrics`` and tests."""

    encoder_calls: int = 0  # batched encode calls (at most one a step)
    encoded_payloads: int = 0  # payloads that went through the encoder
    cache_hits: int = 0  # payloads served from the encoder-output cache


class EncoderCache:
    """Encoder outputs by ``source`` digest, least recently used evicted past a byte budget.

    An entry larger than the whole budget is not kept (its request still gets it).
    """

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.bytes = 0
        self._items: OrderedDict[bytes, torch.Tensor] = OrderedDict()

    def __len__(self) -> int:
        return len(self._items)

    def get(self, key: bytes) -> torch.Tensor | None:
        value = self._items.get(key)
        if value is not None:
            self._items.move_to_end(key)
        return value

    def put(self, key: bytes, value: torch.Tensor) -> None:
        size = value.numel() * value.element_size()
        if size > self.max_bytes or key in self._items:
            return
        while self.bytes + size > self.max_bytes:
            _, old = self._items.popitem(last=False)
            self.bytes -= old.numel() * old.element_size()
        self._items[key] = value
        self.bytes += size


class SpanMaterializer:
    """Fills pending spans before the forward that reads them (the engine's seam)."""

    def __init__(self, encoder: SpanEncoder, cache_bytes: int) -> None:
        self.encoder = encoder
        self.cache = EncoderCache(cache_bytes)
        self.stats = EncoderStats()

    def fill(self, chunks: Iterable[tuple[Request, int, int]]) -> None:
        """Make ready every pending span overlapping a chunk ``(request, lo, hi)`` of
        prompt positions: cached encodings first, then one batched encode of the rest."""
        todo: list[EmbeddingSpan] = []
        for req, lo, hi in chunks:
            todo += [sp for sp in req.spans if sp.pending and sp.start < hi and sp.end > lo]
        if not todo:
            return
        encoded: dict[bytes, torch.Tensor] = {}
        missing: dict[bytes, Any] = {}  # source -> payload, first seen order
        for sp in todo:
            if sp.source in encoded or sp.source in missing:
                continue
            hit = self.cache.get(sp.source)
            if hit is not None:
                encoded[sp.source] = hit
                self.stats.cache_hits += 1
            else:
                missing[sp.source] = sp.payload
        if missing:
            outs = self.encoder.encode(list(missing.values()))
            assert len(outs) == len(missing), "one encoding per payload"
            self.stats.encoder_calls += 1
            self.stats.encoded_payloads += len(missing)
            for key, out in zip(missing, outs, strict=True):
                encoded[key] = out
                self.cache.put(key, out)
        for sp in todo:
            rows = encoded[sp.source]
            assert sp.offset + sp.length <= rows.shape[0], "span outside its payload's encoding"
            sp.vectors = rows[sp.offset : sp.offset + sp.length]
            sp.payload = None  # ready now: the input is no longer needed
