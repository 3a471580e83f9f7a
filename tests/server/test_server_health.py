"""``/health`` tells a live engine from a stuck or dead one, and a dead engine ends every
in-flight request with an error instead of leaving it hanging.

The engine loop is the real ``AsyncEngine``'s; its ``LLMEngine`` is a stand-in whose
``step`` can be made to block or to kill the loop, the two failures being tested.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from types import SimpleNamespace
from typing import Any

import httpx
from live_server import LiveServer

from mmserve.config import ServerConfig
from mmserve.engine.async_engine import AsyncEngine


class LoopKiller(BaseException):
    """Not an ``Exception``: the loop's per-step guard does not catch it."""


class StandInEngine:
    """Takes requests and, on ``step``, does what the test says: block, or die."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer, self.max_model_len = tokenizer, 512
        self.config = SimpleNamespace(max_waiting=8)
        self.connector = None
        self.scheduler = SimpleNamespace(waiting=deque())
        self.requests: dict[str, Any] = {}
        self.release = threading.Event()
        self.die = False

    def _validate(self, *args: Any) -> None:
        pass

    def add_request(
        self, prompt: list[int], params: Any, rid: str, spans: Any, audio: Any = None
    ) -> None:
        self.requests[rid] = prompt

    def abort(self, rid: str) -> None:
        self.requests.pop(rid, None)

    def has_unfinished(self) -> bool:
        return bool(self.requests)

    def step(self) -> list[Any]:
        self.release.wait()
        if self.die:
            raise LoopKiller("the step loop was killed")
        return []


def _until(url: str, status: int) -> dict[str, Any]:
    deadline = time.monotonic() + 60
    while True:
        r = httpx.get(url, timeout=30)
        if r.status_code == status or time.monotonic() > deadline:
            assert r.status_code == status, r.text
            return dict(r.json())
        time.sleep(0.05)


def test_health_reports_stuck_then_dead_engine_and_requests_end(engine: Any) -> None:
    stand_in = StandInEngine(engine.tokenizer)
    eng = AsyncEngine(stand_in, "stand-in")  # type: ignore[arg-type]
    config = ServerConfig(
        host="127.0.0.1", port=0, log_level="critical", engine_stall_timeout_s=0.3
    )
    try:
        with LiveServer(eng, config) as srv:
            health = f"{srv.url}/health"
            assert _until(health, 200) == {"status": "ok"}
            body = {
                "messages": [{"role": "user", "content": "Hi"}],
                "max_tokens": 4,
                "stream": True,
            }
            result: dict[str, Any] = {}

            def in_flight() -> None:
                with httpx.stream(
                    "POST", f"{srv.url}/v1/chat/completions", json=body, timeout=60
                ) as r:
                    result["status"] = r.status_code
                    result["body"] = r.read().decode()

            client = threading.Thread(target=in_flight)
            client.start()
            assert _until(health, 503)["status"] == "engine stuck"  # a step never ends
            stand_in.die = True
            stand_in.release.set()
            assert _until(health, 503) == {"status": "engine dead"}
            client.join(timeout=60)
            assert not client.is_alive()  # the in-flight request ended, not hung
            assert result["status"] == 503 and "engine_unavailable" in result["body"]
            refused = httpx.post(f"{srv.url}/v1/chat/completions", json={**body, "stream": False})
            assert refused.status_code == 503
            assert refused.json()["error"]["code"] == "engine_unavailable"
    finally:
        stand_in.release.set()
