"""The audio side of one Realtime session: output settings, the voice, and truncation.

With a voice loaded (``app.state.speech``, a ``tts.service.SpeechService``) a session
answers in audio by default, as OpenAI's does: ``output_modalities ["audio"]``, pcm16 at
24 kHz, the voice ``alloy`` (every OpenAI voice name maps to the loaded voice). A
``session.update`` may set the voice (``audio.output.voice``, or the beta ``voice``) and
the format (``audio.output.format`` ``{"type": "audio/pcm", "rate": 24000}``, or the beta
``output_audio_format: "pcm16"``); anything else is refused with an ``error`` event that
says what is allowed, and the session keeps its settings.

``conversation.item.truncate`` names an assistant audio item and how much of its audio the
client played (``audio_end_ms``); the item's stored transcript is cut to those words
(``Timeline.heard``), so the next response's prompt holds only what the user heard.
"""

from __future__ import annotations

from typing import Any

from mmserve.server.realtime_conversation import Conversation, RealtimeError
from mmserve.server.realtime_protocol import AudioConfig, AudioFormat, AudioOutput, SessionConfig
from mmserve.server.realtime_speech import OUTPUT_RATE, Timeline

DEFAULT_VOICE = "alloy"
KEEP_TIMELINES = 64  # assistant audio items a session can still truncate


class SessionVoice:
    def __init__(self, speech: Any) -> None:
        self.speech = speech
        self.voice = DEFAULT_VOICE
        self.timelines: dict[str, Timeline] = {}

    @property
    def available(self) -> bool:
        return self.speech is not None

    def audio_config(self) -> AudioConfig:
        fmt = AudioFormat(type="audio/pcm", rate=OUTPUT_RATE)
        return AudioConfig(output=AudioOutput(format=fmt, voice=self.voice))

    def apply(self, update: SessionConfig) -> None:
        """Check the audio settings of a ``session.update`` (raise before anything is
        applied) and take its voice."""
        if update.output_modalities and "audio" in update.output_modalities:
            self.require("session.output_modalities")
        out = update.audio.output if update.audio is not None else None
        if out is not None and out.format is not None:
            fmt = out.format
            if fmt.type != "audio/pcm" or fmt.rate not in (None, OUTPUT_RATE):
                raise RealtimeError(
                    f"output audio format {fmt.type!r} at {fmt.rate} Hz is not supported; "
                    f"use {{'type': 'audio/pcm', 'rate': {OUTPUT_RATE}}}",
                    "unsupported_audio_format",
                    "session.audio.output.format",
                )
        if update.output_audio_format not in (None, "pcm16"):
            raise RealtimeError(
                f"output_audio_format {update.output_audio_format!r} is not supported; use 'pcm16'",
                "unsupported_audio_format",
                "session.output_audio_format",
            )
        voice = out.voice if out is not None and out.voice is not None else update.voice
        if isinstance(voice, dict):
            voice = voice.get("id")
        if voice is not None:
            self.require("session.audio.output.voice")
            self.speech.registry.resolve(str(voice))  # a 400-style error if unknown
            self.voice = str(voice)

    def require(self, param: str) -> None:
        if not self.available:
            raise RealtimeError(
                "this server has no voice loaded, so it answers in text only; "
                "use output_modalities ['text'] (or start it with a voice)",
                "unsupported_modality",
                param,
            )

    def remember(self, item_id: str, timeline: Timeline) -> None:
        self.timelines[item_id] = timeline
        while len(self.timelines) > KEEP_TIMELINES:
            self.timelines.pop(next(iter(self.timelines)))

    def truncate(self, event: Any, conversation: Conversation) -> None:
        """Cut an assistant audio item's transcript to the audio its client played."""
        timeline = self.timelines.get(event.item_id)
        if timeline is None:
            raise RealtimeError(
                f"item '{event.item_id}' is not an assistant audio item of this session",
                "item_not_found",
                "item_id",
            )
        if event.content_index != 0:
            raise RealtimeError(
                "an assistant audio item has one content part: use content_index 0",
                "invalid_value",
                "content_index",
            )
        if event.audio_end_ms > timeline.audio_ms + 1:
            raise RealtimeError(
                f"audio_end_ms {event.audio_end_ms} is past the item's audio "
                f"({timeline.audio_ms:.0f} ms)",
                "invalid_value",
                "audio_end_ms",
            )
        timeline.cut_ms = float(event.audio_end_ms)
        if any(item.id == event.item_id for item in conversation.items):
            conversation.set_transcript(event.item_id, timeline.transcript())
