"""A live uvicorn server on 127.0.0.1 (a free port) in a background thread, for tests.

Real clients (the ``openai`` SDK, httpx, websockets) talk to it over TCP exactly
as they would to ``mmserve serve``; the engine's own loop runs in its thread.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

from mmserve.config import ServerConfig
from mmserve.server import create_app
from mmserve.server.launch import bound_address, make_server


def live_config(**overrides: Any) -> ServerConfig:
    """A test server's config: 127.0.0.1, a free port, warnings only, plus ``overrides``."""
    return ServerConfig(**{"host": "127.0.0.1", "port": 0, "log_level": "warning", **overrides})


def guarded_config(max_connections: int, **overrides: Any) -> ServerConfig:
    """``live_config`` with half-second header and body timeouts and a connection cap."""
    return live_config(
        header_timeout_s=0.5,
        body_timeout_s=0.5,
        max_connections=max_connections,
        **overrides,
    )


class LiveServer:
    """``with LiveServer(engine, config) as srv:`` serves until the block ends."""

    def __init__(self, engine: Any, config: ServerConfig | None = None, speech: Any = None) -> None:
        self.config = config or live_config()
        self.engine = engine
        self.app = create_app(engine, self.config, speech)
        self.server = make_server(self.app, engine, self.config)
        self.thread = threading.Thread(target=self.server.run, name="live-uvicorn", daemon=True)
        self.host, self.port = "127.0.0.1", 0

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def ws_url(self) -> str:
        return f"ws://{self.host}:{self.port}"

    def start(self, timeout: float = 30.0) -> LiveServer:
        self.thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the live server did not start")
            time.sleep(0.02)
        self.host, self.port = bound_address(self.server, self.config)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=15)

    def __enter__(self) -> LiveServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def wait_for_idle(engine: Any, baseline_used: int, timeout: float = 20.0) -> Any:
    """Poll ``engine.stats()`` until no request runs or waits and KV use is back at baseline."""
    deadline = time.monotonic() + timeout
    stats = engine.stats()
    while time.monotonic() < deadline:
        stats = engine.stats()
        if (
            stats.num_running == 0
            and stats.num_waiting == 0
            and stats.kv_blocks_used == baseline_used
        ):
            return stats
        time.sleep(0.05)
    raise AssertionError(f"engine did not return to idle with {baseline_used} blocks used: {stats}")


@dataclass
class StreamRecord:
    """What one streaming chat got: its status and each ``data:`` payload, in order."""

    events: list[str] = field(default_factory=list)
    status: int | None = None
    transport_error: str | None = None
    first: threading.Event = field(default_factory=threading.Event)  # set on the first event


def start_stream(
    url: str,
    max_tokens: int,
    timeout: float = 120.0,
) -> tuple[StreamRecord, threading.Thread]:
    """A streaming greedy chat on a thread (``ignore_eos``: it runs ``max_tokens``); returns
    once its first event has come, with the thread still reading."""
    record = StreamRecord()
    body = {
        "messages": [{"role": "user", "content": "Count from one to one thousand."}],
        "stream": True,
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
    }

    def read() -> None:
        try:
            with httpx.stream(
                "POST", f"{url}/v1/chat/completions", json=body, timeout=timeout
            ) as r:
                record.status = r.status_code
                if r.status_code != 200:
                    record.events.append(r.read().decode())
                for line in r.iter_lines():
                    if line.startswith("data: "):
                        record.events.append(line.removeprefix("data: "))
                        record.first.set()
        except httpx.HTTPError as exc:
            record.transport_error = repr(exc)
        finally:
            record.first.set()

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    assert record.first.wait(timeout=timeout), "the stream never started"
    assert record.status == 200, (record.status, record.events, record.transport_error)
    return record, thread


def last_json(events: list[str]) -> dict[str, Any]:
    """The last JSON payload of a stream (``[DONE]`` skipped)."""
    return dict(json.loads(next(e for e in reversed(events) if e != "[DONE]")))
