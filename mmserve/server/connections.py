"""Connection limits uvicorn lacks: header and body read timeouts, a cap on open connections.

uvicorn's HTTP/1.1 protocols wait forever for a request's headers, so slow or
partial-header clients (slowloris) can hold sockets until the process runs out of
file descriptors. ``guarded_httptools`` makes a protocol class (on uvicorn's httptools
protocol: its parser and its writes cost a fraction of h11's per streamed event) that:

- closes a connection whose request line and headers have not all arrived within
  ``header_timeout_s`` of its first byte being awaited (a new connection, or a
  kept-alive one that starts a new request), answering ``408``;
- closes one whose body has not all arrived within ``body_timeout_s`` of its
  headers (the route then sees a disconnect);
- at ``max_connections`` open connections, makes room by closing the oldest
  connection that is not serving a request (idle keep-alive, or still sending
  headers); when every connection is busy, answers ``503`` with ``Retry-After``.

WebSocket connections are handed to uvicorn's WebSocket protocol after the
upgrade; from then on its ping/pong timeout (``ws_ping_*``) drops dead peers.
Each close is logged at warning level; ``log_limits`` folds the repeats.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from enum import Enum

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ConnectionLimits:
    max_connections: int
    header_timeout_s: float
    body_timeout_s: float
    retry_after_s: int


def _raw_response(status: str, text: str, extra: str = "") -> bytes:
    body = text.encode()
    head = (
        f"HTTP/1.1 {status}\r\ncontent-type: text/plain; charset=utf-8\r\n"
        f"connection: close\r\ncontent-length: {len(body)}\r\n{extra}\r\n"
    )
    return head.encode() + body


class _Request(Enum):
    """How far the connection's current request has arrived."""

    NONE = "none"  # no request yet, or the last one is all in
    HEAD = "head"  # its first byte came; its request line and headers are not all in
    BODY = "body"  # its headers are in; its body is not


def guarded_httptools(limits: ConnectionLimits) -> type[HttpToolsProtocol]:
    """An ``HttpToolsProtocol`` subclass enforcing ``limits`` (uvicorn's ``http=`` setting)."""

    class GuardedHttpToolsProtocol(HttpToolsProtocol):
        _timer: asyncio.TimerHandle | None = None
        _phase = "headers"
        _opened = 0.0
        _request = _Request.NONE

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._opened = time.monotonic()
            if len(self.connections) > limits.max_connections and not self._make_room():
                log.warning(
                    "refused a connection: all %d connections are serving requests "
                    "(max_connections)",
                    limits.max_connections,
                )
                transport.write(
                    _raw_response(
                        "503 Service Unavailable",
                        f"the server holds its limit of {limits.max_connections} connections "
                        "(max_connections); retry later",
                        f"retry-after: {limits.retry_after_s}\r\n",
                    )
                )
                transport.close()
                return
            self._arm("headers")

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._request = _Request.HEAD

        def on_headers_complete(self) -> None:
            super().on_headers_complete()
            self._request = _Request.BODY

        def on_message_complete(self) -> None:
            super().on_message_complete()
            self._request = _Request.NONE

        def data_received(self, data: bytes) -> None:
            if self._timer is None and self._idle() and self._request is _Request.NONE:
                self._arm("headers")  # a kept-alive connection starts its next request
            super().data_received(data)
            if self.transport.get_protocol() is not self:  # upgraded to a WebSocket
                self._disarm()
                return
            if self._request is _Request.BODY:
                if self._phase == "headers":
                    self._arm("body")
            elif self._request is _Request.NONE:
                self._disarm()  # the whole request is in

        def _idle(self) -> bool:
            """Not serving a request: no cycle yet, or its response is complete."""
            return self.cycle is None or self.cycle.response_complete

        def _arm(self, phase: str) -> None:
            self._disarm()
            self._phase = phase
            seconds = limits.header_timeout_s if phase == "headers" else limits.body_timeout_s
            self._timer = self.loop.call_later(seconds, self._expired)

        def _disarm(self) -> None:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None

        def _expired(self) -> None:
            self._timer = None
            if self.transport.is_closing() or self.transport.get_protocol() is not self:
                return
            if self._phase == "headers":
                log.warning(
                    "closed a connection: its request headers did not arrive within "
                    "%.0f s (header_timeout_s)",
                    limits.header_timeout_s,
                )
                if self._idle():  # no response of ours under way
                    self.transport.write(
                        _raw_response(
                            "408 Request Timeout",
                            f"request headers not received within {limits.header_timeout_s:g} s "
                            "(header_timeout_s)",
                        )
                    )
            else:
                log.warning(
                    "closed a connection: its request body did not arrive within "
                    "%.0f s (body_timeout_s)",
                    limits.body_timeout_s,
                )
            self.transport.close()

        def _make_room(self) -> bool:
            """Close the oldest connection not serving a request; False if there is none."""
            victims = [
                c
                for c in self.connections
                if c is not self
                and isinstance(c, GuardedHttpToolsProtocol)
                and c._idle()
                and not c.transport.is_closing()
            ]
            if not victims:
                return False
            oldest = min(victims, key=lambda c: c._opened)
            log.warning(
                "closed the oldest idle connection to make room (max_connections=%d)",
                limits.max_connections,
            )
            oldest.transport.close()
            return True

    return GuardedHttpToolsProtocol
