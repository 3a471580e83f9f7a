"""Graceful shutdown: a server told to stop lets requests in flight finish for
``shutdown_grace_s``, then cancels the rest in the engine, so each ends with an error its
client reads (not a dropped socket) and every KV block goes back to the pool.

This test stops a live server the way uvicorn's SIGTERM handler does (``should_exit``)
over the session's engine; ``test_cli`` sends a real SIGTERM to ``mmserve serve`` with a
stream in flight and reads its exit line (requests cancelled, blocks still in use).
"""

from __future__ import annotations

import time
from typing import Any

from live_server import LiveServer, last_json, start_stream, wait_for_idle

from mmserve.config import ServerConfig

GRACE_S = 5.0


def test_stop_drains_short_requests_and_cancels_the_rest(engine: Any) -> None:
    before = engine.stats().kv_blocks_used
    config = ServerConfig(host="127.0.0.1", port=0, log_level="critical", shutdown_grace_s=GRACE_S)
    srv = LiveServer(engine, config).start()
    short, short_thread = start_stream(srv.url, 6)  # well inside the grace
    long, long_thread = start_stream(srv.url, 400)  # far past it
    assert "[DONE]" not in short.events, short.events  # in flight when the stop comes
    stop_at = time.monotonic()
    srv.server.should_exit = True  # what uvicorn's SIGTERM/SIGINT handler sets
    for thread in (short_thread, long_thread, srv.thread):
        thread.join(timeout=60)
        assert not thread.is_alive()
    assert time.monotonic() - stop_at < GRACE_S + 15
    assert short.events[-1] == "[DONE]", short.events  # drained: it finished in the grace
    assert last_json(short.events)["choices"][0]["finish_reason"] == "length", short.events
    assert long.transport_error is None, long.transport_error  # ended in the protocol
    err = last_json(long.events)["error"]
    assert err["code"] == "engine_unavailable" and "shutting down" in err["message"]
    assert engine.alive()  # only the server stopped; the engine goes on serving
    wait_for_idle(engine, before)
