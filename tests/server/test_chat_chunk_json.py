"""The pre-encoded content chunk (``ChatContext.content_json``) is byte for byte the
pydantic model's JSON, and ``stream_chat`` gives the same events either way."""

from __future__ import annotations

import asyncio
import json

import pytest

from mmserve.engine.outputs import RequestOutput
from mmserve.server.chat_output import ChatContext, ParserSettings, stream_chat
from mmserve.server.protocol_out import ChatChunkChoice, ChatCompletionChunk
from mmserve.server.sse import sse_event

TEXTS = [
    "",
    "Hello",
    ' "quoted" \\ back',
    "tab\tnew\nline\r",
    "\x00\x01\x1f\x7f",
    "é中文🙂",
    "\u2028\u2029",
    "</script>",
    "a" * 300,
]


def _ctx(**kw) -> ChatContext:
    return ChatContext(
        request_id='chatcmpl-"x"',
        model="smol\\m",
        num_prompt_tokens=3,
        n=1,
        parser_settings=ParserSettings(),
        **kw,
    )


@pytest.mark.parametrize("text", TEXTS)
def test_content_json_is_the_models_json(text):
    ctx = _ctx()
    model = ChatCompletionChunk(
        id=ctx.request_id,
        created=ctx.created,
        model=ctx.model,
        choices=[ChatChunkChoice(index=2, delta={"content": text})],
    )
    assert ctx.content_json(2, text) == model.model_dump_json()
    assert sse_event(ctx.content_json(2, text)) == sse_event(model)


def _outputs(pieces: list[str]):
    async def gen():
        ids: list[int] = []
        for k, piece in enumerate(pieces):
            ids = [*ids, k]
            last = k == len(pieces) - 1
            yield (
                0,
                RequestOutput(
                    "r",
                    [k],
                    piece,
                    ids,
                    "".join(pieces[: k + 1]),
                    last,
                    "length" if last else None,
                    3,
                ),
            )

    return gen()


def test_stream_chat_events_parse_as_the_sdk_reads_them():
    async def go():
        ctx = _ctx(include_usage=True)
        return [sse_event(c) async for c in stream_chat(ctx, _outputs(["Hi", "", " there", "!"]))]

    events = [json.loads(e.removeprefix("data: ")) for e in asyncio.run(go())]
    assert events[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert [e["choices"][0]["delta"] for e in events[1:3]] == [
        {"content": "Hi"},
        {"content": " there"},
    ]
    assert events[3]["choices"][0]["delta"] == {"content": "!"}  # the last delta: the models
    assert events[4]["choices"][0]["finish_reason"] == "length"
    assert events[5]["choices"] == [] and events[5]["usage"]["completion_tokens"] == 4
    for e in events:
        ChatCompletionChunk.model_validate(e)  # every event is a valid chunk
