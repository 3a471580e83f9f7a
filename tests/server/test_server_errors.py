"""Bad input gets an OpenAI-shaped 4xx, leaks no KV blocks, and the server keeps serving."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import httpx
import openai
import pytest
from conftest import MAX_MODEL_LEN, chat_messages
from live_server import LiveServer, wait_for_idle

from mmserve.config import EngineConfig, ServerConfig

OK_MESSAGES = chat_messages("Hi")


def _assert_openai_error(resp: httpx.Response, status: int) -> dict[str, Any]:
    assert resp.status_code == status, resp.text
    body = resp.json()
    assert set(body) == {"error"}
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]
    return dict(body["error"])


BAD_CHAT_BODIES: list[tuple[str, Any, int, str | None]] = [
    ("empty messages", {"messages": []}, 400, "messages"),
    ("no messages", {"model": "x"}, 400, "messages"),
    ("messages not a list", {"messages": "hi"}, 400, "messages"),
    ("max_tokens a string", {"messages": OK_MESSAGES, "max_tokens": "5"}, 400, "max_tokens"),
    ("max_tokens negative", {"messages": OK_MESSAGES, "max_tokens": -1}, 400, "max_tokens"),
    ("max_tokens huge", {"messages": OK_MESSAGES, "max_tokens": 10**9}, 400, "max_tokens"),
    ("temperature too high", {"messages": OK_MESSAGES, "temperature": 7}, 400, "temperature"),
    ("temperature a bool", {"messages": OK_MESSAGES, "temperature": True}, 400, "temperature"),
    ("n zero", {"messages": OK_MESSAGES, "n": 0}, 400, "n"),
    ("bad role", {"messages": [{"role": "wizard", "content": "x"}]}, 400, "messages.0.role"),
    (
        "image part without an image",
        {
            "messages": [
                {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:,"}}]}
            ]
        },
        400,
        "messages.0.content.0",
    ),
    (
        "prompt longer than the context",
        {"messages": chat_messages("hello " * (MAX_MODEL_LEN + 50))},
        400,
        "messages",
    ),
    (
        "top_logprobs too many",
        {"messages": OK_MESSAGES, "logprobs": True, "top_logprobs": 50},
        400,
        "top_logprobs",
    ),
    (
        "top_logprobs without logprobs",
        {"messages": OK_MESSAGES, "top_logprobs": 3},
        400,
        "top_logprobs",
    ),
    (
        "tools on a server that parses no tool calls",  # auto would silently ignore them
        {
            "messages": OK_MESSAGES,
            "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}],
        },
        400,
        "tool_choice",
    ),
    (
        "stream_options without stream",
        {"messages": OK_MESSAGES, "stream_options": {"include_usage": True}},
        400,
        "stream_options",
    ),
]


@pytest.mark.parametrize(
    "body,status,param", [b[1:] for b in BAD_CHAT_BODIES], ids=[b[0] for b in BAD_CHAT_BODIES]
)
def test_bad_chat_request(
    server: LiveServer, engine: Any, body: Any, status: int, param: str | None
) -> None:
    before = engine.stats().kv_blocks_used
    resp = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=60)
    assert _assert_openai_error(resp, status)["param"] == param
    wait_for_idle(engine, before)


def test_invalid_json_and_unknown_model(server: LiveServer, client: openai.OpenAI) -> None:
    resp = httpx.post(
        f"{server.url}/v1/chat/completions",
        content=b'{"messages": [',
        headers={"content-type": "application/json"},
    )
    assert _assert_openai_error(resp, 400)["code"] == "invalid_json"
    with pytest.raises(openai.NotFoundError) as info:
        client.chat.completions.create(model="gpt-9", messages=OK_MESSAGES, max_tokens=2)
    assert info.value.code == "model_not_found"
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="gpt-9", messages=[], max_tokens=2)  # type: ignore[arg-type]


def test_bad_completion_requests(server: LiveServer, engine: Any) -> None:
    before = engine.stats().kv_blocks_used
    url = f"{server.url}/v1/completions"
    _assert_openai_error(httpx.post(url, json={"prompt": []}), 400)
    _assert_openai_error(httpx.post(url, json={"prompt": 5}), 400)
    _assert_openai_error(httpx.post(url, json={"prompt": "x " * 2 * MAX_MODEL_LEN}), 400)
    _assert_openai_error(httpx.post(url, json={"prompt": "x", "max_tokens": 0}), 400)
    echoed = {"prompt": "x", "echo": True, "logprobs": 1}  # needs the prompt's logprobs
    assert _assert_openai_error(httpx.post(url, json=echoed), 400)["param"] == "echo"
    wait_for_idle(engine, before)


def test_oversize_body_is_413(server: LiveServer) -> None:
    big = b'{"prompt": "' + b"a" * (9 * 1024 * 1024) + b'"}'
    resp = httpx.post(
        f"{server.url}/v1/completions",
        content=big,
        headers={"content-type": "application/json"},
        timeout=60,
    )
    assert _assert_openai_error(resp, 413)["code"] == "request_too_large"

    def chunks() -> Any:
        for _ in range(10):
            yield b"a" * (1024 * 1024)

    resp = httpx.post(f"{server.url}/v1/completions", content=chunks(), timeout=60)
    _assert_openai_error(resp, 413)


def test_client_disconnect_mid_stream_frees_blocks(server: LiveServer, engine: Any) -> None:
    before = engine.stats().kv_blocks_used
    body = {
        "messages": chat_messages("Write a long story about a dragon."),
        "max_tokens": 400,
        "temperature": 0,
        "stream": True,
    }
    with httpx.stream("POST", f"{server.url}/v1/chat/completions", json=body, timeout=60) as r:
        assert r.status_code == 200
        lines = r.iter_lines()
        for _ in range(3):
            assert next(lines).startswith("data: ")
            next(lines)  # blank separator
        assert engine.stats().num_running == 1
    wait_for_idle(engine, before)  # the request was aborted long before 400 tokens


def test_non_streaming_disconnect_frees_blocks(server: LiveServer, engine: Any) -> None:
    before = engine.stats().kv_blocks_used
    body = {"messages": chat_messages("Write a long story."), "max_tokens": 400, "temperature": 0}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=1.5)
    wait_for_idle(engine, before, timeout=10)


def test_server_still_serves_after_errors(client: openai.OpenAI, model_name: str) -> None:
    resp = client.chat.completions.create(model=model_name, messages=OK_MESSAGES, max_tokens=3)
    assert resp.choices[0].message.content is not None


def test_full_queue_answers_429() -> None:
    """One running slot and one waiting slot: the third concurrent request is refused."""
    from mmserve.engine.async_engine import AsyncEngine

    eng = AsyncEngine.from_config(
        EngineConfig(device="cpu", max_model_len=256, max_num_seqs=1, max_waiting=1)
    )
    body = {
        "messages": chat_messages("Tell me a story."),
        "max_tokens": 48,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
    }
    try:
        with LiveServer(eng, ServerConfig(host="127.0.0.1", port=0, log_level="warning")) as srv:
            url = f"{srv.url}/v1/chat/completions"

            async def run() -> tuple[int, int, httpx.Response]:
                async with httpx.AsyncClient(timeout=120) as http:

                    async def drain() -> int:
                        async with http.stream("POST", url, json=body) as r:
                            async for _ in r.aiter_lines():
                                pass
                            return r.status_code

                    running = asyncio.create_task(drain())
                    while eng.stats().num_running < 1:
                        await asyncio.sleep(0.01)
                    waiting = asyncio.create_task(drain())
                    while eng.stats().num_waiting < 1:
                        await asyncio.sleep(0.01)
                    refused = await http.post(url, json={**body, "stream": False})
                    return await running, await waiting, refused

            first, second, refused = asyncio.run(run())
            assert (first, second) == (200, 200)
            assert _assert_openai_error(refused, 429)["code"] == "rate_limit_exceeded"
            assert refused.headers["retry-after"] == "1"  # ServerConfig.retry_after_s
            sdk = openai.OpenAI(base_url=f"{srv.url}/v1", api_key="x", max_retries=0)
            with pytest.raises(openai.RateLimitError):
                _flood(sdk, eng, eng.model_name)
            wait_for_idle(eng, 0)
    finally:
        eng.shutdown_sync()


def _flood(sdk: openai.OpenAI, eng: Any, model: str) -> None:
    """Fill the one running and one waiting slot, then ask once more through the SDK."""

    def long_request() -> None:
        sdk.chat.completions.create(
            model=model, messages=OK_MESSAGES, max_tokens=48, extra_body={"ignore_eos": True}
        )

    threads = [threading.Thread(target=long_request, daemon=True)]
    threads[0].start()
    while eng.stats().num_running < 1:
        time.sleep(0.01)
    threads.append(threading.Thread(target=long_request, daemon=True))
    threads[1].start()
    while eng.stats().num_waiting < 1:
        time.sleep(0.01)
    try:
        sdk.chat.completions.create(model=model, messages=OK_MESSAGES, max_tokens=2)
    finally:
        for t in threads:
            t.join(timeout=120)
