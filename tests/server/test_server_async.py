"""Async scheduling behind the live server (real ``openai`` clients): concurrent streams
give the synchronous engine's text, and a client that goes away mid-stream frees its
blocks while steps run ahead, with the server still serving.

The engine runs async scheduling on CUDA only; here it is switched on on CPU, where a
step launched ahead runs at once, to drive its bookkeeping through the server's engine
thread (aborts arrive between steps, from the inbox)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import openai
import pytest
from live_server import LiveServer, wait_for_idle

from mmserve.config import EngineConfig
from mmserve.engine.async_engine import AsyncEngine

PROMPTS = [
    "Count to five.",
    "What is 2+2?",
    "Name a fruit.",
    "Say goodbye.",
    "Write a haiku about rain.",
    "List three colours.",
]


@pytest.fixture(scope="module")
def ahead_engine() -> Iterator[Any]:
    eng = AsyncEngine.from_config(EngineConfig(device="cpu", max_model_len=512, max_num_seqs=8))
    eng.engine.async_scheduling = True
    yield eng
    eng.shutdown_sync()


@pytest.fixture(scope="module")
def ahead_server(ahead_engine: Any) -> Iterator[LiveServer]:
    with LiveServer(ahead_engine) as srv:
        yield srv


async def _stream(
    url: str, model: str, prompt: str, max_tokens: int, stop_after: int | None = None
) -> str:
    client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0, timeout=300)
    stream = await client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": prompt}],
        max_tokens=max_tokens,
        temperature=0,
        stream=True,
    )
    text, chunks = "", 0
    async for c in stream:
        if c.choices:
            text += c.choices[0].delta.content or ""
            chunks += 1
            if stop_after is not None and chunks >= stop_after:
                await stream.close()  # the client goes away mid-stream
                break
    await client.close()
    return text


def test_concurrent_streams_equal_the_synchronous_engine(
    ahead_server: LiveServer, ahead_engine: Any, server: LiveServer, model_name: str
) -> None:
    async def run(url: str) -> list[str]:
        return list(await asyncio.gather(*(_stream(url, model_name, p, 24) for p in PROMPTS)))

    before = ahead_engine.engine.ahead_steps
    ahead = asyncio.run(run(ahead_server.url))
    sync = asyncio.run(run(server.url))  # the session's server: async scheduling off (CPU)
    assert all(ahead) and ahead == sync
    assert ahead_engine.engine.ahead_steps - before > 5


def test_client_gone_mid_stream_frees_blocks_and_serving_goes_on(
    ahead_server: LiveServer, ahead_engine: Any, server: LiveServer, model_name: str
) -> None:
    before = ahead_engine.stats().kv_blocks_used

    async def run(url: str, stop_after: int | None) -> tuple[list[str], str]:
        cut = await asyncio.gather(
            *(_stream(url, model_name, p, 60, stop_after) for p in PROMPTS[:4])
        )
        after = await _stream(url, model_name, PROMPTS[4], 12)
        return list(cut), after

    cut, after = asyncio.run(run(ahead_server.url, 4))
    full, sync_after = asyncio.run(run(server.url, None))
    assert all(cut) and all(f.startswith(c) for c, f in zip(cut, full, strict=True))
    assert after == sync_after  # served on, with the synchronous engine's text
    wait_for_idle(ahead_engine, before)
    pending = ahead_engine.engine.launch.pending
    assert pending is None or all(s.req.finished for s in pending.seqs)
