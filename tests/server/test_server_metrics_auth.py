"""``/metrics`` is Prometheus text whose series move; ``--api-key`` guards HTTP and WS alike."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import openai
import pytest
import websockets
from conftest import API_KEY, chat_messages
from live_server import LiveServer
from prometheus_client.parser import text_string_to_metric_families


def _scrape(server: LiveServer) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    resp = httpx.get(f"{server.url}/metrics")
    assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/plain")
    samples = {}
    for family in text_string_to_metric_families(resp.text):
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples


def _value(samples: dict[Any, float], name: str, **labels: str) -> float:
    return sum(
        v
        for (n, lbl), v in samples.items()
        if n == name and all(dict(lbl).get(k) == val for k, val in labels.items())
    )


def test_metrics_parse_and_move(server: LiveServer, client: openai.OpenAI, model_name: str) -> None:
    before = _scrape(server)
    for name in (
        "mmserve_kv_blocks_used",
        "mmserve_kv_blocks_free",
        "mmserve_num_requests_waiting",
        "mmserve_num_requests_running",
        "mmserve_preemptions_total",
        "mmserve_prefix_cache_hit_tokens_total",
        "mmserve_spec_draft_tokens_total",
        "mmserve_spec_accepted_tokens_total",
        "mmserve_spec_guard_pauses_total",
        "mmserve_engine_steps_ahead_total",
        "mmserve_engine_steps_prelaunched_total",
        "mmserve_engine_ahead_admissions_total",
    ):
        assert any(n == name for n, _ in before), name
    assert _value(before, "mmserve_kv_blocks_free") > 0
    stream = client.chat.completions.create(
        model=model_name, messages=chat_messages("Hi"), max_tokens=6, temperature=0, stream=True
    )
    assert sum(1 for _ in stream) > 2
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=model_name, messages=[], max_tokens=2)
    after = _scrape(server)
    chat = "/v1/chat/completions"
    assert (
        _value(after, "mmserve_requests_total", endpoint=chat, status="200")
        == _value(before, "mmserve_requests_total", endpoint=chat, status="200") + 1
    )
    assert (
        _value(after, "mmserve_requests_total", endpoint=chat, status="400")
        == _value(before, "mmserve_requests_total", endpoint=chat, status="400") + 1
    )
    for counter in (
        "mmserve_prompt_tokens_total",
        "mmserve_generation_tokens_total",
        "mmserve_time_to_first_token_seconds_count",
        "mmserve_inter_token_latency_seconds_count",
        "mmserve_prefix_cache_query_tokens_total",
        "mmserve_engine_steps_total",
        "mmserve_engine_step_seqs_total",
        "mmserve_engine_prompt_steps_total",
    ):
        assert _value(after, counter) > _value(before, counter), counter

    # one request alone: one sequence a step
    def moved(name: str) -> float:
        return _value(after, name) - _value(before, name)

    steps, seqs = moved("mmserve_engine_steps_total"), moved("mmserve_engine_step_seqs_total")
    assert steps == seqs > 0


def test_api_key_guards_http(auth_server: LiveServer, model_name: str) -> None:
    url = auth_server.url
    assert httpx.get(f"{url}/health").status_code == 200
    for path in ("/v1/models", f"/v1/models/{model_name}", "/metrics"):
        resp = httpx.get(f"{url}{path}")
        assert resp.status_code == 401 and resp.json()["error"]["code"] == "invalid_api_key"
    wrong = openai.OpenAI(base_url=f"{url}/v1", api_key="sk-wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        wrong.chat.completions.create(model=model_name, messages=chat_messages("Hi"), max_tokens=2)
    right = openai.OpenAI(base_url=f"{url}/v1", api_key=API_KEY, max_retries=0)
    resp = right.chat.completions.create(
        model=model_name, messages=chat_messages("Hi"), max_tokens=2
    )
    assert resp.choices[0].message.content is not None


def test_api_key_guards_realtime(auth_server: LiveServer, model_name: str) -> None:
    def client(key: str) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(
            base_url=f"{auth_server.url}/v1",
            api_key=key,
            max_retries=0,
            websocket_base_url=f"{auth_server.ws_url}/v1",
        )

    async def run() -> None:
        with pytest.raises(websockets.InvalidStatus) as info:
            async with client("sk-wrong").realtime.connect(model=model_name):
                pass
        assert info.value.response.status_code == 401
        async with client(API_KEY).realtime.connect(model=model_name) as conn:
            assert (await conn.recv()).type == "session.created"
        url = f"{auth_server.ws_url}/v1/realtime?model={model_name}"
        protocols = ["realtime", f"openai-insecure-api-key.{API_KEY}"]
        async with websockets.connect(url, subprotocols=protocols) as ws:  # type: ignore[arg-type]
            assert ws.subprotocol == "realtime"
            assert "session.created" in await ws.recv()

    asyncio.run(run())
