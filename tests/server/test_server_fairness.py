"""Issue 52's third case against a live server: a short chat sent while a 1,500-word prompt
prefills is answered before the long prompt's first token, and a stream already decoding
keeps getting tokens meanwhile (fair steps: ``mmserve.engine.scheduler``).

Orderings, not durations, are asserted, so a slow or busy machine cannot fail it: the
long prompt needs several steps of prefill, the short one a single chunk beside it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from live_server import LiveServer, wait_for_idle

from mmserve.config import EngineConfig, ServerConfig

WORDS = 1500


@pytest.fixture(scope="module")
def long_engine() -> Iterator[Any]:
    from mmserve.engine.async_engine import AsyncEngine

    eng = AsyncEngine.from_config(EngineConfig(device="cpu", max_model_len=2048, max_num_seqs=4))
    yield eng
    eng.shutdown_sync()


def _timed_stream(url: str, text: str, max_tokens: int, times: list[float]) -> None:
    """Stream a greedy chat, appending the arrival time of each content chunk to ``times``."""
    body = {
        "messages": [{"role": "user", "content": text}],
        "stream": True,
        "temperature": 0,
        "max_tokens": max_tokens,
        "ignore_eos": True,
    }
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=600) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if '"content":"' in line or '"content": "' in line:
                times.append(time.monotonic())


def test_short_chat_is_not_stuck_behind_a_long_prompt(long_engine: Any) -> None:
    text = " ".join(
        (
            "the quick brown fox jumps over a lazy dog while seven ravens watch "
            * (WORDS // 13 + 1)
        ).split()[:WORDS]
    )
    stream: list[float] = []
    long: list[float] = []
    short: list[float] = []
    config = ServerConfig(host="127.0.0.1", port=0, log_level="warning")
    with LiveServer(long_engine, config) as srv:
        decoding = threading.Thread(
            target=_timed_stream, args=(srv.url, "Count from one to one hundred.", 64, stream)
        )
        decoding.start()
        while not stream:  # the stream is decoding before the long prompt comes
            assert decoding.is_alive()
            time.sleep(0.05)
        clients = [threading.Thread(target=_timed_stream, args=(srv.url, text, 1, long))]
        clients[0].start()
        time.sleep(0.5)
        sent = time.monotonic()
        clients.append(
            threading.Thread(
                target=_timed_stream, args=(srv.url, "What is the capital of France?", 4, short)
            )
        )
        clients[1].start()
        for c in (*clients, decoding):
            c.join(timeout=600)
            assert not c.is_alive()
    assert long and short, (long, short)
    assert short[0] < long[0]  # not stuck behind the long prefill (it waited for it once)
    # a token a step for the running stream while the long prompt prefilled
    assert sum(sent < t < long[0] for t in stream) >= 2
    wait_for_idle(long_engine, 0)
