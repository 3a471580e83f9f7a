"""Structured output and tool_choice through the ``openai`` SDK, on a live server running
the real default model with speculation on (n-gram drafts) and hermes tool parsing:
Pydantic models round-trip through ``chat.completions.parse``, concurrent constrained
requests all validate, tool_choice required/named always yields a parsed call of the
right tool, and fields mmserve does not implement are 400s naming them."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from enum import StrEnum
from typing import Any

import httpx
import jsonschema
import openai
import pytest
from live_server import LiveServer
from pydantic import BaseModel, Field

from mmserve.config import EngineConfig, ServerConfig


class Pet(StrEnum):
    cat = "cat"
    dog = "dog"


class Address(BaseModel):
    city: str = Field(max_length=12)
    zip: int


class Person(BaseModel):
    name: str = Field(max_length=12)
    age: int
    height_m: float
    pet: Pet
    hobbies: list[str] = Field(max_length=2)
    address: Address
    nickname: str | None = Field(max_length=8)


class Verdict(BaseModel):
    label: Pet
    sure: bool


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 12},
                "unit": {"enum": ["c", "f"]},
            },
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
ADD = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two integers",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
            "additionalProperties": False,
        },
    },
}
TOOLS = [WEATHER, ADD]
MODEL = "smollm2-135m-instruct"


@pytest.fixture(scope="module")
def server() -> Iterator[LiveServer]:
    from mmserve.engine.async_engine import AsyncEngine

    engine = AsyncEngine.from_config(
        EngineConfig(
            device="cpu",
            max_model_len=512,
            max_num_seqs=8,
            speculative_config={"method": "ngram", "num_speculative_tokens": 3},
        )
    )
    config = ServerConfig(host="127.0.0.1", port=0, log_level="warning", tool_call_parser="hermes")
    try:
        with LiveServer(engine, config) as srv:
            yield srv
    finally:
        engine.shutdown_sync()


@pytest.fixture(scope="module")
def sdk(server: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0, timeout=300)


def _ask(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


def test_parse_round_trips_a_nested_pydantic_model(sdk):
    out = sdk.chat.completions.parse(
        model=MODEL,
        messages=_ask("Invent a person, with address, as JSON."),
        response_format=Person,
        temperature=0,
        max_tokens=150,
    )
    choice = out.choices[0]
    assert choice.finish_reason == "stop", choice.message.content
    assert isinstance(choice.message.parsed, Person)
    assert Person.model_validate_json(choice.message.content or "") == choice.message.parsed


def test_concurrent_constrained_requests_all_validate(sdk):
    """Four at once (a batch of constrained rows with speculation drafting), sampled:
    every output that stops is a valid document; none stops unparsable."""
    schema = Verdict.model_json_schema()

    def one(i: int) -> Any:
        return sdk.chat.completions.create(
            model=MODEL,
            messages=_ask(f"Is animal #{i} a cat or a dog? Answer in JSON."),
            temperature=1.0,
            seed=i,
            max_tokens=40,
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "verdict", "schema": schema, "strict": True},
            },
        )

    with ThreadPoolExecutor(4) as pool:
        outs = list(pool.map(one, range(4)))
    for out in outs:
        c = out.choices[0]
        assert c.finish_reason == "stop", c.message.content
        jsonschema.validate(json.loads(c.message.content or ""), schema)


def test_structured_outputs_regex_choice_and_json_object(sdk):
    def ask(extra: dict[str, Any], text: str) -> str:
        out = sdk.chat.completions.create(
            model=MODEL, messages=_ask(text), temperature=0, max_tokens=40, extra_body=extra
        )
        assert out.choices[0].finish_reason == "stop"
        return out.choices[0].message.content or ""

    assert re.fullmatch(
        r"\d{3}-\d{4}",
        ask({"structured_outputs": {"regex": r"\d{3}-\d{4}"}}, "Give a phone number."),
    )
    assert ask({"structured_outputs": {"choice": ["yes", "no"]}}, "Is water wet?") in ("yes", "no")
    obj = sdk.chat.completions.create(
        model=MODEL,
        messages=_ask("A JSON object with a colour."),
        temperature=0,
        max_tokens=60,
        response_format={"type": "json_object"},
    )
    if obj.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(obj.choices[0].message.content or ""), dict)
    else:
        assert obj.choices[0].finish_reason == "length"


def _stream_calls(sdk, **kw) -> tuple[list[dict[str, Any]], str | None]:
    calls: dict[int, dict[str, Any]] = {}
    finish = None
    for chunk in sdk.chat.completions.create(
        model=MODEL, stream=True, temperature=0, max_tokens=80, tools=TOOLS, **kw
    ):
        ch = chunk.choices[0]
        finish = ch.finish_reason or finish
        for d in ch.delta.tool_calls or []:
            c = calls.setdefault(d.index, {"name": "", "arguments": ""})
            c["name"] += d.function.name or ""
            c["arguments"] += d.function.arguments or ""
    return [calls[i] for i in sorted(calls)], finish


def test_tool_choice_required_and_named_yield_valid_calls(sdk):
    for choice, tool in (
        ("required", None),
        ({"type": "function", "function": {"name": "add"}}, ADD),
    ):
        calls, finish = _stream_calls(
            sdk, messages=_ask("What is 2 plus 3?"), tool_choice=choice, parallel_tool_calls=False
        )
        assert finish == "tool_calls" and len(calls) == 1
        by_name = {t["function"]["name"]: t for t in TOOLS}
        chosen = tool or by_name[calls[0]["name"]]
        assert calls[0]["name"] == chosen["function"]["name"]
        jsonschema.validate(json.loads(calls[0]["arguments"]), chosen["function"]["parameters"])


def test_unsupported_fields_and_bad_constraints_are_400s(server, sdk):
    def post(body: dict[str, Any]) -> httpx.Response:
        return httpx.post(
            f"{server.url}/v1/chat/completions",
            timeout=60,
            json={"messages": _ask("hi"), "max_tokens": 2, **body},
        )

    for field, value in (
        ("best_of", 3),
        ("prompt_logprobs", 1),
        ("guided_json", {"type": "object"}),
        ("repetition_penalty", 1.2),
        ("chat_template", "{{ messages }}"),
        ("chat_template_kwargs", {"enable_thinking": False}),
        ("add_generation_prompt", False),
        ("continue_final_message", True),
        ("echo", True),
        ("reasoning_effort", "low"),
        ("modalities", ["text", "audio"]),
    ):
        r = post({field: value})
        assert r.status_code == 400 and r.json()["error"]["param"] == field, r.text
    for neutral in (
        {"best_of": 1},
        {"add_generation_prompt": True},  # ask nothing new
        {"modalities": ["text"]},
        {"echo": False},
        {"store": True},
    ):
        assert post(neutral).status_code == 200, neutral
    r = post(
        {
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "x", "schema": {"type": "nonsense"}},
            }
        }
    )
    assert r.status_code == 400 and "Unsupported type" in r.json()["error"]["message"]
    r = post({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}})
    assert r.status_code == 400 and r.json()["error"]["param"] == "tool_choice"
    r = post({"structured_outputs": {"regex": "a+", "choice": ["a"]}})
    assert r.status_code == 400


def test_logit_bias_through_the_sdk_moves_and_bans_the_pick(sdk, default_model_dir):
    from mmserve.models.tokenizer import Tokenizer

    tok = Tokenizer(default_model_dir)
    target = tok.encode(" banana")[0]

    def first(**kw: Any) -> list[int]:
        out = sdk.chat.completions.create(
            model=MODEL, messages=_ask("Name a fruit."), temperature=0, max_tokens=1, **kw
        )
        return tok.encode(out.choices[0].message.content or "")

    plain = first()
    assert plain[:1] != [target]
    assert first(logit_bias={str(target): 100})[:1] == [target]
    assert first(logit_bias={str(plain[0]): -100})[:1] != plain[:1]


def test_vllm_output_extras_reach_the_engine(server):
    """``include_stop_str_in_output`` and ``skip_special_tokens`` (vLLM extras the engine
    implements) are honoured, not dropped."""
    from mmserve.server.protocol import CompletionRequest

    params = CompletionRequest(
        prompt="x", include_stop_str_in_output=True, skip_special_tokens=False
    ).to_sampling_params(4)
    assert params.include_stop_str_in_output and not params.skip_special_tokens

    def text(**kw: Any) -> str:
        r = httpx.post(
            f"{server.url}/v1/completions",
            timeout=60,
            json={
                "prompt": "One, two, three, four,",
                "max_tokens": 8,
                "temperature": 0,
                "stop": [","],
                **kw,
            },
        )
        assert r.status_code == 200, r.text
        return r.json()["choices"][0]["text"]

    cut = text()
    assert cut and "," not in cut
    assert text(include_stop_str_in_output=True) == cut + ","


def test_a_document_cut_by_max_tokens_finishes_with_length(sdk):
    out = sdk.chat.completions.create(
        model=MODEL,
        messages=_ask("A person as JSON."),
        temperature=0,
        max_tokens=3,
        response_format={"type": "json_object"},
    )
    assert out.choices[0].finish_reason == "length"
