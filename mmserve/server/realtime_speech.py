"""Speaking a Realtime answer while it is still being written.

A ``Speaker`` is one response's voice: the response hands it clauses as the LLM's text
completes them (``tts.text.ClauseStream``) and reads back PCM16 24 kHz chunks, in
order, as the voice engine makes them. Every clause's pieces are requests of one audio
stream (``AudioSpec.stream_id``: the response id), so the voice engine serves them
against one playback clock, one after another; the next pieces are queued while the
current one plays, so a clause starts as soon as the one before it ends. Closing the
audio iterator (a cancelled response) aborts every piece in flight: the voice engine
frees their KV blocks and codec slots before its next step.

The speaker keeps a timeline of what it said (each clause's text and where its audio
starts and ends), which ``conversation.item.truncate`` uses to cut the stored transcript
to what the client played.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from mmserve.engine.playback import AudioSpec
from mmserve.errors import QueueFullError

OUTPUT_RATE = 24000  # the Realtime API's pcm16: 24 kHz, 16-bit, mono, little-endian
PIECES_AHEAD = 2  # pieces queued on the engine beyond the one playing


@dataclass
class SpokenClause:
    text: str
    start_ms: float
    end_ms: float


@dataclass
class Timeline:
    """What a response said, clause by clause, on its audio's time axis."""

    clauses: list[SpokenClause] = field(default_factory=list)
    cut_ms: float | None = None  # the client played only this much (truncate)

    @property
    def audio_ms(self) -> float:
        return self.clauses[-1].end_ms if self.clauses else 0.0

    def transcript(self) -> str:
        """What was said, or, once truncated, what was heard."""
        if self.cut_ms is not None:
            return self.heard(self.cut_ms)
        return " ".join(c.text for c in self.clauses)

    def heard(self, audio_end_ms: float) -> str:
        """The transcript of the first ``audio_end_ms`` of audio: whole clauses, and of the
        clause playing then, the words in the share of it that was played."""
        words: list[str] = []
        for c in self.clauses:
            if audio_end_ms >= c.end_ms:
                words += c.text.split()
            elif audio_end_ms > c.start_ms:
                part = c.text.split()
                share = (audio_end_ms - c.start_ms) / max(c.end_ms - c.start_ms, 1e-9)
                words += part[: int(share * len(part))]
        return " ".join(words)


def pcm16(samples: np.ndarray, rate: int) -> bytes:
    """Float samples in [-1, 1] at ``rate`` -> 24 kHz 16-bit little-endian PCM."""
    x = np.asarray(samples, dtype=np.float32)
    if rate != OUTPUT_RATE and len(x):
        n = int(round(len(x) * OUTPUT_RATE / rate))
        x = np.interp(np.arange(n) * (rate / OUTPUT_RATE), np.arange(len(x)), x)
    return (np.clip(x, -1.0, 1.0) * 32767.0).astype("<i2").tobytes()


class Speaker:
    """One response's voice (module docstring). ``say`` clauses, then ``end``; iterate
    ``audio()`` for ``(transcript delta or "", pcm16 bytes)`` in playback order."""

    def __init__(
        self,
        speech: Any,
        stream_id: str,
        voice: str,
        buffer_s: float = 0.2,
        first_audio_s: float = 0.15,
        timeline: Timeline | None = None,
    ) -> None:
        self.speech, self.stream_id, self.voice = speech, stream_id, voice
        self.buffer_s, self.first_audio_s = buffer_s, first_audio_s
        self.timeline = timeline if timeline is not None else Timeline()
        self._clauses: asyncio.Queue[str | None] = asyncio.Queue()
        self._seed = 0

    def say(self, clause: str) -> None:
        self._clauses.put_nowait(clause)

    def end(self) -> None:
        self._clauses.put_nowait(None)

    async def audio(self) -> AsyncGenerator[tuple[str, bytes], None]:
        pieces: asyncio.Queue = asyncio.Queue()  # (clause no., clause, pcm queue), in order
        live: list[asyncio.Task] = []
        room = asyncio.Semaphore(PIECES_AHEAD + 1)

        async def feed() -> None:
            """Clauses -> pieces on the engine, at most PIECES_AHEAD past the one playing."""
            try:
                k = 0
                while (clause := await self._clauses.get()) is not None:
                    prompts, _ = await self.speech.prompts(clause, self.voice)
                    for prompt in prompts:
                        await room.acquire()
                        task, queue = self._piece(prompt)
                        live.append(task)
                        pieces.put_nowait((k, clause, queue))
                    k += 1
                pieces.put_nowait(None)
            except Exception as exc:  # an unknown voice, a full queue: raised by the reader
                pieces.put_nowait(exc)

        feeder = asyncio.ensure_future(feed())
        started = -1  # the clause whose audio is playing
        try:
            while (entry := await pieces.get()) is not None:
                if isinstance(entry, BaseException):
                    raise entry
                k, clause, queue = entry
                while (item := await queue.get()) is not None:
                    if isinstance(item, BaseException):
                        raise item
                    if not len(item):
                        continue
                    data = pcm16(item, self.speech.sample_rate)
                    delta = ""
                    if started != k:
                        started = k
                        delta = clause if not self.timeline.clauses else " " + clause
                        at = self.timeline.audio_ms
                        self.timeline.clauses.append(SpokenClause(clause, at, at))
                    self.timeline.clauses[-1].end_ms += len(data) / 2 / OUTPUT_RATE * 1000
                    yield delta, data
                room.release()
        finally:
            for task in [feeder, *live]:
                task.cancel()
            for task in [feeder, *live]:
                with contextlib.suppress(BaseException):
                    await task

    def _piece(self, prompt: list[int]) -> tuple[asyncio.Task, asyncio.Queue]:
        from tts.stage import AudioRequest

        sp = self.speech
        frame_s = sp.frame_duration
        spec = AudioSpec(
            self.stream_id,
            frame_s,
            sp.voice.layout.tokens_per_frame,
            buffer_s=self.buffer_s,
            first_audio_s=self.first_audio_s,
            first_chunk_frames=max(1, round(0.04 / frame_s)),
            max_chunk_frames=max(1, round(0.32 / frame_s)),
            last=False,
        )
        seed, self._seed = self._seed, self._seed + 1
        queue: asyncio.Queue = asyncio.Queue()

        async def run() -> None:
            gen = sp.engine.generate(
                prompt,
                sp.voice.sampling(prompt, seed),
                f"{self.stream_id}-{uuid.uuid4().hex[:8]}",
                stage_request=AudioRequest(seed, paced=True),  # the engine chunks it (spec)
                audio=spec,
            )
            try:
                async for out in gen:
                    if out.finish_reason == "overloaded":
                        raise QueueFullError(
                            "the voice engine is at capacity: every stream "
                            "it plays must stay in real time; retry later"
                        )
                    queue.put_nowait(out.audio)
            except Exception as exc:  # handed to the reader, raised there
                queue.put_nowait(exc)
            finally:
                await gen.aclose()
                queue.put_nowait(None)

        return asyncio.ensure_future(run()), queue
