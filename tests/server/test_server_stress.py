"""The fast part of ``mmserve bench stress``: its phases, scaled down, against the session's
live server. Fuzzed inputs get no 5xx and no crash; cancelled streams leak no block."""

from __future__ import annotations

import os
from typing import Any

import pytest
from live_server import LiveServer

from mmserve.bench.stress import phases
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


def test_fuzzed_realtime_events(target: Target) -> None:
    result = phases.fuzz_ws(target, 50, rng_seed=1)
    _clean(result)
    assert result.extra["sockets_closed_abnormally"] == 0
    assert result.extra["events_received"] >= result.inputs // 2


def test_abort_storm_leaks_no_block(target: Target) -> None:
    _clean(phases.abort_storm(target, 24, concurrency=12, rng_seed=1))
