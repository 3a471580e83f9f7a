"""Server-sent events: framing, and the response that writes them.

A streamed answer costs the API server per event, so ``SSEResponse`` is a plain ASGI
callable rather than Starlette's ``StreamingResponse``: the ``http.response.start``
message goes down through the middleware stack's send wrappers (they record that the
response started, and its status), and every body message after it goes straight to the
server's own send, which the app stores in the scope under ``RAW_SEND``; no layer between
the two changes a body message, so none needs to see one. The last event and the end of
the body leave in one message.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

from pydantic import BaseModel
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from mmserve.server.engine_client import aclose
from mmserve.server.errors import ClientDisconnected, from_exception
from mmserve.server.serving import until_disconnect

RAW_SEND = "mmserve.raw_send"  # scope key: the ASGI server's send, below every middleware
DONE = "data: [DONE]\n\n"
HEADERS = (
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),
    (b"content-type", b"text/event-stream; charset=utf-8"),
)


def sse_event(payload: BaseModel | dict[str, Any] | str) -> str:
    """One SSE event; a ``str`` payload is JSON encoded already."""
    if isinstance(payload, str):
        return f"data: {payload}\n\n"
    if isinstance(payload, BaseModel):
        return f"data: {payload.model_dump_json()}\n\n"
    return f"data: {json.dumps(payload)}\n\n"


class SSEResponse(Response):
    """A ``text/event-stream`` response, one event per chunk of ``chunks``.

    With ``done`` (the OpenAI streaming contract) the stream ends with ``data: [DONE]``,
    and an error raised by ``chunks`` after the status line has gone becomes an
    OpenAI-shaped error event before it; without, an error propagates (the connection
    closes mid-body). The source is always closed (``aclose``), however the response
    ends; a client that disconnects stops it, which aborts the generation behind it.
    """

    def __init__(self, chunks: AsyncIterator[BaseModel | str], done: bool = True) -> None:
        self.body_iterator = chunks
        self.done = done
        self.status_code = 200
        self.background = None  # FastAPI may set its background tasks here
        self.raw_headers = list(HEADERS)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await send({"type": "http.response.start", "status": 200, "headers": self.raw_headers})
            with contextlib.suppress(ClientDisconnected):
                await until_disconnect(receive, self._body(scope.get(RAW_SEND, send)))
        finally:
            await aclose(self.body_iterator)
        if self.background is not None:
            await self.background()

    async def _body(self, send: Send) -> None:
        """One message per event as it comes; ``[DONE]`` rides on the one ending the body."""
        tail = DONE if self.done else ""
        try:
            async for chunk in self.body_iterator:
                body = sse_event(chunk).encode()
                await send({"type": "http.response.body", "body": body, "more_body": True})
        except Exception as exc:
            if not self.done:
                raise
            tail = sse_event(from_exception(exc)[0]) + DONE
        await send({"type": "http.response.body", "body": tail.encode(), "more_body": False})
