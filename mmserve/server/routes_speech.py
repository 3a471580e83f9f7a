"""``POST /v1/audio/speech``: OpenAI's speech API on the loaded voice.

``response_format`` wav (the default here, as mp3 is not produced), pcm (16-bit 24 kHz
mono, little-endian) or flac; ``stream_format`` ``audio`` (the bytes, chunked as frames
decode) or ``sse`` (``speech.audio.delta`` events with base64 audio, then
``speech.audio.done`` with usage). ``speed`` (0.25-4) changes the tempo, not the pitch.
Headers leave with the first audio, so a full queue is still a 429. A client that goes
away ends the stream; every piece in flight is aborted (KV blocks and codec slots freed
before the engine's next step).
"""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
from fastapi import APIRouter, Request
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict
from starlette.responses import StreamingResponse

from mmserve.server.errors import ParamError
from mmserve.server.serving import until_disconnect
from mmserve.server.sse import SSEResponse

router = APIRouter()
MODELS = ("tts-1", "tts-1-hd", "gpt-4o-mini-tts")
STREAM_FORMATS = ("audio", "sse")


class SpeechRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str
    input: str
    voice: str | dict[str, Any]
    response_format: str | None = None
    speed: float = 1.0
    stream_format: str | None = None
    instructions: str | None = None  # accepted; this voice takes no style instructions


def _service(request: Request):  # -> tts.service.SpeechService
    svc = getattr(request.app.state, "speech", None)
    if svc is None:
        raise ParamError(
            "this server has no voice loaded (start it with --voice default or a voice directory)",
            param="model",
            code="model_not_found",
        )
    return svc


def _check(req: SpeechRequest, svc: Any, max_chars: int) -> tuple[str, str, str]:
    """-> (voice name, response format, stream format), or a 400 naming what is allowed."""
    from tts.audio_format import FORMATS

    allowed = (*MODELS, svc.model_name, "default")
    if req.model not in allowed:
        raise ParamError(
            f"unknown model {req.model!r}; allowed: {', '.join(allowed)}",
            param="model",
            code="model_not_found",
        )
    if not req.input.strip():
        raise ParamError("input is empty; give the text to speak", param="input")
    if len(req.input) > max_chars:
        raise ParamError(
            f"input has {len(req.input)} characters; at most {max_chars} are allowed", param="input"
        )
    fmt = req.response_format or "wav"
    if fmt not in FORMATS:
        raise ParamError(
            f"response_format {fmt!r} is not supported; allowed: {', '.join(FORMATS)}",
            param="response_format",
        )
    stream = req.stream_format or "audio"
    if stream not in STREAM_FORMATS:
        raise ParamError(
            f"stream_format {stream!r} is not supported; allowed: {', '.join(STREAM_FORMATS)}",
            param="stream_format",
        )
    if not 0.25 <= req.speed <= 4.0:
        raise ParamError(f"speed must be between 0.25 and 4.0, got {req.speed}", param="speed")
    voice = req.voice.get("id", "") if isinstance(req.voice, dict) else req.voice
    return str(voice), fmt, stream


@router.post("/v1/audio/speech")
async def create_speech(req: SpeechRequest, request: Request) -> Response:
    from tts.registry import UnknownVoiceError

    svc = _service(request)
    max_chars = getattr(request.app.state, "speech_max_chars", 4096)
    voice, fmt, stream = _check(req, svc, max_chars)
    try:
        prompts, _ = await svc.prompts(req.input, voice)
    except UnknownVoiceError as exc:
        raise ParamError(str(exc), param="voice") from exc
    if not prompts:
        raise ParamError("input has nothing to speak (no words)", param="input")
    from tts.service import Usage

    usage = Usage()
    pcm = _stretched(svc.stream(prompts, usage=usage), req.speed)
    try:  # the first audio before the headers, so errors (a full queue: 429) are statuses
        first = await until_disconnect(request.receive, _first(pcm))
    except BaseException:
        await pcm.aclose()  # type: ignore[attr-defined]
        raise
    body = _encode(first, pcm, fmt, svc.sample_rate)
    if stream == "sse":
        return SSEResponse(_sse(body, usage), done=False)
    if fmt == "flac":
        return Response(b"".join([b async for b in body]), media_type="audio/flac")
    from tts.audio_format import MEDIA_TYPES

    return _Streaming(body, media_type=MEDIA_TYPES[fmt])


async def _first(chunks: AsyncIterator[np.ndarray]) -> np.ndarray:
    try:
        return await anext(chunks)
    except StopAsyncIteration:
        return np.zeros(0, np.float32)


async def _stretched(chunks: AsyncIterator[np.ndarray], speed: float) -> AsyncIterator[np.ndarray]:
    from tts.stretch import Stretcher

    st = Stretcher(speed)
    try:
        async for c in chunks:
            out = st.feed(c)
            if len(out):
                yield out
        tail = st.flush()
        if len(tail):
            yield tail
    finally:
        await chunks.aclose()  # type: ignore[attr-defined]


async def _encode(
    first: np.ndarray, rest: AsyncIterator[np.ndarray], fmt: str, rate: int
) -> AsyncIterator[bytes]:
    from tts.audio_format import flac, pcm16, wav_header

    try:
        if fmt == "flac":
            parts = [first] + [c async for c in rest]
            yield flac(np.concatenate(parts), rate)
            return
        yield (wav_header(rate) if fmt == "wav" else b"") + pcm16(first)
        async for c in rest:
            yield pcm16(c)
    finally:
        await rest.aclose()  # type: ignore[attr-defined]


async def _sse(body: AsyncIterator[bytes], usage: Any) -> AsyncIterator[str]:
    """The speech events, each JSON-encoded (``SSEResponse`` frames them)."""
    try:
        async for b in body:
            event = {"type": "speech.audio.delta", "audio": base64.b64encode(b).decode()}
            yield json.dumps(event)
        done = {
            "type": "speech.audio.done",
            "usage": {
                "input_tokens": usage.input_tokens,
                "output_tokens": usage.output_tokens,
                "total_tokens": usage.input_tokens + usage.output_tokens,
            },
        }
        yield json.dumps(done)
    finally:
        await body.aclose()  # type: ignore[attr-defined]


class _Streaming(StreamingResponse):
    """Chunked audio that always closes its source (so a disconnect aborts the pieces)."""

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self.body_iterator.aclose()  # type: ignore[attr-defined]
