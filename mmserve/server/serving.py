"""What every OpenAI route shares: server state, request checks, disconnects.

``ServerState`` lives on ``app.state.mm``; routes read the engine, the served
model name, the resolved parser formats and the metrics from it. Prompt
tokenization runs in a worker thread so a large prompt never stalls the loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from fastapi import Request
from starlette.types import Receive

from mmserve.config import ServerConfig
from mmserve.engine.outputs import RequestOutput
from mmserve.errors import UnknownModelError
from mmserve.server.engine_client import EngineClient, aclose
from mmserve.server.errors import ClientDisconnected, ParamError
from mmserve.server.metrics import ServerMetrics

T = TypeVar("T")


@dataclass
class ServerState:
    engine: EngineClient
    config: ServerConfig
    model_name: str
    formats: tuple[str | None, str | None]  # (tool format, reasoning format), resolved
    metrics: ServerMetrics

    def check_model(self, requested: str | None) -> None:
        if requested is not None and requested not in (self.model_name, self.engine.model_name):
            raise UnknownModelError(
                f"The model '{requested}' does not exist; this server serves '{self.model_name}'."
            )


def get_state(request: Request) -> ServerState:
    state: ServerState = request.app.state.mm
    return state


def resolve_max_tokens(
    requested: int | None, prompt_len: int, max_model_len: int, prompt_param: str
) -> int:
    """Check the prompt and ``max_tokens`` against the context; return the token budget."""
    if prompt_len == 0:
        raise ParamError("the prompt is empty after tokenization", param=prompt_param)
    if prompt_len + 1 > max_model_len:
        raise ParamError(
            f"This model's maximum context length is {max_model_len} tokens, but the prompt "
            f"has {prompt_len} tokens. Shorten the prompt.",
            param=prompt_param,
            code="context_length_exceeded",
        )
    room = max_model_len - prompt_len
    if requested is None:
        return room
    if requested < 1:
        raise ParamError(f"max_tokens must be >= 1, got {requested}", param="max_tokens")
    if requested > room:
        raise ParamError(
            f"max_tokens={requested} is too large: the prompt has {prompt_len} tokens and the "
            f"context is {max_model_len}, so at most {room} new tokens fit.",
            param="max_tokens",
            code="context_length_exceeded",
        )
    return requested


# Prompt text up to this many characters is templated and tokenized on the event loop:
# that takes ~0.1 ms, less than a hop to a worker thread and back costs the loop (the
# submit, the wake-up, the GIL handed over twice); longer text goes to a thread, so it
# cannot stall every other stream the loop serves.
INLINE_PROMPT_CHARS = 2048


async def in_thread(fn: Callable[[], T], chars: int | None = None) -> T:
    """Run CPU work (templating, tokenizing) off the event loop, or on it when it is the
    work of ``chars <= INLINE_PROMPT_CHARS`` characters of prompt text."""
    if chars is not None and chars <= INLINE_PROMPT_CHARS:
        return fn()
    return await asyncio.to_thread(fn)


async def until_disconnect(receive: Receive, work: Awaitable[T]) -> T:
    """Await ``work``; if the client disconnects first (``receive`` says so), cancel it and
    raise ``ClientDisconnected``."""
    task = asyncio.ensure_future(work)
    watch = asyncio.ensure_future(_wait_disconnect(receive))
    try:
        await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        if not task.done():
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
        watch.cancel()
    if task.cancelled():
        raise ClientDisconnected()
    return task.result()


async def _wait_disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def timed(
    metrics: ServerMetrics,
    endpoint: str,
    start: float,
    outputs: AsyncIterator[tuple[int, RequestOutput]],
) -> AsyncIterator[tuple[int, RequestOutput]]:
    """Pass outputs through, observing time to first token, inter-token and request latency.

    ``start`` is the request's arrival (``time.perf_counter()``).
    """
    last: dict[int, float] = {}
    try:
        async for i, out in outputs:
            now = time.perf_counter()
            if out.new_token_ids:
                if i not in last:
                    metrics.ttft.observe(now - start)
                else:
                    gap = (now - last[i]) / len(out.new_token_ids)
                    for _ in out.new_token_ids:
                        metrics.itl.observe(gap)
                last[i] = now
            yield i, out
        metrics.request_latency.labels(endpoint=endpoint).observe(time.perf_counter() - start)
    finally:
        await aclose(outputs)
