"""The connection guards (``server/connections.py``) on a live server, past what
``test_server_hostile`` covers: a kept-alive connection's next request is timed from its
first byte, a server whose every connection is serving answers 503 with Retry-After, and
an SSE response goes out chunked with its headers and ``[DONE]``."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from conftest import chat_messages
from live_server import LiveServer, guarded_config, wait_for_idle

MAX_CONNECTIONS = 3


@pytest.fixture(scope="module")
def guarded(engine: Any) -> Iterator[LiveServer]:
    with LiveServer(engine, guarded_config(MAX_CONNECTIONS, retry_after_s=7)) as srv:
        yield srv


def _connect(server: LiveServer) -> socket.socket:
    return socket.create_connection((server.host, server.port), timeout=30)


def _read_all(sock: socket.socket) -> bytes:
    chunks = []
    while chunk := sock.recv(65536):
        chunks.append(chunk)
    return b"".join(chunks)


def _read_response(sock: socket.socket) -> bytes:
    """One whole response with a content-length (its headers and body may arrive in
    separate segments: what is left unread would be taken for the next response)."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(65536)
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    while len(body) < length:
        body += sock.recv(65536)
    return head + b"\r\n\r\n" + body


def test_kept_alive_connection_times_its_next_headers(guarded: LiveServer) -> None:
    with _connect(guarded) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        assert _read_response(sock).startswith(b"HTTP/1.1 200")
        time.sleep(1.0)  # idle between requests longer than header_timeout_s: not cut
        sock.sendall(b"GET /health HTTP/1.1\r\n")
        assert _read_all(sock).startswith(b"HTTP/1.1 408")


def test_every_connection_serving_answers_503(guarded: LiveServer, engine: Any) -> None:
    before = engine.stats().kv_blocks_used
    body = json.dumps(
        {"messages": chat_messages("Tell a long story"), "max_tokens": 200, "stream": True}
    ).encode()
    head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\n"
    busy = [_connect(guarded) for _ in range(MAX_CONNECTIONS)]
    try:
        for sock in busy:
            sock.sendall(head + b"content-length: %d\r\n\r\n" % len(body) + body)
        for sock in busy:
            assert sock.recv(100).startswith(b"HTTP/1.1 200")
        with _connect(guarded) as extra:
            reply = _read_all(extra)
        assert reply.startswith(b"HTTP/1.1 503") and b"retry-after: 7\r\n" in reply
    finally:
        for sock in busy:
            sock.close()
    stats = wait_for_idle(engine, before)  # the closed streams freed their blocks
    assert stats.kv_blocks_used == before


def test_sse_response_is_chunked_with_its_headers_and_done(guarded: LiveServer) -> None:
    request = {"messages": chat_messages("Hi"), "max_tokens": 5, "stream": True}
    with httpx.Client(base_url=guarded.url, timeout=60) as client:
        with client.stream("POST", "/v1/chat/completions", json=request) as resp:
            headers = resp.headers
            text = "".join(resp.iter_text())
    assert headers["content-type"] == "text/event-stream; charset=utf-8"
    assert headers["cache-control"] == "no-cache"
    assert headers["x-accel-buffering"] == "no"
    assert headers["transfer-encoding"] == "chunked"
    assert text.count("data: ") >= 3 and text.endswith("data: [DONE]\n\n")
