"""``WS /v1/realtime`` driven by the ``openai`` SDK's realtime client (real model).

Every event the server sends is also validated strictly against the SDK's
``RealtimeServerEvent`` union, so a missing or mistyped field fails here.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import openai
import pytest
import websockets
from live_server import LiveServer, wait_for_idle
from openai.types.realtime import RealtimeServerEvent
from pydantic import TypeAdapter

SERVER_EVENT = TypeAdapter(RealtimeServerEvent)
USER_HI = {
    "type": "message",
    "role": "user",
    "content": [{"type": "input_text", "text": "Say hi to Bob."}],
}


def _client(server: LiveServer, api_key: str = "unused") -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(
        base_url=f"{server.url}/v1",
        api_key=api_key,
        websocket_base_url=f"{server.ws_url}/v1",
        max_retries=0,
    )


async def _recv(conn: Any) -> Any:
    raw = await asyncio.wait_for(conn.recv_bytes(), timeout=120)
    SERVER_EVENT.validate_json(raw)  # strict: every field has the SDK's type
    return conn.parse_event(raw)


async def _until(conn: Any, kind: str) -> list[Any]:
    events = []
    while True:
        event = await _recv(conn)
        events.append(event)
        if event.type == kind:
            return events


def test_text_conversation_over_two_responses(
    server: LiveServer, engine: Any, model_name: str
) -> None:
    async def run() -> None:
        async with _client(server).realtime.connect(model=model_name) as conn:
            created = await _recv(conn)
            assert created.type == "session.created" and created.session.model == model_name
            await conn.session.update(
                session={
                    "type": "realtime",
                    "output_modalities": ["text"],
                    "instructions": "Answer briefly.",
                }
            )
            updated = await _recv(conn)
            assert updated.type == "session.updated"
            assert updated.session.instructions == "Answer briefly."
            await conn.conversation.item.create(item=USER_HI)  # type: ignore[arg-type]
            added = await _until(conn, "conversation.item.done")
            assert [e.type for e in added] == [
                "conversation.item.created",
                "conversation.item.added",
                "conversation.item.done",
            ]
            user_item_id = added[0].item.id
            await conn.response.create(response={"max_output_tokens": 12})
            events = await _until(conn, "response.done")
            kinds = [e.type for e in events]
            assert kinds[:4] == [
                "response.created",
                "response.output_item.added",
                "conversation.item.added",
                "response.content_part.added",
            ]
            assert kinds[-5:] == [
                "response.output_text.done",
                "response.content_part.done",
                "response.output_item.done",
                "conversation.item.done",
                "response.done",
            ]
            deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
            text_done = next(e for e in events if e.type == "response.output_text.done")
            done = events[-1].response
            assert deltas and text_done.text == deltas
            assert done.status in ("completed", "incomplete")
            assert done.output[0].content[0].text == deltas
            assert 0 < done.usage.output_tokens <= 12
            first_input = done.usage.input_tokens
            # a second response on the same socket sees the first one in its context
            await conn.conversation.item.create(
                item={**USER_HI, "content": [{"type": "input_text", "text": "And to Alice?"}]}
            )  # type: ignore[arg-type]
            await _until(conn, "conversation.item.done")
            await conn.response.create(response={"max_output_tokens": 8})
            second = (await _until(conn, "response.done"))[-1].response
            assert second.usage.input_tokens > first_input + done.usage.output_tokens
            await conn.send({"type": "conversation.item.retrieve", "item_id": user_item_id})
            retrieved = await _recv(conn)
            assert retrieved.type == "conversation.item.retrieved"
            assert retrieved.item.content[0].text == "Say hi to Bob."

    before = engine.stats().kv_blocks_used
    asyncio.run(run())
    wait_for_idle(engine, before)


def test_ignore_eos_runs_to_the_token_limit(server: LiveServer, model_name: str) -> None:
    """mmserve's ``ignore_eos`` session field (as on chat completions): an answer runs to
    ``max_output_tokens`` and ends ``incomplete`` (what fixed-length benchmarks send);
    out of band, it adds nothing to the conversation."""

    async def run() -> None:
        async with _client(server).realtime.connect(model=model_name) as conn:
            await _recv(conn)
            await conn.send(
                {
                    "type": "session.update",
                    "session": {
                        "type": "realtime",
                        "output_modalities": ["text"],
                        "ignore_eos": True,
                    },
                }
            )
            assert (await _recv(conn)).type == "session.updated"
            await conn.send(
                {
                    "type": "response.create",
                    "response": {
                        "conversation": "none",
                        "input": [USER_HI],
                        "max_output_tokens": 24,
                    },
                }
            )
            events = await _until(conn, "response.done")
            done = events[-1].response
            assert done.usage.output_tokens == 24
            assert done.status == "incomplete"
            assert done.status_details.reason == "max_output_tokens"
            # out of band: the answer's item is the response's, never the conversation's
            assert not [e for e in events if e.type.startswith("conversation.item")]
            await conn.send({"type": "conversation.item.retrieve", "item_id": done.output[0].id})
            err = await _recv(conn)
            assert err.type == "error" and err.error.code == "item_not_found"

    asyncio.run(run())


def test_cancel_mid_response_frees_blocks(server: LiveServer, engine: Any, model_name: str) -> None:
    async def run() -> None:
        async with _client(server).realtime.connect(model=model_name) as conn:
            await _recv(conn)
            await conn.conversation.item.create(
                item={
                    **USER_HI,
                    "content": [  # type: ignore[arg-type]
                        {"type": "input_text", "text": "Write a long story about a dragon."}
                    ],
                }
            )
            await _until(conn, "conversation.item.done")
            await conn.response.create(response={"max_output_tokens": 400})
            await _until(conn, "response.output_text.delta")
            assert engine.stats().num_running == 1
            await conn.response.cancel()
            events = await _until(conn, "response.done")
            done = events[-1].response
            assert done.status == "cancelled"
            assert done.status_details.reason == "client_cancelled"
            assert done.usage.output_tokens < 400
            assert "response.output_item.done" in [e.type for e in events]
            await conn.response.cancel()  # nothing left to cancel: an error, socket stays open
            err = await _recv(conn)
            assert err.type == "error" and err.error.code == "response_cancel_not_active"
            await conn.response.create(response={"max_output_tokens": 4})
            assert (await _until(conn, "response.done"))[-1].response.status != "failed"

    before = engine.stats().kv_blocks_used
    asyncio.run(run())
    wait_for_idle(engine, before)


def test_cancel_right_after_create_ends_the_response_and_frees_the_session(
    server: LiveServer, engine: Any, model_name: str
) -> None:
    """A cancel sent with its create (barge-in, a double click) lands before the response's
    task has run: the response is still announced and ended, cancelled."""

    async def run() -> None:
        async with _client(server).realtime.connect(model=model_name) as conn:
            await _recv(conn)
            await conn.conversation.item.create(item=USER_HI)  # type: ignore[arg-type]
            await _until(conn, "conversation.item.done")
            for _ in range(3):
                await conn.send({"type": "response.create", "response": {"max_output_tokens": 50}})
                await conn.send({"type": "response.cancel"})
                events = await _until(conn, "response.done")
                kinds = [e.type for e in events]
                assert kinds[0] == "response.created" and "error" not in kinds, kinds
                assert events[-1].response.status == "cancelled"
            await conn.response.create(response={"max_output_tokens": 4})
            assert (await _until(conn, "response.done"))[-1].response.status != "failed"

    before = engine.stats().kv_blocks_used
    asyncio.run(run())
    wait_for_idle(engine, before)


def test_unsupported_and_malformed_events_get_errors(
    server: LiveServer, engine: Any, model_name: str
) -> None:
    async def run() -> None:
        async with _client(server).realtime.connect(model=model_name) as conn:
            await _recv(conn)
            await conn.input_audio_buffer.append(audio="AAAA")
            err = await _recv(conn)
            assert err.type == "error" and err.error.code == "unsupported_event"
            assert "input_audio_buffer.append" in err.error.message
            await conn.send(
                {
                    "type": "session.update",
                    "session": {  # type: ignore[typeddict-item]
                        "type": "realtime",
                        "output_modalities": ["audio"],
                    },
                }
            )
            assert (await _recv(conn)).error.code == "unsupported_modality"
            await conn.session.update(session={"type": "realtime", "instructions": "still here"})
            assert (await _recv(conn)).type == "session.updated"

        url = f"{server.ws_url}/v1/realtime?model={model_name}"
        async with websockets.connect(url) as ws:
            assert json.loads(await ws.recv())["type"] == "session.created"
            bad = [
                "not json",
                "[1, 2]",
                json.dumps({"type": "no.such.event"}),
                json.dumps({"type": "conversation.item.create", "item": {"type": "bogus"}}),
                json.dumps(
                    {
                        "type": "conversation.item.create",
                        "item": {
                            "type": "message",
                            "role": "user",
                            "content": [{"type": "input_image", "image_url": "data:,"}],
                        },
                    }
                ),
                json.dumps({"type": "conversation.item.delete", "item_id": "item_nope"}),
            ]
            for text in bad:
                await ws.send(text)
                event = json.loads(await ws.recv())
                SERVER_EVENT.validate_python(event)
                assert event["type"] == "error", (text, event)
            await ws.send(b"\x00binary")
            assert json.loads(await ws.recv())["error"]["code"] == "invalid_event"
            await ws.send(
                json.dumps({"type": "response.create", "response": {"max_output_tokens": 3}})
            )
            await ws.send(json.dumps({"type": "response.create"}))  # one at a time
            seen = []
            while "response.done" not in seen:
                seen.append(json.loads(await ws.recv())["type"])
            assert "error" in seen

    before = engine.stats().kv_blocks_used
    asyncio.run(run())
    wait_for_idle(engine, before)


def test_unknown_model_is_refused(server: LiveServer) -> None:
    async def run() -> dict[str, Any]:
        async with websockets.connect(f"{server.ws_url}/v1/realtime?model=gpt-9") as ws:
            event = json.loads(await ws.recv())
            with pytest.raises(websockets.ConnectionClosed):
                await ws.recv()
            return dict(event)

    event = asyncio.run(run())
    assert event["type"] == "error" and event["error"]["code"] == "model_not_found"


def test_socket_closed_mid_response_frees_blocks(
    server: LiveServer, engine: Any, model_name: str
) -> None:
    async def run() -> None:
        url = f"{server.ws_url}/v1/realtime?model={model_name}"
        async with websockets.connect(url) as ws:
            await ws.send(
                json.dumps(
                    {
                        "type": "conversation.item.create",
                        "item": {
                            **USER_HI,
                            "content": [{"type": "input_text", "text": "Tell a long story."}],
                        },
                    }
                )
            )
            await ws.send(
                json.dumps({"type": "response.create", "response": {"max_output_tokens": 400}})
            )
            while json.loads(await ws.recv())["type"] != "response.output_text.delta":
                pass
            assert engine.stats().num_running == 1

    before = engine.stats().kv_blocks_used
    asyncio.run(run())
    wait_for_idle(engine, before, timeout=10)


def test_conversation_longer_than_context_fails_the_response(
    server: LiveServer, engine: Any, model_name: str
) -> None:
    max_model_len = engine.max_model_len

    async def run() -> list[dict[str, Any]]:
        url = f"{server.ws_url}/v1/realtime?model={model_name}"
        async with websockets.connect(url) as ws:
            await ws.send(
                json.dumps(
                    {
                        "type": "conversation.item.create",
                        "item": {
                            **USER_HI,
                            "content": [{"type": "input_text", "text": "hi " * max_model_len}],
                        },
                    }
                )
            )
            await ws.send(json.dumps({"type": "response.create"}))
            events = []
            while not events or events[-1]["type"] != "response.done":
                events.append(json.loads(await ws.recv()))
                SERVER_EVENT.validate_python(events[-1])
            return events

    before = engine.stats().kv_blocks_used
    events = asyncio.run(run())
    error = next(e for e in events if e["type"] == "error")["error"]
    assert error["code"] == "context_length_exceeded"
    assert events[-1]["response"]["status"] == "failed"
    wait_for_idle(engine, before)
