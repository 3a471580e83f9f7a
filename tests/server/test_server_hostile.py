"""Hostile input against a live server: each case is an input that once hurt it (issue 52).

Every answer must be an OpenAI-shaped 4xx (or a Realtime ``error`` event) naming the
parameter and the server limit, the server must keep serving, and no KV block leaks.
One server (the session's engine, tight connection timeouts) serves the module.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from conftest import chat_messages
from live_server import LiveServer, guarded_config, wait_for_idle
from websockets.sync.client import connect as ws_connect

MAX_CONNECTIONS = 12
SEVEN_MB = "x" * (7 << 20)


@pytest.fixture(scope="module")
def hostile(engine: Any) -> Iterator[LiveServer]:
    config = guarded_config(MAX_CONNECTIONS, realtime_max_items=4, max_prompt_bytes=256 << 10)
    with LiveServer(engine, config) as srv:
        yield srv


@pytest.fixture(scope="module")
def http(hostile: LiveServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=hostile.url, timeout=120) as client:
        yield client


def _error(resp: httpx.Response, status: int = 400) -> dict[str, Any]:
    assert resp.status_code == status, resp.text
    err = resp.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    return dict(err)


def _chat(**fields: Any) -> dict[str, Any]:
    return {"messages": chat_messages("Hi"), "max_tokens": 2, "temperature": 0, **fields}


def test_megabyte_stop_string_is_refused_by_its_limit(http: httpx.Client) -> None:
    err = _error(http.post("/v1/chat/completions", json=_chat(stop=["a" * 1_000_000])))
    assert err["param"] == "stop" and "max_stop_str_chars" in err["message"]
    err = _error(http.post("/v1/completions", json={"prompt": "Hi", "stop": list("abcde")}))
    assert err["param"] == "stop" and "max_stop_strings" in err["message"]
    ok = http.post("/v1/chat/completions", json=_chat(stop=["a" * 1024, "b" * 1024]))
    assert ok.status_code == 200, ok.text


@pytest.mark.parametrize(
    "route,body,param",
    [
        (
            "/v1/chat/completions",
            '{"messages":[{"role":"user","content":"\\ud800"}]}',
            "messages.0.content",
        ),
        (
            "/v1/chat/completions",
            '{"messages":[{"role":"user","content":[{"type":"text","text":"a\\udfff"}]}]}',
            "messages.0.content.0.text",
        ),
        ("/v1/completions", '{"prompt":"hi \\ud800"}', "prompt"),
        ("/v1/completions", '{"prompt":["ok","\\ud83d"]}', "prompt.1"),
    ],
    ids=["chat-string", "chat-part", "completion", "completion-list"],
)
def test_lone_surrogate_is_400(http: httpx.Client, route: str, body: str, param: str) -> None:
    resp = http.post(route, content=body, headers={"content-type": "application/json"})
    err = _error(resp)
    assert (err["param"], err["code"]) == (param, "invalid_unicode")


@pytest.mark.parametrize(
    "body,param,code",
    [
        ({"prompt": [-1]}, "prompt", "invalid_token_id"),
        ({"prompt": [[5, 49152]]}, "prompt", "invalid_token_id"),
        ({"prompt": [9223372036854775808]}, "prompt.0", "integer_out_of_range"),
        ({"prompt": "Hi", "seed": 2**70}, "seed", "integer_out_of_range"),
        ({"prompt": "Hi", "seed": 2**63 - 1}, "seed", "invalid_request_error"),
        ({"prompt": "Hi", "top_k": -(2**64)}, "top_k", "integer_out_of_range"),
        (
            {"prompt": "Hi", "min_tokens": 2, "stop_token_ids": [9931234]},
            None,
            "invalid_request_error",
        ),  # found by the fuzzer: it failed the whole engine step
    ],
    ids=[
        "negative-id",
        "id-past-vocab",
        "id-past-int64",
        "seed-2**70",
        "seed-past-n",
        "top_k",
        "stop-token-id-past-vocab",
    ],
)
def test_out_of_range_integers_are_400(
    http: httpx.Client, body: dict[str, Any], param: str, code: str
) -> None:
    err = _error(http.post("/v1/completions", json={"max_tokens": 2, **body}))
    assert (err["param"], err["code"]) == (param, code), err


def test_huge_prompts_are_refused_before_tokenizing(http: httpx.Client) -> None:
    big = "word " * (1_500_000)  # 7.5 MB, under the 8 MiB body limit
    for route, body, param in (
        ("/v1/chat/completions", {"messages": chat_messages(big)}, "messages"),
        ("/v1/completions", {"prompt": big}, "prompt"),
    ):
        err = _error(http.post(route, json=body))
        assert (err["param"], err["code"]) == (param, "prompt_too_large")
        assert "max_prompt_bytes" in err["message"]
    assert http.get("/health").status_code == 200


def test_request_that_can_never_fit_the_queue_is_400(http: httpx.Client, engine: Any) -> None:
    prompts = [f"prompt {i}" for i in range(20)]  # 20 x 16 = 320 > the queue's 64
    err = _error(http.post("/v1/completions", json={"prompt": prompts, "n": 16, "max_tokens": 1}))
    assert err["code"] == "request_too_large" and "max_waiting" in err["message"]
    assert engine.stats().num_waiting == 0


def test_json_nested_2000_deep(http: httpx.Client, hostile: LiveServer) -> None:
    deep = '{"messages":' + "[" * 2000 + "]" * 2000 + "}"
    resp = http.post(
        "/v1/chat/completions", content=deep, headers={"content-type": "application/json"}
    )
    assert _error(resp)["code"] == "json_too_deep"
    tool = {"type": "function", "function": {"name": "f", "parameters": {}}}
    node: dict[str, Any] = tool["function"]["parameters"]  # type: ignore[index]
    for _ in range(100):  # under Python's recursion limit, over max_json_depth
        node["x"] = {}
        node = node["x"]
    err = _error(http.post("/v1/chat/completions", json=_chat(tools=[tool])))
    assert err["code"] == "json_too_deep" and "max_json_depth" in err["message"]
    with ws_connect(f"{hostile.ws_url}/v1/realtime") as ws:
        assert json.loads(ws.recv(timeout=30))["type"] == "session.created"
        ws.send('{"type":' + "[" * 2000 + "]" * 2000 + "}")
        assert json.loads(ws.recv(timeout=30))["error"]["code"] == "json_too_deep"
        ws.send(
            '{"type": "conversation.item.create", "item": {"type": "message", "role": '
            '"user", "content": [{"type": "input_text", "text": "x\\ud800"}]}}'
        )
        assert json.loads(ws.recv(timeout=30))["error"]["code"] == "invalid_unicode"
        ws.send(json.dumps({"type": "response.create", "response": {"max_output_tokens": 0}}))
        err = json.loads(ws.recv(timeout=30))["error"]
        assert err["param"] == "response.max_output_tokens", err


def _item(text: str) -> str:
    return json.dumps(
        {
            "type": "conversation.item.create",
            "item": {
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": text}],
            },
        }
    )


def _next_of(ws: Any, kinds: tuple[str, ...]) -> dict[str, Any]:
    while True:
        event = json.loads(ws.recv(timeout=120))
        if event["type"] in kinds:
            return dict(event)


def test_realtime_conversation_is_capped(hostile: LiveServer, engine: Any) -> None:
    before = engine.stats().kv_blocks_used
    with ws_connect(f"{hostile.ws_url}/v1/realtime", max_size=None) as ws:
        for _ in range(3):  # the original attack: 7 MB items (under the frame limit)
            ws.send(_item(SEVEN_MB))
            err = _next_of(ws, ("error", "conversation.item.created"))
            assert err["type"] == "error" and err["error"]["code"] == "conversation_too_large"
            assert "realtime_max_bytes" in err["error"]["message"]
        for i in range(4):
            ws.send(_item(f"item {i}"))
            _next_of(ws, ("conversation.item.done",))
        ws.send(_item("one too many"))
        err = _next_of(ws, ("error", "conversation.item.created"))
        assert err["error"]["code"] == "conversation_full"
        assert "realtime_max_items" in err["error"]["message"]
        out_of_band = [json.loads(_item("y" * (300 << 10)))["item"]]  # > max_prompt_bytes
        ws.send(
            json.dumps(
                {
                    "type": "response.create",
                    "response": {"conversation": "none", "input": out_of_band},
                }
            )
        )
        err = _next_of(ws, ("error", "response.created"))
        assert err["error"]["code"] == "prompt_too_large"
        ws.send(json.dumps({"type": "response.create", "response": {"max_output_tokens": 2}}))
        done = _next_of(ws, ("response.done",))
        assert done["response"]["status"] in ("completed", "incomplete")
    wait_for_idle(engine, before)


def _partial(server: LiveServer, data: bytes) -> socket.socket:
    sock = socket.create_connection((server.host, server.port), timeout=30)
    sock.sendall(data)
    return sock


def _read_all(sock: socket.socket) -> bytes:
    chunks = []
    while chunk := sock.recv(4096):
        chunks.append(chunk)
    return b"".join(chunks)


def test_slow_headers_and_bodies_are_cut_off(hostile: LiveServer, http: httpx.Client) -> None:
    with _partial(hostile, b"GET /health HTTP/1.1\r\nHost: x\r\n") as sock:
        reply = _read_all(sock)  # the server closes it: header_timeout_s
    assert reply.startswith(b"HTTP/1.1 408") and b"header_timeout_s" in reply
    head = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\n"
    with _partial(hostile, head + b'content-length: 100\r\n\r\n{"prompt"') as sock:
        assert _read_all(sock) == b""  # closed without an answer: body_timeout_s
    held = [_partial(hostile, b"GET /health HTTP/1.1\r\n") for _ in range(3 * MAX_CONNECTIONS)]
    try:  # more slow connections than max_connections: the oldest make room
        assert httpx.get(f"{hostile.url}/health", timeout=30).status_code == 200
    finally:
        for sock in held:
            sock.close()
    assert httpx.get(f"{hostile.url}/health", timeout=30).status_code == 200
