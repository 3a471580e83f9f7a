"""Repeated failures of one class log one line per window, not a traceback storm."""

from __future__ import annotations

import logging

from mmserve.server.log_limits import RepeatFilter


def _record(msg: str, exc: BaseException | None = None) -> logging.LogRecord:
    info = (type(exc), exc, None) if exc is not None else None
    return logging.LogRecord("uvicorn.error", logging.ERROR, __file__, 1, msg, (), info)


def test_one_line_per_failure_class_per_window() -> None:
    f = RepeatFilter(window_s=3600)
    storm = [
        _record("Exception in ASGI application", OSError(24, "Too many open files"))
        for _ in range(10_000)
    ]
    assert sum(f.filter(r) for r in storm) == 1
    assert f.filter(_record("Exception in ASGI application", ValueError("x")))  # new class
    assert f.filter(_record("Invalid HTTP request received."))
    assert not f.filter(_record("Invalid HTTP request received."))


def test_the_line_after_the_window_counts_what_was_dropped() -> None:
    f = RepeatFilter(window_s=3600)
    assert f.filter(_record("closed a connection: %s"))
    for _ in range(41):
        assert not f.filter(_record("closed a connection: %s"))
    f.window_s = 0.0
    later = _record("closed a connection: %s")
    assert f.filter(later) and "[41 more like this" in later.getMessage().replace("%s", "")
