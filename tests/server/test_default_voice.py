"""What ``mmserve serve`` does with the default voice (``tts/voices/default``): without it
the server starts with speech off and says how to build it; with it, the voice loads and
speaks. The second test skips where the voice is not installed."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from mmserve.config import SpeechConfig
from mmserve.server.launch import start_speech


def test_without_the_default_voice_speech_is_off(monkeypatch, tmp_path, capsys) -> None:
    import tts.registry

    monkeypatch.setattr(tts.registry, "DEFAULT_VOICE_DIR", tmp_path / "default")
    assert start_speech(SpeechConfig()) is None
    out = capsys.readouterr().out
    assert "no default voice" in out and "mmserve voice train" in out


def test_the_default_voice_loads_and_speaks() -> None:
    from tts.registry import DEFAULT_VOICE_DIR

    if not (DEFAULT_VOICE_DIR / "voice.json").is_file():
        pytest.skip(f"the default voice is not installed in {DEFAULT_VOICE_DIR}")
    speech = start_speech(
        SpeechConfig(voice_device="cpu", voice_max_num_seqs=2, voice_kv_cache_memory_mb=32)
    )
    assert speech is not None
    try:

        async def say() -> np.ndarray:
            prompts, _ = await speech.prompts("Hello there.", "default")
            return np.concatenate([c async for c in speech.stream(prompts)])

        pcm = asyncio.run(say())
        assert len(pcm) > speech.sample_rate // 4 and np.abs(pcm).max() > 0
    finally:
        speech.shutdown()
