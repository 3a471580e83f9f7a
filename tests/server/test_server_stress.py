"""The fast part of ``mmserve bench stress``: its phases, scaled down, against the session's
live server. Fuzzed inputs get no 5xx and no crash; cancelled streams leak no block."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from concurrent.futures import Future
from typing import Any

import httpx
import pytest
from live_server import LiveServer

from mmserve.bench.stress import phases
from mmserve.bench.stress.fuzz_workers import combine, run_fuzz, shares
from mmserve.bench.stress.target import Target


@pytest.fixture(scope="module")
def target(server: LiveServer, engine: Any) -> Target:
    return Target(server.url, os.getpid(), blocks=lambda: engine.stats().kv_blocks_used)


def _clean(result: phases.PhaseResult) -> None:
    assert (result.crashes, result.status_5xx, result.leaked_blocks) == (0, 0, 0), result


def test_fuzzed_http_inputs(target: Target) -> None:
    """Giving up after 1 s (not the bench's 5 s) still leaves long fuzzed generations for
    the server to abort (status -1), at a fifth of the wait. Every input is tried."""
    result = phases.fuzz_http(target, 40, rng_seed=1, give_up_s=1.0)
    _clean(result)
    assert result.inputs == 40
    statuses = set(result.extra["statuses"])
    # refused ones, and ones the engine ran (answered, or given up on while generating)
    assert "400" in statuses and statuses & {"200", "-1"}, result.extra


def test_a_stream_is_given_up_on_by_its_deadline() -> None:
    """Chunks every 0.1 s never trip a 1 s read timeout; the deadline still ends it."""

    def trickle() -> Iterator[bytes]:
        for _ in range(30):  # 3 s in all: a client that ignored its deadline fails below
            time.sleep(0.1)
            yield b"data: {}\n\n"

    transport = httpx.MockTransport(lambda request: httpx.Response(200, content=trickle()))
    with httpx.Client(transport=transport, base_url="http://x", timeout=1.0) as client:
        start = time.monotonic()
        assert phases.post_by(client, "/v1/completions", {}, deadline=start + 0.5) == -1
        assert time.monotonic() - start < 1.0


def test_fuzzed_realtime_events(target: Target) -> None:
    result = phases.fuzz_ws(target, 50, rng_seed=1)
    _clean(result)
    assert result.extra["sockets_closed_abnormally"] == 0
    assert result.extra["events_received"] >= result.inputs // 2


def test_shares_sum_to_the_count() -> None:
    assert shares(40, 2) == [20, 20]
    assert shares(10, 4) == [3, 3, 2, 2]
    assert shares(3, 8) == [1, 1, 1, 0, 0, 0, 0, 0]


@pytest.mark.parametrize("phase, n", [("fuzz-http", 40), ("fuzz-ws", 41)])
def test_fuzz_workers_add_up(target: Target, phase: str, n: int) -> None:
    """Two worker processes, each with its share and seed: every input is counted once,
    the statuses and events add up, and the parent's settling finds no leaked block."""
    result = run_fuzz(phase, target, n, rng_seed=1, workers=2, give_up_s=1.0)
    _clean(result)
    assert result.inputs == n, result
    assert result.extra["workers"] == 2 and "worker_failures" not in result.extra, result.extra
    if phase == "fuzz-http":
        assert sum(result.extra["statuses"].values()) == n, result.extra
    else:
        assert result.extra["sockets_closed_abnormally"] == 0
        assert result.extra["events_received"] >= n // 2


def test_a_failed_worker_counts_as_a_crash() -> None:
    ok: Future[phases.PhaseResult] = Future()
    ok.set_result(phases.PhaseResult("fuzz-ws", inputs=5, extra={"events_received": 7}))
    failed: Future[phases.PhaseResult] = Future()
    failed.set_exception(ConnectionRefusedError("no server"))
    result = combine("fuzz-ws", [ok, failed])
    assert (result.inputs, result.crashes, result.extra["events_received"]) == (5, 1, 7)
    assert result.extra["worker_failures"] == ["worker 1: ConnectionRefusedError: no server"]


def test_abort_storm_leaks_no_block(target: Target) -> None:
    _clean(phases.abort_storm(target, 24, concurrency=12, rng_seed=1))
