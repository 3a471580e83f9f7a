"""Two engines on one loop (the LLM and its voice): both step on the host's thread, a
guest's audio requests and the host's text requests give the tokens each gives alone,
and a guest leaves the loop without stopping the host."""

from __future__ import annotations

import asyncio
import threading

import torch
from test_deadline_scheduling import tiny_model

from mmserve.config import EngineConfig
from mmserve.engine.async_engine import AsyncEngine
from mmserve.engine.engine import LLMEngine
from mmserve.engine.playback import AudioSpec
from mmserve.models.tokenizer import Tokenizer
from mmserve.sampling_params import SamplingParams

PARAMS = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
PROMPTS = [[(5 * i + 3 * j) % 500 + 3 for j in range(8 + i)] for i in range(4)]


def _engine(tokenizer) -> LLMEngine:
    config = EngineConfig(device="cpu", max_num_seqs=8, num_kv_blocks=128)
    return LLMEngine(config, tiny_model(), tokenizer, 256, torch.device("cpu"), torch.float32)


async def _run(engine: AsyncEngine, prompts, audio: bool) -> list[list[int]]:
    async def one(i: int, prompt: list[int]) -> list[int]:
        spec = AudioSpec(f"s{i}", 0.02, 2) if audio else None
        ids: list[int] = []
        async for out in engine.generate(prompt, PARAMS, f"{'a' if audio else 't'}{i}", audio=spec):
            ids = out.token_ids
        return ids

    return list(await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts))))


def test_text_and_voice_engines_share_one_loop(default_model_dir) -> None:
    tok = Tokenizer(default_model_dir)
    stepped_on: set[int] = set()
    guest = _engine(tok)
    step = guest.step

    def recorded_step():
        stepped_on.add(threading.get_ident())
        return step()

    guest.step = recorded_step  # type: ignore[method-assign]
    text = AsyncEngine(_engine(tok), "text")
    voice = AsyncEngine(guest, "voice", share_loop_with=text)
    try:

        async def both():
            return await asyncio.gather(_run(text, PROMPTS, False), _run(voice, PROMPTS, True))

        text_ids, voice_ids = asyncio.run(both())
        # the same tokens as each engine alone (same weights, greedy)
        assert stepped_on == {text._thread.ident}  # the voice stepped on the text's loop
        ref = AsyncEngine(_engine(tok), "ref")
        try:
            ref_ids = asyncio.run(_run(ref, PROMPTS, False))
        finally:
            ref.shutdown_sync()
        assert text_ids == ref_ids and voice_ids == ref_ids
        assert all(len(ids) == 24 for ids in voice_ids)
        voice.shutdown_sync()  # the guest leaves; the host still serves
        again = asyncio.run(_run(text, PROMPTS[:1], False))
        assert again == ref_ids[:1]
        assert voice.engine.blocks.num_used_blocks == 0 and text.engine.blocks.num_used_blocks == 0
    finally:
        voice.shutdown_sync()
        text.shutdown_sync()


def test_speech_service_on_the_llm_loop(default_model_dir, tmp_path) -> None:
    from tts.random_voice import random_phoneme_voice
    from tts.service import SpeechService

    text = AsyncEngine(_engine(Tokenizer(default_model_dir)), "text")
    svc = SpeechService.start(
        str(random_phoneme_voice(tmp_path / "voice")),
        "cpu",
        share_loop_with=text,
        max_num_seqs=4,
        kv_cache_memory_mb=16,
    )
    try:
        assert svc.engine._thread is text._thread

        async def speak() -> int:
            prompts, _ = await svc.prompts("Hello there.", "alloy")
            return sum([len(pcm) async for pcm in svc.stream(prompts)])

        samples = asyncio.run(speak())
        frames = sum(svc.voice.sampling(p).max_tokens for p in svc.voice.prompts("Hello there."))
        assert samples == frames * 480
    finally:
        svc.shutdown()
        text.shutdown_sync()
