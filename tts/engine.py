"""A voice's backbone on an mmserve engine, with its audio stage beside the step loop.

``voice_engine(voice, ...)`` builds the ``LLMEngine`` that serves the backbone (an
ordinary engine: paging, prefix caching, CUDA graphs) and the ``AudioStage`` that decodes
its frames on the same device. The offline ``Synthesizer`` drives the two in a loop; the
server wraps them in an ``AsyncEngine`` (``AsyncEngine(engine, name, stage=stage)``).
"""

from __future__ import annotations

from typing import Any

import torch

from mmserve.config import EngineConfig
from mmserve.engine.engine import LLMEngine
from tts.chunking import DEFAULT_MAX_CHUNK_S
from tts.stage import AudioStage
from tts.voice import Voice

# KV for 32 concurrent pieces of ~1,500 tokens of a small voice fits in this many MiB
DEFAULT_KV_MB = 256


def engine_config(voice: Voice, device: str = "auto", **options: Any) -> EngineConfig:
    # fixed sizes, not the device defaults: a voice shares the GPU with the LLM, and its
    # steps are short so audio deadlines hold; a voice never decodes under a grammar, so
    # no grammar compiler is built beside it
    opts: dict[str, Any] = {
        "kv_cache_memory_mb": DEFAULT_KV_MB,
        "max_num_seqs": 32,
        "max_num_batched_tokens": 512,
        "preload_grammar": False,
    }
    opts.update(options)
    return EngineConfig(model=str(voice.model_dir), device=device, **opts)


def voice_engine(
    voice: Voice,
    device: str = "auto",
    max_chunk_s: float = DEFAULT_MAX_CHUNK_S,
    **options: Any,
) -> tuple[LLMEngine, AudioStage]:
    """The backbone's engine and the audio stage decoding its frames (slots for every
    sequence the engine can run at once; later chunks of up to ``max_chunk_s`` of audio a
    codec call, ``tts.chunking``)."""
    from mmserve.engine.factory import create_engine

    config = engine_config(voice, device, **options)
    engine = create_engine(config)
    codec = voice.load_codec(engine.device).to(torch.float32).eval()
    return engine, AudioStage(codec, voice.layout, engine.sizes.max_num_seqs, max_chunk_s)
