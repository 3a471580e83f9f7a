"""``GET /demo/voice``: a browser page that talks to ``/v1/realtime`` and plays the answer.

Type a message; the page sends it over the Realtime protocol, plays the pcm16 deltas
through WebAudio with a jitter buffer (``?buffer_ms=``, default 200) and shows the
transcript; ``window.voiceStats`` holds what it received and how it played (tests read
it). The page itself is static and open; the WebSocket it opens checks the API key
(typed into the page, sent as the ``openai-insecure-api-key.<key>`` subprotocol).
"""

from __future__ import annotations

from importlib import resources

from fastapi import APIRouter
from fastapi.responses import HTMLResponse

router = APIRouter()
PAGE = "/demo/voice"


@router.get(PAGE, include_in_schema=False)
async def voice_page() -> HTMLResponse:
    html = resources.files("mmserve.server").joinpath("static/voice.html").read_text("utf-8")
    return HTMLResponse(html)
