"""Host CPU per SSE event in-process, without a model, a socket or an engine process.

- ``app``: the chat route over ASGI (the real app, routes, stream builders, SSE response
  and middleware) fed by a stand-in engine that yields one token a loop turn; CPU time
  over the events sent, 8 streams of ``--tokens`` tokens at once, median of ``--repeats``.
- ``protocol``: the connection-guarded uvicorn protocol mmserve serves with, answering one
  GET with ``--messages`` chunked body messages into a transport that only counts bytes;
  CPU time per body message, median of ``--repeats``.

Usage: PYTHONPATH=CHECKOUT python benchmarks/sse_host_micro.py [--tokens 500]
       [--messages 50000] [--repeats 5]
Run it against two checkouts (PYTHONPATH) for a before/after on one machine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from typing import Any

from mmserve.engine.outputs import EngineStats, RequestOutput
from mmserve.models import hub
from mmserve.models.tokenizer import Tokenizer

EVENT = b'data: {"id":"chatcmpl-x","choices":[{"index":0,"delta":{"content":" tok"}}]}\n\n'


class TokenEngine:
    """What the server needs of an engine: every request decodes " tok" until max_tokens."""

    model_name, max_model_len = "stand-in", 1 << 20

    def __init__(self) -> None:
        self.tokenizer = Tokenizer(hub.resolve_model(None))  # the default model's

    async def generate(self, ids: list[int], params: Any, request_id: str | None = None):
        for k in range(params.max_tokens):
            await asyncio.sleep(0)  # one loop turn a token, as the engine's queue gives
            last = k == params.max_tokens - 1
            yield RequestOutput(
                request_id=request_id or "x",
                new_token_ids=[k],
                new_text=" tok",
                token_ids=[k],
                text="",
                finished=last,
                finish_reason="length" if last else None,
                num_prompt_tokens=len(ids),
            )

    async def abort(self, request_id: str) -> None:
        pass

    def stats(self) -> EngineStats:
        return EngineStats(1, 0, 1, 0, 0, 0, 0, 0, 0, 0)


async def _chat(app: Any, tokens: int) -> int:
    """One streamed chat request over ASGI; the SSE events it sent."""
    body = json.dumps(
        {
            "model": "stand-in",
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": tokens,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
    ).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
    scope = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/v1/chat/completions",
        "raw_path": b"/v1/chat/completions",
        "query_string": b"",
        "root_path": "",
        "headers": headers,
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 2),
        "state": {},
    }
    events, asked, never = [0], [False], asyncio.Event()

    async def receive() -> dict[str, Any]:
        if not asked[0]:
            asked[0] = True
            return {"type": "http.request", "body": body, "more_body": False}
        await never.wait()  # the client stays connected
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        if message["type"] == "http.response.body":
            events[0] += message["body"].count(b"data: ")

    await app(scope, receive, send)
    return events[0]


async def app_us_per_event(tokens: int, repeats: int) -> float:
    from mmserve.server.app import create_app

    app = create_app(TokenEngine())  # type: ignore[arg-type]
    await _chat(app, 16)
    figures = []
    for _ in range(repeats):
        t0 = time.process_time()
        events = sum(await asyncio.gather(*(_chat(app, tokens) for _ in range(8))))
        figures.append((time.process_time() - t0) / events * 1e6)
    return statistics.median(figures)


class _Transport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.written, self.protocol = 0, None

    def write(self, data: Any) -> None:
        self.written += len(data)

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"sockname": ("127.0.0.1", 8000), "peername": ("127.0.0.1", 5000)}.get(name)

    def is_closing(self) -> bool:
        return False

    def close(self) -> None:
        pass

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def set_protocol(self, protocol: Any) -> None:
        self.protocol = protocol

    def get_protocol(self) -> Any:
        return self.protocol


def protocol_us_per_message(messages: int, repeats: int) -> tuple[str, float]:
    import uvicorn
    from uvicorn.server import ServerState

    from mmserve.server import connections

    name = next(n for n in ("guarded_httptools", "guarded_h11") if hasattr(connections, n))
    limits = connections.ConnectionLimits(100, 10.0, 10.0, 1)
    figures: list[float] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        start = {"type": "http.response.start", "status": 200, "headers": []}
        await send(start)
        t0 = time.process_time()
        for _ in range(messages):
            await send({"type": "http.response.body", "body": EVENT, "more_body": True})
        figures.append((time.process_time() - t0) / messages * 1e6)
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def one() -> None:
        cls = getattr(connections, name)(limits)
        config = uvicorn.Config(app, http=cls, log_level="warning")
        config.load()
        protocol = cls(config=config, server_state=ServerState(), app_state={})
        transport = _Transport()
        transport.protocol = protocol
        protocol.connection_made(transport)
        protocol.data_received(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        while protocol.tasks:
            await asyncio.sleep(0.01)
        protocol.connection_lost(None)

    for _ in range(repeats):
        asyncio.run(one())
    return name, statistics.median(figures)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", type=int, default=500)
    ap.add_argument("--messages", type=int, default=50000)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    us = asyncio.run(app_us_per_event(args.tokens, args.repeats))
    print(f"app: {us:.1f} us CPU per SSE event")
    name, us = protocol_us_per_message(args.messages, args.repeats)
    print(f"protocol ({name}): {us:.2f} us CPU per body message")


if __name__ == "__main__":
    main()
