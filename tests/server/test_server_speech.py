"""``POST /v1/audio/speech`` through the ``openai`` SDK against a live server.

The voice is a tiny random one of the default voice's kind (espeak-ng phonemes in, codec
frames out, at most one frame a phoneme plus 25): what is checked here is the API, not
how the voice sounds (the default voice's quality has its own report). The text side of
the app is a scripted engine; it is not used.
"""

from __future__ import annotations

import base64
import io
import json
import time

import httpx
import numpy as np
import openai
import pytest
import soundfile
import torch
from live_server import LiveServer
from scripted_engine import ScriptedEngine

from mmserve.config import ServerConfig
from mmserve.models.tokenizer import Tokenizer
from tts.random_voice import random_phoneme_voice
from tts.service import SpeechService

RATE = 24000


@pytest.fixture(scope="module")
def speech(tmp_path_factory):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a tiny voice: a second intra-op thread only costs
    path = random_phoneme_voice(tmp_path_factory.mktemp("voice"))
    svc = SpeechService.start(str(path), "cpu", max_num_seqs=8, kv_cache_memory_mb=32)
    yield svc, path
    svc.shutdown()
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def srv(speech):
    svc, path = speech
    text = ScriptedEngine(Tokenizer(path), lambda prompt: "")
    config = ServerConfig(host="127.0.0.1", port=0, log_level="warning")
    with LiveServer(text, config, speech=svc) as live:
        yield live


@pytest.fixture(scope="module")
def client(srv) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{srv.url}/v1", api_key="unused", max_retries=0, timeout=120)


def _frames_for(speech, text: str) -> int:
    """Frames the random voice speaks for ``text``: every token is a code, to max_tokens."""
    svc, _ = speech
    return sum(svc.voice.sampling(p).max_tokens for p in svc.voice.prompts(text))


def test_wav_reads_back_at_24khz(client, speech):
    out = client.audio.speech.create(
        model="tts-1", voice="alloy", input="Hello there.", response_format="wav"
    )
    audio, rate = soundfile.read(io.BytesIO(out.content), dtype="float32")
    assert rate == RATE and audio.ndim == 1
    assert len(audio) == _frames_for(speech, "Hello there.") * 480


def test_streamed_pcm_and_flac_carry_the_same_audio(client, speech):
    with client.audio.speech.with_streaming_response.create(
        model="gpt-4o-mini-tts", voice="nova", input="Hello there.", response_format="pcm"
    ) as resp:
        chunks = [c for c in resp.iter_bytes()]
    pcm = np.frombuffer(b"".join(chunks), "<i2").astype(np.float32) / 32767
    flac = client.audio.speech.create(
        model="tts-1", voice="default", input="Hello there.", response_format="flac"
    )
    audio, rate = soundfile.read(io.BytesIO(flac.content), dtype="float32")
    assert rate == RATE and len(audio) == len(pcm) > 0
    assert np.abs(audio - pcm).max() < 2 / 32767


def test_sse_deltas_then_done(client, srv):
    with httpx.stream(
        "POST",
        f"{srv.url}/v1/audio/speech",
        timeout=120,
        json={
            "model": "tts-1",
            "voice": "echo",
            "input": "One. Two.",
            "response_format": "pcm",
            "stream_format": "sse",
        },
    ) as resp:
        assert resp.status_code == 200
        assert resp.headers["content-type"].startswith("text/event-stream")
        events = [json.loads(line[6:]) for line in resp.iter_lines() if line.startswith("data: ")]
    deltas = [e for e in events if e["type"] == "speech.audio.delta"]
    assert deltas and events[-1]["type"] == "speech.audio.done"
    assert events[-1]["usage"]["output_tokens"] > 0
    assert sum(len(base64.b64decode(d["audio"])) for d in deltas) % 2 == 0


def test_speed_changes_the_length(client):
    def seconds(speed: float) -> float:
        out = client.audio.speech.create(
            model="tts-1", voice="alloy", input="Hello there.", response_format="wav", speed=speed
        )
        audio, rate = soundfile.read(io.BytesIO(out.content))
        return len(audio) / rate

    normal, fast = seconds(1.0), seconds(2.0)
    assert abs(fast / normal - 0.5) < 0.05


@pytest.mark.parametrize(
    "body, param, allowed",
    [
        ({"voice": "nobody"}, "voice", "alloy"),
        ({"input": ""}, "input", "empty"),
        ({"input": "   "}, "input", "empty"),
        ({"input": "a" * 4097}, "input", "4096"),
        ({"response_format": "mp3"}, "response_format", "wav, pcm, flac"),
        ({"stream_format": "chunks"}, "stream_format", "audio, sse"),
        ({"speed": 9.0}, "speed", "0.25"),
        ({"model": "whisper-1"}, "model", "tts-1"),
    ],
)
def test_bad_input_is_a_400_that_says_what_is_allowed(client, body, param, allowed):
    args = {"model": "tts-1", "voice": "alloy", "input": "Hello.", **body}
    with pytest.raises(openai.BadRequestError) as err:
        client.audio.speech.create(**args)
    assert err.value.status_code == 400
    assert err.value.body["param"] == param and allowed in err.value.body["message"]


def test_disconnect_frees_blocks_and_codec_slots(srv, speech):
    svc, _ = speech
    long_text = " ".join(["This sentence keeps the voice busy for a while."] * 12)
    before = svc.engine.engine.generation_tokens_total
    with httpx.stream(
        "POST",
        f"{srv.url}/v1/audio/speech",
        timeout=120,
        json={"model": "tts-1", "voice": "alloy", "input": long_text, "response_format": "pcm"},
    ) as resp:
        first = next(resp.iter_bytes())
        assert first
    engine, stage = svc.engine.engine, svc.engine.stage
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        stats = engine.stats()
        if (
            stats.num_running == stats.num_waiting == stats.kv_blocks_used == 0
            and stage.slots.num_free == stage.slots.capacity
            and not stage.streams
        ):
            break
        time.sleep(0.05)
    else:
        raise AssertionError(f"not freed: {engine.stats()}, {stage.slots.num_free} slots free")
    whole = _frames_for(speech, long_text)  # what speaking it all would have taken
    assert engine.generation_tokens_total - before < whole / 2
