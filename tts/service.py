"""Speech for an asyncio server: text -> PCM chunks from a voice engine, as they decode.

``SpeechService.start(voice)`` builds the voice's engine with its audio stage on a
background ``AsyncEngine``; ``stream(text, voice_name)`` yields float32 PCM chunks. A long
text is split at clause boundaries into pieces; two pieces are in flight at a time (the
next one generates while the current one plays), and their audio comes out in order.
Closing the stream (a client that went away) cancels every piece in flight: the engine
frees their KV blocks and the stage their codec slots before its next step.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from mmserve.engine.async_engine import AsyncEngine
from tts.registry import VoiceRegistry
from tts.stage import AudioRequest
from tts.voice import Voice

WINDOW = 2


@dataclass
class Usage:
    """What one synthesis consumed (the OpenAI speech usage shape)."""

    input_tokens: int = 0
    output_tokens: int = 0


class SpeechService:
    def __init__(self, voice: Voice, engine: Any) -> None:
        """``engine``: an ``AsyncEngine`` with the voice's audio stage, or the server's
        ``RemoteEngine`` for the voice in an engine-core process (same surface)."""
        self.voice, self.engine = voice, engine
        self.registry = VoiceRegistry(voice)
        assert engine.stage is not None, "a speech engine needs its audio stage"
        self.sample_rate: int = engine.stage.sample_rate
        self.frame_duration: float = engine.stage.frame_duration  # seconds of one codec frame

    @classmethod
    def start(
        cls,
        voice: str | Voice | None = None,
        device: str = "auto",
        snac: str | None = None,
        share_loop_with: AsyncEngine | None = None,
        **engine_options: Any,
    ) -> SpeechService:
        """``share_loop_with``: the LLM's engine, whose loop then steps the voice too (one
        thread, one GPU; ``AsyncEngine``); None: the voice gets a loop of its own."""
        from tts.engine import voice_engine
        from tts.registry import load

        v = voice if isinstance(voice, Voice) else load(voice, snac)
        engine, stage = voice_engine(v, device, **engine_options)
        return cls(v, AsyncEngine(engine, v.name, stage=stage, share_loop_with=share_loop_with))

    @property
    def model_name(self) -> str:
        return self.voice.name

    def shutdown(self) -> None:
        self.engine.shutdown_sync()

    async def prompts(self, text: str, voice_name: str) -> tuple[list[list[int]], str | None]:
        """Check the voice name (400 if unknown) and phonemize off the event loop."""
        speaker = self.registry.resolve(voice_name)
        return await asyncio.to_thread(self.voice.prompts, text, speaker), speaker

    async def stream(
        self, prompts: list[list[int]], seed: int = 0, usage: Usage | None = None
    ) -> AsyncIterator[np.ndarray]:
        """PCM chunks (float32) of every piece, in order."""
        usage = usage if usage is not None else Usage()
        tasks: list[tuple[asyncio.Task, asyncio.Queue]] = []
        nxt = 0
        try:
            while nxt < len(prompts) or tasks:
                while nxt < len(prompts) and len(tasks) < WINDOW:
                    tasks.append(self._piece(prompts[nxt], seed + nxt, usage))
                    nxt += 1
                task, queue = tasks[0]
                while (item := await queue.get()) is not None:
                    if isinstance(item, BaseException):
                        raise item
                    if len(item):
                        yield item
                tasks.pop(0)
        finally:
            for task, _ in tasks:
                task.cancel()
            for task, _ in tasks:
                with contextlib.suppress(BaseException):
                    await task

    def _piece(
        self, prompt: list[int], seed: int, usage: Usage
    ) -> tuple[asyncio.Task, asyncio.Queue]:
        queue: asyncio.Queue = asyncio.Queue()
        usage.input_tokens += len(prompt)

        async def run() -> None:
            gen = self.engine.generate(
                prompt,
                self.voice.sampling(prompt, seed),
                f"speech-{uuid.uuid4().hex}",
                stage_request=AudioRequest(seed),
            )
            try:
                async for out in gen:
                    usage.output_tokens += len(out.new_token_ids)
                    queue.put_nowait(out.audio)
            except Exception as exc:  # handed to the consumer, raised there
                queue.put_nowait(exc)
            finally:
                await gen.aclose()  # type: ignore[attr-defined]
                queue.put_nowait(None)

        return asyncio.ensure_future(run()), queue
