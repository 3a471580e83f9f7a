"""``mmserve bench speech``: time to first audio and real-time factor through the engine.

For each voice and each stream count N: N requests arrive at once; the engine (CUDA graphs
on a GPU) generates their frames and the audio stage decodes them on the same device, as
``mmserve serve`` does. Per stream: time to first audio (arrival -> first PCM out of the
stage), and its real-time factor (arrival -> last PCM, over the audio's length; < 1 is
faster than real time); aggregate RTF is the wall time over all streams' audio. Also the
codec's share of the wall time, the codec alone at one frame a call and at the stage's
largest chunk (``--chunk-ms``: ms per frame, the overhead grouping saves), and the text
frontend's time for one sentence (espeak-ng phonemes, CPU), which a request pays before its
prompt reaches the engine. ``--chunk-ms 0`` decodes every frame as it completes (no
grouping), the baseline to compare against on the same machine.

Voices: ``default`` (the shipped voice), ``orpheus-3b`` (Orpheus's Llama-3.2-3B shape and
vocabulary, random bf16 weights, SNAC 24 kHz with random weights: speed does not depend on
values), ``orpheus-tiny`` (the same vocabulary and layout at a CPU size, narrow SNAC), or a
voice directory. Every stream has a prompt of its own (no prefix-cache hits between them).
So every stream speaks exactly ``--seconds`` of audio, each runs to a fixed token count
with the end token ignored, and every ``tokens_per_frame`` tokens count as one frame
(``ForcedLayout``: code = token % codebook): the work a real stream of that length costs,
whatever random weights say.

Writes ``speech.json`` and ``speech.png`` (TTFA and per-stream RTF against streams).
"""

from __future__ import annotations

import json
import platform
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from mmserve.engine.engine import LLMEngine
from tts.chunking import DEFAULT_MAX_CHUNK_S
from tts.layout import FrameLayout, FrameParser
from tts.stage import AudioRequest, AudioStage

ORPHEUS_3B = {
    "model_type": "llama",
    "hidden_size": 3072,
    "num_hidden_layers": 28,
    "num_attention_heads": 24,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "intermediate_size": 8192,
    "vocab_size": 156940,
    "tie_word_embeddings": True,
    "rms_norm_eps": 1e-5,
    "rope_theta": 500000.0,
    "max_position_embeddings": 8192,
}
# a CPU-sized stand-in of the same vocabulary and layout (the bench's own test runs it)
ORPHEUS_TINY = {
    **ORPHEUS_3B,
    "hidden_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 64,
    "intermediate_size": 256,
}
SENTENCE = "The quick brown fox jumps over the lazy dog, and then it runs away."


class ForcedLayout(FrameLayout):
    """Every ``tokens_per_frame`` tokens are a frame, codes = tokens % codebook."""

    def __init__(self, tokens_per_frame: int, codes_per_frame: int, codebook: int) -> None:
        self.tokens_per_frame, self.codes_per_frame = tokens_per_frame, codes_per_frame
        self.codebook = codebook

    def parser(self) -> FrameParser:
        return _Forced(self)

    def frame_tokens(self, frames: list[list[int]]) -> list[int]:
        """Each frame's codes, then zeros up to ``tokens_per_frame`` (which read back as
        that frame: only the first ``codes_per_frame`` tokens are codes)."""
        pad = [0] * (self.tokens_per_frame - self.codes_per_frame)
        return [t for frame in frames for t in (*frame, *pad)]


class _Forced(FrameParser):
    def __init__(self, lay: ForcedLayout) -> None:
        self.lay = lay
        self.buf: list[int] = []

    def feed(self, token_ids: list[int]) -> list[list[int]]:
        out = []
        for t in token_ids:
            self.buf.append(t % self.lay.codebook)
            if len(self.buf) == self.lay.tokens_per_frame:
                out.append(self.buf[: self.lay.codes_per_frame])
                self.buf = []
        return out


@dataclass
class Bench:
    name: str
    engine: LLMEngine
    stage: AudioStage
    prompts: list[list[int]]  # one a stream
    tokens_per_frame: int
    frontend_ms: float | None


def run_speech_bench(
    voices: list[str],
    streams: list[int],
    seconds: float,
    device: str,
    out_dir: str,
    chunk_ms: float = 1000 * DEFAULT_MAX_CHUNK_S,
) -> dict:
    dev = (
        "cuda"
        if device == "auto" and torch.cuda.is_available()
        else ("cpu" if device == "auto" else device)
    )
    result: dict[str, Any] = {
        "machine": _machine(dev),
        "seconds_per_stream": seconds,
        "chunk_ms": chunk_ms,
        "streams": streams,
        "voices": {},
    }
    for name in voices:
        bench = _build(name, dev, max(streams), chunk_ms / 1000)
        rows = {}
        _run(bench, 1, min(seconds, 1.0))  # warm-up: first launches, codec kernels
        for n in streams:
            _run(bench, n, min(seconds, 1.0))  # this count's first batch shapes, untimed
            rows[str(n)] = _run(bench, n, seconds)
            print(_line(name, n, rows[str(n)]), flush=True)
        chunk = bench.stage.policy.max_chunk_frames
        costs = {k: codec_costs(bench.stage.codec, [1, 8, max(streams)], k) for k in {1, chunk}}
        for k, by_batch in sorted(costs.items()):
            print(
                f"{name:<12} codec alone, {k} frame(s) a call: "
                + ", ".join(
                    f"b{b} {c['ms_per_call']:.2f} ms/call {c['ms_per_frame']:.2f} ms/frame "
                    f"({c['rtf']:.4f} RTF)"
                    for b, c in by_batch.items()
                ),
                flush=True,
            )
        result["voices"][name] = {
            "frontend_ms": bench.frontend_ms,
            "runs": rows,
            "codec_alone": costs[1],
            "codec_alone_chunked": {"frames_per_call": chunk, "batches": costs[chunk]},
            "tokens_per_frame": bench.tokens_per_frame,
            "frame_ms": 1000 * bench.stage.codec.frame_duration,
            "codec": type(bench.stage.codec).__name__,
        }
        del bench
        if dev == "cuda":
            torch.cuda.empty_cache()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "speech.json").write_text(json.dumps(result, indent=1))
    _plot(result, out / "speech.png")
    return result


def _run(b: Bench, n: int, seconds: float) -> dict:
    codec = b.stage.codec
    frames = max(1, round(seconds / codec.frame_duration))
    params = replace(_params(b), max_tokens=frames * b.tokens_per_frame)
    if b.engine.device.type == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    arrival: dict[str, float] = {}
    first: dict[str, float] = {}
    last: dict[str, float] = {}
    samples: dict[str, int] = {}
    for i in range(n):
        rid = f"bench-{time.monotonic_ns()}-{i}"
        b.engine.add_request(b.prompts[i % len(b.prompts)], params, rid)
        b.stage.open(rid, AudioRequest(seed=i))
        arrival[rid], samples[rid] = time.perf_counter(), 0
    codec_s = 0.0
    while b.engine.has_unfinished():
        outs = b.engine.step()
        c = time.perf_counter()
        b.stage.process(outs)
        now = time.perf_counter()
        codec_s += now - c
        for o in outs:
            if o.audio is not None and len(o.audio):
                first.setdefault(o.request_id, now)
                last[o.request_id] = now
                samples[o.request_id] += len(o.audio)
    wall = time.perf_counter() - t0
    rate = codec.sample_rate
    ttfa = [1000 * (first[r] - arrival[r]) for r in arrival]
    rtf = [(last[r] - arrival[r]) / (samples[r] / rate) for r in arrival]
    audio_s = sum(samples.values()) / rate
    return {
        "ttfa_ms_p50": _pct(ttfa, 50),
        "ttfa_ms_p99": _pct(ttfa, 99),
        "rtf_per_stream_p50": _pct(rtf, 50),
        "rtf_per_stream_max": max(rtf),
        "rtf_aggregate": wall / audio_s,
        "audio_s_per_stream": audio_s / n,
        "wall_s": wall,
        "codec_share": codec_s / wall,
    }


def codec_costs(
    codec, batches: list[int], frames_per_call: int = 1, steps: int = 8
) -> dict[str, dict]:
    """The codec alone, streaming ``frames_per_call`` frames a row a call at each batch
    size: ms a call, ms a frame, and the real-time factor (a frame's time over its
    duration). Where a codec can run is read from this (RTF < 1 at the batch a server
    needs), and what grouping frames saves (the per-call overhead)."""
    out = {}
    for b in sorted(set(batches)):
        state = codec.init_state(b)
        shape = (b, frames_per_call, codec.codes_per_frame)
        codes = torch.randint(0, codec.codebook_size, shape)
        codec.step(codes, state)  # warm-up
        if codec.device.type == "cuda":
            torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(steps):
            codec.step(codes, state).rows()
        ms = 1000 * (time.perf_counter() - t) / steps
        per_frame = ms / frames_per_call
        out[str(b)] = {
            "ms_per_call": ms,
            "ms_per_frame": per_frame,
            "rtf": per_frame / 1000 / codec.frame_duration,
        }
    return out


def _params(b: Bench):
    from mmserve.sampling_params import SamplingParams

    return SamplingParams(temperature=0.0, ignore_eos=True, detokenize=False)


def _pct(xs: list[float], q: float) -> float:
    return float(np.percentile(np.array(xs), q))


def _build(name: str, device: str, max_streams: int, chunk_s: float) -> Bench:
    if name in ("orpheus-3b", "orpheus-tiny"):
        return _orpheus(name, device, max_streams, chunk_s)
    from tts.engine import voice_engine
    from tts.registry import load
    from tts.text import phonemize

    voice = load(None if name == "default" else name)
    engine, stage = voice_engine(
        voice, device, chunk_s, max_num_seqs=max(32, max_streams), kv_cache_memory_mb=512
    )
    # one sentence each (the default voice speaks one a piece), distinct per stream
    prompts = [voice.prompts(f"{SENTENCE[:-1]} in stream {i}.")[0] for i in range(max_streams)]
    t = time.perf_counter()
    for _ in range(5):
        phonemize(SENTENCE)
    frontend = 1000 * (time.perf_counter() - t) / 5
    lay = voice.layout
    stage.layout = ForcedLayout(
        lay.tokens_per_frame, lay.codes_per_frame, stage.codec.codebook_size
    )
    return Bench(name, engine, stage, prompts, lay.tokens_per_frame, frontend)


def _orpheus(name: str, device: str, max_streams: int, chunk_s: float) -> Bench:
    """Orpheus's Llama shape with random weights made on the device, a tokenizer with its
    vocabulary, and a random SNAC 24 kHz (full width for the 3B, narrow for the tiny)."""
    import tempfile

    from mmserve.config import EngineConfig
    from mmserve.models.llama import hf_tensor_shapes
    from mmserve.models.registry import build_model
    from mmserve.models.tokenizer import Tokenizer
    from tts.orpheus import OrpheusVoice
    from tts.random_voice import orpheus_tokenizer_json, random_snac
    from tts.snac import SNACConfig

    shape = ORPHEUS_3B if name == "orpheus-3b" else ORPHEUS_TINY
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    g = torch.Generator(device=device).manual_seed(0)
    sd = {
        k: 0.02 * torch.randn(s, generator=g, device=device, dtype=dtype)
        for k, s in hf_tensor_shapes(shape).items()
    }
    model = build_model(shape, sd, dtype, device)
    del sd
    tmp = Path(tempfile.mkdtemp(prefix="orpheus-tok-"))
    (tmp / "tokenizer.json").write_text(orpheus_tokenizer_json())
    (tmp / "tokenizer_config.json").write_text(
        json.dumps({"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"})
    )
    (tmp / "config.json").write_text(json.dumps(shape))
    tok = Tokenizer(tmp)
    config = EngineConfig(
        device=device,
        max_num_seqs=max(32, max_streams),
        kv_cache_memory_mb=4096 if device == "cuda" else 512,
        preload_grammar=False,
    )  # nothing constrained; nothing beside the loop
    engine = LLMEngine(config, model, tok, 4096, torch.device(device), dtype)
    snac = SNACConfig() if name == "orpheus-3b" else SNACConfig(encoder_dim=4, decoder_dim=64)
    codec = random_snac(snac).to(device)
    stage = AudioStage(codec, ForcedLayout(7, 7, 4096), engine.sizes.max_num_seqs, chunk_s)
    voice = OrpheusVoice.__new__(OrpheusVoice)
    voice.tokenizer = tok
    rng = np.random.default_rng(0)
    prompts = []
    for _ in range(max_streams):  # the prompt's frame, around words of a stream's own
        p = voice.prompt(SENTENCE, "tara")
        prompts.append(p[:2] + rng.integers(1000, 100000, 20).tolist() + p[2:])
    return Bench(name, engine, stage, prompts, 7, None)


def _line(name: str, n: int, r: dict) -> str:
    return (
        f"{name:<12} streams {n:>3}: TTFA p50 {r['ttfa_ms_p50']:7.1f} ms "
        f"p99 {r['ttfa_ms_p99']:7.1f} ms | RTF/stream p50 {r['rtf_per_stream_p50']:.3f} "
        f"max {r['rtf_per_stream_max']:.3f} | aggregate {r['rtf_aggregate']:.4f} | "
        f"codec {100 * r['codec_share']:.0f}% of wall"
    )


def _machine(device: str) -> dict:
    info = {
        "device": device,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "cpu_threads": torch.get_num_threads(),
    }
    if device == "cuda":
        info["gpu"] = torch.cuda.get_device_name()
    return info


def _plot(result: dict, path: Path) -> None:
    """Two panels (TTFA p50, per-stream RTF p50 against streams), drawn with Pillow."""
    from PIL import Image, ImageDraw

    w, h, pad = 720, 300, 50
    img = Image.new("RGB", (w, h), "white")
    d = ImageDraw.Draw(img)
    colors = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd"]
    for panel, (key, title) in enumerate(
        (
            ("ttfa_ms_p50", "time to first audio p50 (ms)"),
            ("rtf_per_stream_p50", "RTF per stream p50"),
        )
    ):
        x0 = panel * w // 2 + pad
        x1 = (panel + 1) * w // 2 - 10
        vals = [r[key] for v in result["voices"].values() for r in v["runs"].values()]
        top = max(vals) * 1.1 if vals else 1.0
        d.rectangle([x0, 30, x1, h - pad], outline="black")
        d.text((x0, 10), title, fill="black")
        d.text((x0 - 45, 30), f"{top:.3g}", fill="black")
        streams = result["streams"]
        for c, (name, v) in enumerate(result["voices"].items()):
            pts = []
            for i, n in enumerate(streams):
                x = x0 + (x1 - x0) * (i + 0.5) / len(streams)
                y = (h - pad) - (h - pad - 30) * v["runs"][str(n)][key] / top
                pts.append((x, y))
                d.text((x - 5, h - pad + 5), str(n), fill="black")
            d.line(pts, fill=colors[c % 4], width=2)
            d.text((x0 + 5, 35 + 12 * c), name, fill=colors[c % 4])
    img.save(path)
