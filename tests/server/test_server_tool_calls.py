"""Tool calls and reasoning through the live server's real route and parsers.

The model's text comes from a scripted source (``scripted_engine``) so the test
controls it; everything after the text — ``chat_output``, ``parsers.StreamParser``,
SSE, the ``openai`` SDK's streaming tool-call accumulation — is the real path.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import openai
import pytest
from live_server import LiveServer
from scripted_engine import ScriptedEngine

from mmserve.config import ServerConfig

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather in a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "get_time",
            "parameters": {"type": "object", "properties": {"tz": {"type": "string"}}},
        },
    },
]
REASONING = "The user wants weather and time; call both tools."
CALLS_TEXT = (
    f"<think>{REASONING}</think>\n\n"
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris, \\"FR\\""}}\n</tool_call>\n'
    '<tool_call>\n{"name": "get_time", "arguments": {"tz": "CET"}}\n</tool_call>'
)
PLAIN_TEXT = "<think>Easy.</think>The answer is <b>42</b>."


def script(prompt: str) -> str:
    return CALLS_TEXT if "weather" in prompt.split("<|im_start|>user")[-1] else PLAIN_TEXT


@pytest.fixture(scope="module")
def scripted_server(engine: Any) -> Iterator[LiveServer]:
    scripted = ScriptedEngine(engine.tokenizer, script)
    config = ServerConfig(
        host="127.0.0.1",
        port=0,
        log_level="warning",
        tool_call_parser="hermes",
        reasoning_parser="qwen3",
    )
    with LiveServer(scripted, config) as srv:
        yield srv


@pytest.fixture(scope="module")
def sdk(scripted_server: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{scripted_server.url}/v1", api_key="x", max_retries=0)


def _ask(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


def _expected_calls() -> list[tuple[str, dict[str, Any]]]:
    return [("get_weather", {"city": 'Paris, "FR"'}), ("get_time", {"tz": "CET"})]


def test_sdk_streaming_accumulates_parallel_tool_calls(sdk: openai.OpenAI) -> None:
    with sdk.chat.completions.stream(
        model="scripted", messages=_ask("weather and time?"), tools=TOOLS
    ) as stream:  # type: ignore[arg-type]
        kinds = {event.type for event in stream}
        final = stream.get_final_completion()
    assert "tool_calls.function.arguments.delta" in kinds
    choice = final.choices[0]
    assert choice.finish_reason == "tool_calls"
    calls = choice.message.tool_calls or []
    assert [(c.function.name, json.loads(c.function.arguments)) for c in calls] == _expected_calls()
    assert all(c.id and c.type == "function" for c in calls)
    assert len({c.id for c in calls}) == 2
    assert not choice.message.content


def test_streamed_deltas_match_the_non_streamed_message(sdk: openai.OpenAI) -> None:
    full = sdk.chat.completions.create(model="scripted", messages=_ask("weather?"), tools=TOOLS)  # type: ignore[arg-type]
    message = full.choices[0].message
    assert full.choices[0].finish_reason == "tool_calls"
    assert getattr(message, "reasoning_content", None) == REASONING
    assert [
        (c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls or []
    ] == _expected_calls()
    reasoning, args = "", {0: "", 1: ""}
    for chunk in sdk.chat.completions.create(
        model="scripted", messages=_ask("weather?"), tools=TOOLS, stream=True
    ):  # type: ignore[arg-type]
        for c in chunk.choices:
            reasoning += getattr(c.delta, "reasoning_content", None) or ""
            for call in c.delta.tool_calls or []:
                args[call.index] += (call.function.arguments if call.function else None) or ""
    assert reasoning == REASONING
    assert [json.loads(args[0]), json.loads(args[1])] == [a for _, a in _expected_calls()]


def test_reasoning_split_without_tools(sdk: openai.OpenAI) -> None:
    resp = sdk.chat.completions.create(model="scripted", messages=_ask("meaning of life?"))
    message = resp.choices[0].message
    assert message.content == "The answer is <b>42</b>."
    assert getattr(message, "reasoning_content", None) == "Easy."
    assert resp.choices[0].finish_reason == "stop" and not message.tool_calls


def test_tool_choice_none_leaves_calls_as_text(sdk: openai.OpenAI) -> None:
    resp = sdk.chat.completions.create(
        model="scripted",
        messages=_ask("weather?"),
        tools=TOOLS,  # type: ignore[arg-type]
        tool_choice="none",
    )
    message = resp.choices[0].message
    assert not message.tool_calls and "<tool_call>" in (message.content or "")
    assert resp.choices[0].finish_reason == "stop"
