"""Speech: streaming codecs, codec-LM voices served by the engine, and their frontends.

    from tts import Synthesizer
    Synthesizer().save("Hello there.", "hello.wav")   # the default voice, offline

- ``tts.codec``: the streaming codec contract (frames of codes in, PCM out as they arrive,
  per-stream state apart from the weights); ``tts.slots`` pools stream states so many
  streams decode in one batched call.
- ``tts.snac``: SNAC 24 kHz (Orpheus's codec), whole and streaming;
  ``tts.framecodec``: the default voice's small causal codec.
- ``tts.layout``: how a backbone's output tokens spell codec frames (Orpheus, default);
  ``tts.voice`` / ``tts.orpheus`` / ``tts.phoneme_voice``: voices (text -> prompts,
  sampling, layout, codec); ``tts.registry``: voice names (OpenAI's map to the loaded voice).
- ``tts.stage``: the engine-side audio stage (tokens -> frames -> PCM, batched per step);
  ``tts.engine`` builds a voice's engine; ``tts.synthesizer`` (offline) and
  ``tts.service`` (asyncio, for the server) drive it.
- ``tts.text`` / ``tts.espeak``: clause splitting and espeak-ng phonemes;
  ``tts.train``: ``mmserve voice train``; ``tts.quality``: MCD, durations, spectrograms.

Nothing here imports ``mmserve.server``.
"""

from __future__ import annotations

from typing import Any

__all__ = ["Audio", "Synthesizer"]


def __getattr__(name: str) -> Any:  # the engine loads only when synthesis is asked for
    if name in __all__:
        from tts import synthesizer

        return getattr(synthesizer, name)
    raise AttributeError(name)
