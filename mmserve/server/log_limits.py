"""One log line per repeated failure class, not a storm of identical tracebacks.

A hostile client can make the same failure happen thousands of times a second
(malformed requests, connections closed by the limits, ``accept()`` out of file
descriptors). ``RepeatFilter`` lets the first record of a class through (with its
traceback) and drops the rest for ``window_s`` seconds; the first one after the window
says how many were dropped. A class is (logger, message template, exception type).
"""

from __future__ import annotations

import logging
import time

MAX_CLASSES = 1024  # distinct classes remembered; the oldest is forgotten past this


class RepeatFilter(logging.Filter):
    def __init__(self, window_s: float) -> None:
        super().__init__()
        self.window_s = window_s
        self._seen: dict[tuple[str, str, type | None], list[float]] = {}  # -> [since, dropped]

    def filter(self, record: logging.LogRecord) -> bool:
        exc_type = record.exc_info[0] if record.exc_info else None
        key = (record.name, str(record.msg), exc_type)
        now = time.monotonic()
        seen = self._seen.get(key)
        if seen is not None and now - seen[0] < self.window_s:
            seen[1] += 1
            return False
        if seen is not None and seen[1]:
            note = f" [{int(seen[1])} more like this in the last {now - seen[0]:.0f} s]"
            record.msg = str(record.msg) + note.replace("%", "%%")
        self._seen.pop(key, None)
        if len(self._seen) >= MAX_CLASSES:
            self._seen.pop(next(iter(self._seen)))
        self._seen[key] = [now, 0]
        return True


LOGGERS = ("", "uvicorn", "uvicorn.error", "uvicorn.access", "asyncio", "mmserve")


def install_repeat_filter(window_s: float) -> None:
    """Put a ``RepeatFilter`` on every handler of the root, uvicorn and mmserve loggers
    (once per handler; a second call sets the window)."""
    for name in LOGGERS:
        for handler in logging.getLogger(name).handlers:
            mine = [f for f in handler.filters if isinstance(f, RepeatFilter)]
            if mine:
                mine[0].window_s = window_s
            else:
                handler.addFilter(RepeatFilter(window_s))
