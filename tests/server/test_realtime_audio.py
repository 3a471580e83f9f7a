"""Spoken answers on ``WS /v1/realtime``, driven by the ``openai`` SDK's realtime client.

The voice is a tiny random one of the default voice's kind (every output token a code:
each piece speaks exactly its ``max_tokens`` frames), so the audio a response must carry
is known from its transcript; the text side is a scripted engine that writes its answer
a few characters at a time, slowly, like a model: first audio must leave before the
answer is written. Every server event is validated strictly against the SDK's
``RealtimeServerEvent`` union.
"""

from __future__ import annotations

import asyncio
import base64
import time
from typing import Any

import httpx
import numpy as np
import openai
import pytest
from live_server import LiveServer
from openai.types.realtime import RealtimeServerEvent
from pydantic import TypeAdapter
from scripted_engine import ScriptedEngine

from mmserve.config import ServerConfig
from mmserve.models.tokenizer import Tokenizer

SERVER_EVENT = TypeAdapter(RealtimeServerEvent)
ANSWER = (
    "Sure, here it is. The capital of France is Paris, a city on the Seine, known for "
    "its museums, its bridges and its food. It has about two million people."
)
LONG = " ".join([ANSWER] * 6)
SHORT = "Sure, here it is. The capital of France is Paris."
FRAME = 480  # samples of a 20 ms frame at 24 kHz


class SlowScript(ScriptedEngine):
    """The scripted answer, one chunk every ``delay`` seconds (a model writing it)."""

    def __init__(self, tokenizer: Any, delay: float = 0.02) -> None:
        super().__init__(
            tokenizer,
            lambda prompt: (
                LONG
                if "long answer" in prompt
                else SHORT
                if "briefly" in prompt.lower()
                else ANSWER
            ),
        )
        self.delay = delay
        self.finished_at: float | None = None

    async def generate(self, *args: Any, **kwargs: Any):  # type: ignore[override]
        async for out in super().generate(*args, **kwargs):
            await asyncio.sleep(self.delay)
            if out.finished:
                self.finished_at = time.monotonic()
            yield out


@pytest.fixture(scope="module")
def speech(tmp_path_factory):
    from tts.random_voice import random_phoneme_voice
    from tts.service import SpeechService

    path = random_phoneme_voice(tmp_path_factory.mktemp("voice"))
    # FIFO: these tests are about the protocol; on a loaded CPU the deadline policy would
    # (rightly) refuse a stream while an earlier answer is still playing in its model of the
    # client (its scheduling has its own test; the page test runs it on a live server)
    svc = SpeechService.start(
        str(path), "cpu", max_num_seqs=8, kv_cache_memory_mb=32, audio_scheduling="fifo"
    )
    yield svc
    svc.shutdown()


@pytest.fixture(scope="module")
def text(default_model_dir) -> SlowScript:
    return SlowScript(Tokenizer(default_model_dir))


@pytest.fixture(scope="module")
def srv(speech, text):
    config = ServerConfig(host="127.0.0.1", port=0, log_level="warning")
    with LiveServer(text, config, speech=speech) as live:
        yield live


def _client(srv: LiveServer) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(
        base_url=f"{srv.url}/v1",
        api_key="unused",
        websocket_base_url=f"{srv.ws_url}/v1",
        max_retries=0,
    )


async def _recv(conn: Any) -> Any:
    raw = await asyncio.wait_for(conn.recv_bytes(), timeout=120)
    SERVER_EVENT.validate_json(raw)
    return conn.parse_event(raw)


async def _until(conn: Any, kind: str) -> list[Any]:
    events = []
    while True:
        events.append(await _recv(conn))
        if events[-1].type == kind:
            return events


async def _ask(conn: Any, question: str) -> None:
    await conn.conversation.item.create(
        item={
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": question}],
        }
    )
    await _until(conn, "conversation.item.done")


def _frames(speech: Any, text: str) -> int:
    return sum(speech.voice.sampling(p).max_tokens for p in speech.voice.prompts(text))


def _pcm(events: list[Any]) -> bytes:
    return b"".join(
        base64.b64decode(e.delta) for e in events if e.type == "response.output_audio.delta"
    )


def test_spoken_answer_events_audio_and_transcript(srv, speech, text) -> None:
    async def run() -> None:
        async with _client(srv).realtime.connect(model="scripted") as conn:
            created = await _recv(conn)
            assert created.session.output_modalities == ["audio"]  # a voice is loaded
            assert created.session.audio.output.format.rate == 24000
            await conn.session.update(
                session={
                    "type": "realtime",
                    "audio": {
                        "output": {"voice": "alloy", "format": {"type": "audio/pcm", "rate": 24000}}
                    },
                }
            )
            assert (await _recv(conn)).type == "session.updated"
            await _ask(conn, "What is the capital of France?")
            sent = time.monotonic()
            await conn.response.create()
            events, first_audio = [], None
            while not events or events[-1].type != "response.done":
                events.append(await _recv(conn))
                if first_audio is None and events[-1].type == "response.output_audio.delta":
                    first_audio = time.monotonic()
            kinds = [e.type for e in events]
            assert kinds[:4] == [
                "response.created",
                "response.output_item.added",
                "conversation.item.added",
                "response.content_part.added",
            ]
            assert kinds[-6:] == [
                "response.output_audio.done",
                "response.output_audio_transcript.done",
                "response.content_part.done",
                "response.output_item.done",
                "conversation.item.done",
                "response.done",
            ]
            assert "response.output_text.delta" not in kinds
            done = events[-1].response
            assert done.status == "completed" and done.output_modalities == ["audio"]
            transcript = "".join(
                e.delta for e in events if e.type == "response.output_audio_transcript.delta"
            )
            assert transcript == events[-5].transcript
            assert transcript.split() == ANSWER.split()
            assert done.output[0].content[0].transcript == transcript
            # every clause's audio, all of it: the voice's frames at 24 kHz, 16-bit
            from tts.text import ClauseStream

            clauses = ClauseStream().feed(ANSWER + " ")
            want = sum(_frames(speech, c) for c in clauses) * FRAME
            pcm = _pcm(events)
            assert len(pcm) == 2 * want
            assert np.abs(np.frombuffer(pcm, "<i2")).max() > 0
            # speaking while the answer is still being written
            assert first_audio is not None and text.finished_at is not None
            assert first_audio < text.finished_at, (first_audio - sent, text.finished_at - sent)

    asyncio.run(run())


def test_cancel_stops_the_audio_and_frees_the_voice(srv, speech) -> None:
    async def run() -> None:
        async with _client(srv).realtime.connect(model="scripted") as conn:
            await _recv(conn)
            await _ask(conn, "Please give a long answer.")
            await conn.response.create()
            await _until(conn, "response.output_audio.delta")
            await conn.response.cancel()
            after = await _until(conn, "response.done")
            assert after[-1].response.status == "cancelled"
            late_ms = len(_pcm(after)) / 2 / 24000 * 1000
            assert late_ms <= 400  # what was already on its way; the answer is ~30 s long
            full = _frames(speech, LONG) * FRAME / 24000 * 1000
            assert late_ms < full / 10
            for _ in range(200):  # the voice engine dropped the stream and its blocks
                if speech.engine.stats().num_running == 0:
                    break
                await asyncio.sleep(0.05)
            stats = speech.engine.stats()
            assert stats.num_running == 0 and stats.num_waiting == 0

    asyncio.run(run())


def test_truncate_cuts_the_stored_transcript_to_what_was_played(srv) -> None:
    async def run() -> None:
        async with _client(srv).realtime.connect(model="scripted") as conn:
            await _recv(conn)
            await _ask(conn, "What is the capital of France?")
            await conn.response.create()
            events = await _until(conn, "response.done")
            item = events[-1].response.output[0]
            total_ms = len(_pcm(events)) / 2 / 24000 * 1000
            await conn.send(
                {
                    "type": "conversation.item.truncate",
                    "item_id": item.id,
                    "content_index": 0,
                    "audio_end_ms": int(total_ms + 500),
                }
            )
            err = await _recv(conn)
            assert err.type == "error" and err.error.param == "audio_end_ms"
            await conn.conversation.item.truncate(
                item_id=item.id, content_index=0, audio_end_ms=int(total_ms / 2)
            )
            truncated = await _recv(conn)
            assert truncated.type == "conversation.item.truncated"
            assert truncated.audio_end_ms == int(total_ms / 2)
            await conn.conversation.item.retrieve(item_id=item.id)
            kept = (await _recv(conn)).item.content[0].transcript
            full = item.content[0].transcript.split()
            assert 0 < len(kept.split()) < len(full) and full[: len(kept.split())] == kept.split()

    asyncio.run(run())


def test_bad_audio_settings_are_errors_and_the_socket_stays_open(srv) -> None:
    async def run() -> None:
        async with _client(srv).realtime.connect(model="scripted") as conn:
            await _recv(conn)
            await conn.session.update(
                session={
                    "type": "realtime",
                    "audio": {"output": {"format": {"type": "audio/pcmu"}}},
                }
            )
            err = await _recv(conn)
            assert err.type == "error" and "audio/pcm" in err.error.message
            await conn.session.update(
                session={"type": "realtime", "audio": {"output": {"voice": "nobody"}}}
            )
            err = await _recv(conn)
            assert err.type == "error" and "alloy" in err.error.message
            await conn.session.update(session={"type": "realtime", "output_modalities": ["text"]})
            updated = await _recv(conn)
            assert updated.type == "session.updated"
            assert updated.session.output_modalities == ["text"]

    asyncio.run(run())


def _metrics(srv: LiveServer) -> dict[str, float]:
    """``name{labels}`` -> value of every sample /metrics exports."""
    from prometheus_client.parser import text_string_to_metric_families

    body = httpx.get(f"{srv.url}/metrics", timeout=30).text
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(body):
        for s in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()))
            out[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
    return out


def test_a_refused_stream_is_an_error_event_and_the_socket_stays_open(
    srv, speech, monkeypatch
) -> None:
    """The voice engine's admission control refuses a stream (its request ends
    ``overloaded`` before any audio): the client gets an ``error`` event saying so, the
    response fails, /metrics counts the refusal, and the socket serves the next response."""
    from mmserve.engine.outputs import RequestOutput

    async def overloaded(prompt: list[int], params: Any, request_id: str, **_: Any):
        yield RequestOutput(request_id, [], "", [], "", True, "overloaded", len(prompt))

    refused = 'mmserve_audio_streams_total{outcome="refused"}'
    before = _metrics(srv).get(refused, 0.0)

    async def run() -> None:
        async with _client(srv).realtime.connect(model="scripted") as conn:
            await _recv(conn)
            await _ask(conn, "Briefly: what is the capital of France?")
            monkeypatch.setattr(speech.engine, "generate", overloaded)
            await conn.response.create()
            events = await _until(conn, "response.done")
            monkeypatch.undo()
            errors = [e for e in events if e.type == "error"]
            assert len(errors) == 1 and "capacity" in errors[0].error.message
            assert events[-1].response.status == "failed"
            assert not _pcm(events)
            await conn.response.create()
            again = await _until(conn, "response.done")
            assert again[-1].response.status == "completed" and _pcm(again)

    asyncio.run(run())
    assert _metrics(srv)[refused] == before + 1


def test_metrics_report_spoken_answers(srv) -> None:
    """Time to first audio, per-stream real-time factor and worst gap, streams by outcome
    (the share with no underrun is ``no_underrun`` over the played ones), and the voice
    engine's admission refusals."""
    m = _metrics(srv)
    assert m["mmserve_time_to_first_audio_seconds_count"] >= 1
    played = m["mmserve_audio_stream_rtf_count"]
    assert played >= 1 and m["mmserve_audio_stream_worst_gap_seconds_count"] == played
    assert m["mmserve_audio_stream_rtf_sum"] > 0
    outcomes = [
        m.get(f'mmserve_audio_streams_total{{outcome="{o}"}}', 0.0)
        for o in ("no_underrun", "underrun")
    ]
    assert sum(outcomes) == played
    assert any(k.startswith("mmserve_audio_streams_refused_total") for k in m)


def test_voice_agent_demo_saves_the_spoken_answer(srv, tmp_path) -> None:
    import subprocess
    import sys
    import wave
    from pathlib import Path

    demo = Path(__file__).resolve().parents[2] / "demos" / "voice_agent.py"
    out = tmp_path / "answer.wav"
    done = subprocess.run(
        [
            sys.executable,
            str(demo),
            "--base-url",
            f"{srv.url}/v1",
            "--out",
            str(out),
            "What is the capital of France?",
        ],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ANSWER.split()  # the transcript, as it was spoken
    with wave.open(str(out)) as wav:
        assert wav.getframerate() == 24000 and wav.getnchannels() == 1
        assert wav.getnframes() > 24000  # seconds of speech
