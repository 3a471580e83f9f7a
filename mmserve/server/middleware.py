"""One ASGI middleware for every route: API key, body-size limit, request counting.

The API key is checked the same way for HTTP and the WebSocket handshake
(``Authorization: Bearer <key>``; browsers, which cannot set headers on a
WebSocket, may offer the ``openai-insecure-api-key.<key>`` subprotocol as the
OpenAI Realtime API allows). ``/health`` and the static ``/demo/voice`` page are
always open. Bodies over
``max_body_bytes`` are refused with 413, whether they announce their length or
are sent chunked.
"""

from __future__ import annotations

import secrets
from typing import Any

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from mmserve.server.errors import error_response
from mmserve.server.metrics import ServerMetrics

OPEN_PATHS = frozenset({"/health", "/demo/voice"})  # the page is static; its socket is not
KEY_SUBPROTOCOL_PREFIX = "openai-insecure-api-key."


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", []):
        if key.lower() == name:
            return str(value.decode("latin-1"))
    return None


def offered_subprotocols(scope: Scope) -> list[str]:
    raw = _header(scope, b"sec-websocket-protocol") or ""
    return [p.strip() for p in raw.split(",") if p.strip()]


def presented_key(scope: Scope) -> str | None:
    auth = _header(scope, b"authorization") or ""
    scheme, _, token = auth.partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return token.strip()
    if scope["type"] == "websocket":
        for proto in offered_subprotocols(scope):
            if proto.startswith(KEY_SUBPROTOCOL_PREFIX):
                return proto[len(KEY_SUBPROTOCOL_PREFIX) :]
    return None


class ServingMiddleware:
    def __init__(
        self, app: ASGIApp, api_key: str | None, max_body_bytes: int, metrics: ServerMetrics
    ) -> None:
        self.app = app
        self.api_key = api_key
        self.max_body_bytes = max_body_bytes
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        path = scope.get("path", "")
        if not self._authorized(scope, path):
            self.metrics.count_request(path, 401)
            message = "Incorrect or missing API key: send 'Authorization: Bearer <key>'."
            await error_response(message, 401, None, "invalid_api_key")(scope, receive, send)
            return
        if scope["type"] == "websocket":
            await self.app(scope, receive, send)
            return
        await self._http(scope, receive, send, path)

    def _authorized(self, scope: Scope, path: str) -> bool:
        if self.api_key is None or path in OPEN_PATHS:
            return True
        key = presented_key(scope)
        return key is not None and secrets.compare_digest(key.encode(), self.api_key.encode())

    async def _http(self, scope: Scope, receive: Receive, send: Send, path: str) -> None:
        limit = self.max_body_bytes
        length = _header(scope, b"content-length")
        if length is not None and length.isdigit() and int(length) > limit:
            self.metrics.count_request(path, 413)
            await error_response(_too_large(limit), 413, None, "request_too_large")(
                scope, receive, send
            )
            return
        received = 0
        status: dict[str, Any] = {"code": 500}

        async def limited_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise HTTPException(413, _too_large(limit))
            return message

        async def counting_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
            await send(message)

        try:
            await self.app(scope, limited_receive, counting_send)
        finally:
            self.metrics.count_request(path, int(status["code"]))


def _too_large(limit: int) -> str:
    return f"Request body is larger than the server's limit of {limit} bytes."
