"""What the server needs from an engine, and how it fans requests out to it.

The server never touches the model: it hands prompt token ids and
``SamplingParams`` to ``engine.generate`` (an async generator fed by the
engine's own background loop) and reads ``RequestOutput`` deltas back. Anything
with this shape can be served: ``AsyncEngine`` in production, a scripted text
source in tests. Streams are closed explicitly (``aclose``) on every exit path,
so a client that goes away aborts its requests and frees their KV blocks.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import replace
from typing import Any, Protocol

from mmserve.engine.outputs import EngineStats, RequestOutput
from mmserve.engine.request import EmbeddingSpan
from mmserve.sampling_params import SamplingParams


class EngineClient(Protocol):
    """The engine surface the server uses (``mmserve.engine.async_engine.AsyncEngine``)."""

    model_name: str
    max_model_len: int
    tokenizer: Any

    def generate(
        self, prompt_token_ids: list[int], params: SamplingParams, request_id: str | None = None
    ) -> AsyncIterator[RequestOutput]:
        """Also takes ``spans=`` (a list of ``EmbeddingSpan``) when the engine serves images
        (``image_processor`` is set); the server passes it only then."""
        ...

    async def abort(self, request_id: str) -> None: ...

    def stats(self) -> EngineStats: ...


def new_id(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex[:24]}"


def fan_out(
    engine: EngineClient,
    prompt_ids: list[int],
    params: SamplingParams,
    request_id: str,
    spans: Sequence[EmbeddingSpan] = (),
) -> list[AsyncIterator[RequestOutput]]:
    """One engine request per choice (the engine runs n=1); seeded choices get ``seed + i``.
    Each choice gets its own copies of the embedding spans (the engine fills them in)."""
    streams = []
    for i in range(params.n):
        seed = None if params.seed is None else params.seed + i
        choice_params = replace(params, n=1, seed=seed)
        rid = f"{request_id}-{i}"
        if spans:
            mine = [replace(s) for s in spans]
            streams.append(engine.generate(list(prompt_ids), choice_params, rid, spans=mine))  # type: ignore[call-arg]
        else:
            streams.append(engine.generate(list(prompt_ids), choice_params, rid))
    return streams


async def aclose(stream: AsyncIterator[Any]) -> None:
    """Close an async generator (no-op for other iterators), ignoring its errors."""
    close = getattr(stream, "aclose", None)
    if close is not None:
        with contextlib.suppress(Exception):
            await close()


async def close_streams(streams: Sequence[AsyncIterator[RequestOutput]]) -> None:
    """Close every stream; the engine aborts the requests and frees their blocks."""
    for stream in streams:
        await aclose(stream)


class PrimedStreams:
    """Choice streams whose first output (or first error) has already been awaited.

    Priming before an HTTP response starts lets queue-full and invalid-prompt
    errors become proper 4xx statuses instead of errors inside a 200 stream.
    """

    def __init__(self, streams: list[AsyncIterator[RequestOutput]]) -> None:
        self.streams = streams
        self.first: list[RequestOutput | None] = [None] * len(streams)

    async def prime(self) -> None:
        """Await each stream's first output; on any error close them all and re-raise."""
        tasks = [asyncio.ensure_future(_first(s)) for s in self.streams]
        try:
            self.first = list(await asyncio.gather(*tasks))
        except BaseException:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await close_streams(self.streams)
            raise

    def merged(self) -> AsyncIterator[tuple[int, RequestOutput]]:
        """Yield ``(choice_index, output)`` as outputs arrive on any choice, interleaved."""
        return self._single() if len(self.streams) == 1 else self._interleaved()

    async def _single(self) -> AsyncIterator[tuple[int, RequestOutput]]:
        """One choice (most requests): its outputs in order, without a task per output."""
        stream, first = self.streams[0], self.first[0]
        try:
            if first is not None:
                yield 0, first
                if first.finished:
                    return
            async for out in stream:
                yield 0, out
                if out.finished:
                    return
        finally:
            await close_streams(self.streams)

    async def _interleaved(self) -> AsyncIterator[tuple[int, RequestOutput]]:
        pending: dict[asyncio.Task[RequestOutput], int] = {}
        try:
            for i, stream in enumerate(self.streams):
                first = self.first[i]
                if first is not None:
                    yield i, first
                    if first.finished:
                        continue
                pending[asyncio.ensure_future(anext(stream))] = i
            while pending:
                done, _ = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    i = pending.pop(task)
                    try:
                        out = task.result()
                    except StopAsyncIteration:
                        continue
                    yield i, out
                    if not out.finished:
                        pending[asyncio.ensure_future(anext(self.streams[i]))] = i
        finally:
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.gather(*pending, return_exceptions=True)
            await close_streams(self.streams)


async def _first(stream: AsyncIterator[RequestOutput]) -> RequestOutput | None:
    try:
        return await anext(stream)
    except StopAsyncIteration:
        return None
