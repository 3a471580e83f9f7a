"""One Realtime response in audio: the answer spoken while it is being written.

The LLM's text streams into a ``tts.text.ClauseStream``; each clause goes to the response's
``Speaker`` as soon as it is complete, so the first audio leaves long before the text is
finished. The client gets, for the one audio content part, ``response.output_audio_
transcript.delta`` (a clause, when its audio starts) and ``response.output_audio.delta``
(base64 pcm16, 24 kHz mono) events, then ``.done`` events and the usual item and
``response.done`` events (GA order, as ``realtime_response`` has it for text).

Audio deltas are at most ``DELTA_MS`` long and each is sent by its own awaited send, so
a ``response.cancel`` (which cancels this task) stops the audio at the next delta: within
one frame pair of the voice. The stored assistant item holds the transcript of what was
sent; ``conversation.item.truncate`` cuts it to what was played (``Timeline.heard``).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import time
from dataclasses import dataclass, field
from typing import Any

from mmserve.errors import QueueFullError
from mmserve.playback_client import StreamLog, play
from mmserve.server.errors import from_exception
from mmserve.server.realtime_protocol import (
    ContentPart,
    RealtimeResponse,
    ResponseStatus,
    ResponseStatusDetails,
    error_event,
    server_event,
)
from mmserve.server.realtime_response import ResponseRun, finish_status
from mmserve.server.realtime_speech import OUTPUT_RATE, Speaker, Timeline
from tts.text import ClauseStream

DELTA_MS = 40
DELTA_BYTES = OUTPUT_RATE * 2 * DELTA_MS // 1000


@dataclass
class AudioResponseRun(ResponseRun):
    speech: Any = None  # tts.service.SpeechService
    voice: str = "default"
    buffer_s: float = 0.2  # the client's buffer the voice engine schedules for
    metrics: Any = None  # ServerMetrics (time to first audio, playback of the stream)
    timeline: Timeline = field(default_factory=Timeline)
    created: float = field(default_factory=time.monotonic)
    first_audio_s: float | None = None  # response.create -> first audio delta

    def _response(
        self,
        status: ResponseStatus,
        details: ResponseStatusDetails | None = None,
        output: list[dict[str, Any]] | None = None,
    ) -> RealtimeResponse:
        resp = super()._response(status, details, output)
        resp.output_modalities = ["audio"]
        return resp

    async def _open_parts(self) -> None:
        ids = {"response_id": self.id, "output_index": 0}
        await self.send(server_event("response.output_item.added", item=self.item.to_wire(), **ids))
        await self._conversation_event("conversation.item.added", self.item.to_wire())
        await self.send(
            server_event(
                "response.content_part.added",
                item_id=self.item.id,
                content_index=0,
                part={"type": "audio", "transcript": ""},
                **ids,
            )
        )

    async def _consume(self, stream: Any) -> tuple[ResponseStatus, str | None]:
        speaker = Speaker(self.speech, self.id, self.voice, self.buffer_s, timeline=self.timeline)
        pump = asyncio.ensure_future(self._write(stream, speaker))
        log = StreamLog(0.0)
        try:
            async with contextlib.aclosing(speaker.audio()) as audio:
                async for transcript, pcm in audio:
                    await self._send_audio(transcript, pcm, log)
            return await pump
        except QueueFullError as exc:  # the voice engine refused the stream: say so, go on
            err = from_exception(exc)[0]["error"]
            await self.send(error_event(err["message"], err["code"], err["param"]))
            if self.metrics is not None:
                self.metrics.audio_streams.labels(outcome="refused").inc()
            return "failed", None
        finally:
            if not pump.done():
                pump.cancel()
                with contextlib.suppress(BaseException):
                    await pump
            self._record(log)

    async def _send_audio(self, transcript: str, pcm: bytes, log: StreamLog) -> None:
        """A chunk: its clause's transcript when it starts one, then its audio deltas."""
        if transcript:
            await self._event("response.output_audio_transcript.delta", delta=transcript)
        for i in range(0, len(pcm), DELTA_BYTES):
            await self._event(
                "response.output_audio.delta",
                delta=base64.b64encode(pcm[i : i + DELTA_BYTES]).decode(),
            )
        now = time.monotonic() - self.created
        if self.first_audio_s is None:
            self.first_audio_s = now
            if self.metrics is not None:
                self.metrics.ttfa.observe(now)
        log.chunks.append((now, len(pcm) / 2 / OUTPUT_RATE))

    async def _write(self, stream: Any, speaker: Speaker) -> tuple[ResponseStatus, str | None]:
        """The LLM's text -> clauses for the speaker (and the usage counts)."""
        splitter = ClauseStream()
        status: tuple[ResponseStatus, str | None] = ("completed", None)
        try:
            async for out in stream:
                self.usage.output_tokens = len(out.token_ids)
                self.usage.total_tokens = self.usage.input_tokens + self.usage.output_tokens
                self.text.append(out.new_text)
                for clause in splitter.feed(out.new_text):
                    speaker.say(clause)
                if out.finished:
                    status = finish_status(out)
            for clause in splitter.flush():
                speaker.say(clause)
        finally:
            speaker.end()
        return status

    async def _event(self, kind: str, **fields: Any) -> None:
        await self.send(
            server_event(
                kind,
                response_id=self.id,
                item_id=self.item.id,
                output_index=0,
                content_index=0,
                **fields,
            )
        )

    def _record(self, log: StreamLog) -> None:
        if self.metrics is None or not log.chunks:
            return
        heard = play(log, self.buffer_s)
        if heard is not None:
            self.metrics.observe_audio_stream(heard)

    async def _close_parts(self, status: ResponseStatus, reason: str | None) -> None:
        transcript = self.timeline.transcript()
        await self._event("response.output_audio.done")
        await self._event("response.output_audio_transcript.done", transcript=transcript)
        await self._event(
            "response.content_part.done", part={"type": "audio", "transcript": transcript}
        )
        self.item.status = "completed" if status == "completed" else "incomplete"
        self.item.content = [ContentPart(type="output_audio", transcript=transcript)]
        wire = self.item.to_wire()
        await self.send(
            server_event(
                "response.output_item.done", response_id=self.id, output_index=0, item=wire
            )
        )
        await self._conversation_event("conversation.item.done", wire)
        details = ResponseStatusDetails(type=status, reason=reason)  # type: ignore[arg-type]
        await self.send(
            server_event("response.done", response=self._response(status, details, [wire]))
        )
