"""Offline synthesis: text -> audio with a voice on an in-process engine.

    from tts import Synthesizer
    tts = Synthesizer()                         # the default voice (or a voice directory)
    audio = tts.synthesize("Hello there.")      # Audio(samples float32, sample_rate)
    tts.save("Hello there.", "hello.wav")       # wav / flac / ogg by the file's suffix
    for chunk in tts.stream("A long text ..."): ...  # PCM as frames are decoded

Pieces of a long text (split at clause boundaries) run two at a time on the engine, so
the next piece is being generated while the current one streams.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tts.registry import load
from tts.stage import AudioRequest
from tts.voice import Voice

WINDOW = 2  # pieces in flight at once


@dataclass
class Audio:
    samples: np.ndarray  # float32, mono, in [-1, 1]
    sample_rate: int

    @property
    def seconds(self) -> float:
        return len(self.samples) / self.sample_rate


class Synthesizer:
    def __init__(
        self,
        voice: str | Voice | None = None,
        device: str = "auto",
        snac: str | None = None,
        **engine_options: Any,
    ) -> None:
        from tts.engine import voice_engine

        self.voice = voice if isinstance(voice, Voice) else load(voice, snac)
        self.engine, self.stage = voice_engine(self.voice, device, **engine_options)
        self.sample_rate = self.stage.sample_rate
        self._ids = itertools.count()

    def stream(self, text: str, speaker: str | None = None, seed: int = 0) -> Iterator[np.ndarray]:
        """PCM chunks (float32) in order, as the engine produces them."""
        prompts = self.voice.prompts(text, speaker)
        rids: list[str] = []
        audio: dict[str, list[np.ndarray]] = {}
        done: set[str] = set()
        nxt = 0
        try:
            while nxt < len(prompts) or rids:
                while nxt < len(prompts) and len(rids) < WINDOW:
                    rids.append(self._add(prompts[nxt], seed + nxt))
                    audio[rids[-1]] = []
                    nxt += 1
                for out in self._step():
                    if out.request_id in audio:
                        audio[out.request_id].append(out.audio)
                        if out.finished:
                            done.add(out.request_id)
                while rids:  # the head piece streams; later ones are held until it ends
                    head = rids[0]
                    yield from (a for a in audio[head] if len(a))
                    audio[head] = []
                    if head not in done:
                        break
                    rids.pop(0)
                    del audio[head]
        finally:
            for rid in rids:
                if rid not in done:
                    self.engine.abort(rid)
                    self.stage.release(rid)

    def synthesize(self, text: str, speaker: str | None = None, seed: int = 0) -> Audio:
        chunks = list(self.stream(text, speaker, seed))
        samples = np.concatenate(chunks) if chunks else np.zeros(0, np.float32)
        return Audio(samples.astype(np.float32), self.sample_rate)

    def save(self, text: str, path: str | Path, speaker: str | None = None) -> Path:
        import soundfile

        audio = self.synthesize(text, speaker)
        soundfile.write(str(path), audio.samples, audio.sample_rate)
        return Path(path)

    def _add(self, prompt: list[int], seed: int) -> str:
        rid = f"tts-{next(self._ids)}"
        self.engine.add_request(prompt, self.voice.sampling(prompt, seed), rid)
        self.stage.open(rid, AudioRequest(seed))
        return rid

    def _step(self) -> list:
        outs = self.engine.step()
        self.stage.process(outs)
        return outs
