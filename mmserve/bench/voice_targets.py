"""The voices ``mmserve bench voice`` drives: a backbone engine plus how its streams look.

- ``gepard-0.5b``: a 0.5B-parameter Llama-family backbone with random weights at Gepard's
  frame layout: one backbone pass (one token position) per 80 ms frame (Gepard samples a
  whole frame, 32 FSQ channels, in one step, at 12.5 frames a second, 24 kHz). Its
  dimensions are Qwen2.5-0.5B's (hidden 896, 14 heads, 2 KV heads, MLP 4,864) with 30
  layers and a 49,152-token vocabulary: 0.49B parameters. Speed does not depend on the
  values; there is no codec behind it (the frames are counted, not decoded).
- ``default`` (or a voice directory): the voice shipped with mmserve (``tts``), its codec
  decoding each chunk on the engine's thread as it is served.

``tiny=True`` swaps the 0.5B backbone for a 2-layer one so the whole benchmark runs on a
CPU (a proof that it works, not a figure).
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from mmserve.config import EngineConfig
from mmserve.engine.engine import LLMEngine
from mmserve.sampling_params import SamplingParams

GEPARD_FRAME_S = 0.08  # 12.5 frames a second
GEPARD_SHAPE: dict[str, Any] = dict(
    model_type="llama",
    hidden_size=896,
    num_hidden_layers=30,
    num_attention_heads=14,
    num_key_value_heads=2,
    intermediate_size=4864,
    vocab_size=49152,
    head_dim=64,
    tie_word_embeddings=True,
    rope_theta=1000000.0,
    rms_norm_eps=1e-6,
    max_position_embeddings=4096,
)
TINY_SHAPE: dict[str, Any] = dict(
    GEPARD_SHAPE,
    hidden_size=128,
    num_hidden_layers=2,
    num_attention_heads=2,
    num_key_value_heads=1,
    intermediate_size=256,
    vocab_size=4096,
)
PROMPT_TOKENS = 40  # a sentence of text tokens and a speaker tag
SENTENCES = (
    "Thanks for calling, how can I help you today?",
    "Your order shipped on Tuesday and should arrive within three days.",
    "I can book a table for four at seven thirty, would that work for you?",
    "The weather tomorrow looks sunny, with a high of twenty two degrees.",
    "Sure, I have moved your appointment to Friday morning at nine.",
    "Please hold on for a moment while I look that up.",
)


@dataclass
class VoiceTarget:
    """An engine serving one voice's backbone, and how to make its streams."""

    name: str
    engine: LLMEngine
    stage: Any  # tts.stage.AudioStage, or None: frames are counted from tokens
    frame_s: float
    tokens_per_frame: int
    request: Callable[[int, float], tuple[list[int], SamplingParams]]  # (i, seconds) ->
    sample_rate: int = 24000

    def open(self, rid: str, seed: int) -> None:
        """The stream's stage state; its engine request carries an ``AudioSpec``, so the
        engine paces its chunks."""
        if self.stage is not None:
            from tts.stage import AudioRequest

            self.stage.open(rid, AudioRequest(seed, paced=True))

    def step(self) -> list:
        outs = self.engine.step()
        if self.stage is not None:
            self.stage.process(outs)
        return outs

    def chunk_seconds(self, out: Any) -> float:
        """Seconds of audio in one released output."""
        if self.stage is not None:
            return len(out.audio) / self.sample_rate
        return len(out.new_token_ids) / self.tokens_per_frame * self.frame_s


def engine_options(max_streams: int, text_clients: int, device: str) -> dict[str, Any]:
    """Engine settings wide enough for the largest load (every stream a sequence slot);
    no grammar compiler is built in the background while first-audio times are measured."""
    return dict(
        device=device,
        max_num_seqs=max_streams + text_clients,
        max_num_batched_tokens=2048,
        enable_prefix_caching=False,
        preload_grammar=False,
    )


def gepard_target(options: dict[str, Any], tiny: bool = False) -> VoiceTarget:
    from mmserve.engine.factory import resolve_device, resolve_dtype
    from mmserve.models.registry import build_model
    from mmserve.models.tokenizer import Tokenizer

    cfg = dict(TINY_SHAPE if tiny else GEPARD_SHAPE)
    device = resolve_device(options.get("device", "auto"))
    dtype = resolve_dtype("auto", device)
    model = build_model(cfg, random_weights(cfg, dtype, device), dtype, str(device))
    config = EngineConfig(**{**options, "num_kv_blocks": options.get("num_kv_blocks", 8192)})
    tokenizer = Tokenizer(_audio_tokenizer(cfg["vocab_size"]))
    engine = LLMEngine(config, model, tokenizer, 2048, device, dtype)
    vocab = cfg["vocab_size"]

    def request(i: int, seconds: float) -> tuple[list[int], SamplingParams]:
        prompt = [(97 * i + 13 * j) % (vocab - 2) + 1 for j in range(PROMPT_TOKENS)]
        frames = max(1, round(seconds / GEPARD_FRAME_S))
        return prompt, SamplingParams(temperature=0, max_tokens=frames, ignore_eos=True)

    return VoiceTarget(
        "gepard-0.5b" + ("-tiny" if tiny else ""), engine, None, GEPARD_FRAME_S, 1, request
    )


def default_voice_target(options: dict[str, Any], voice_dir: str | None = None) -> VoiceTarget:
    """The shipped voice, or the voice in ``voice_dir``, with its audio stage."""
    from tts.engine import voice_engine
    from tts.registry import load

    voice = load(voice_dir)
    engine, stage = voice_engine(voice, **options)
    prompts = [voice.prompts(s)[0] for s in SENTENCES]

    def request(i: int, seconds: float) -> tuple[list[int], SamplingParams]:
        prompt = prompts[i % len(prompts)]
        return prompt, voice.sampling(prompt, seed=i)

    codec = stage.codec
    return VoiceTarget(
        voice.name if voice_dir else "default",
        engine,
        stage,
        codec.frame_duration,
        voice.layout.tokens_per_frame,
        request,
        codec.sample_rate,
    )


def random_weights(cfg: dict, dtype: torch.dtype, device: torch.device) -> dict[str, torch.Tensor]:
    """A Llama state dict of scaled normal weights, made on ``device``."""
    h, inter, vocab = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    hd = cfg["head_dim"]
    q, kv = cfg["num_attention_heads"] * hd, cfg["num_key_value_heads"] * hd
    shapes: dict[str, tuple[int, ...]] = {
        "model.embed_tokens.weight": (vocab, h),
        "model.norm.weight": (h,),
    }
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}"
        shapes |= {
            f"{p}.self_attn.q_proj.weight": (q, h),
            f"{p}.self_attn.k_proj.weight": (kv, h),
            f"{p}.self_attn.v_proj.weight": (kv, h),
            f"{p}.self_attn.o_proj.weight": (h, q),
            f"{p}.mlp.gate_proj.weight": (inter, h),
            f"{p}.mlp.up_proj.weight": (inter, h),
            f"{p}.mlp.down_proj.weight": (h, inter),
            f"{p}.input_layernorm.weight": (h,),
            f"{p}.post_attention_layernorm.weight": (h,),
        }
    g = torch.Generator(device=device).manual_seed(0)
    return {
        k: (
            torch.ones(s, device=device)
            if len(s) == 1
            else torch.randn(s, generator=g, device=device) * s[-1] ** -0.5
        ).to(dtype)
        for k, s in shapes.items()
    }


def _audio_tokenizer(vocab: int) -> Path:
    """A directory holding a word-level tokenizer of ``vocab`` special tokens (audio codes
    have no text), its eos token id 0."""
    from tts.phoneme_voice import special_tokens_json

    root = Path(tempfile.mkdtemp(prefix="mmserve-bench-voice-"))
    names = ["<eos>"] + [f"<a{i}>" for i in range(1, vocab)]
    (root / "tokenizer.json").write_text(special_tokens_json(names, "<eos>"))
    (root / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<eos>"}))
    return root
