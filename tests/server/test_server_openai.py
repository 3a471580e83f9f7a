"""The OpenAI HTTP API driven by the ``openai`` SDK against a live server (real model)."""

from __future__ import annotations

import asyncio
from typing import Any

import openai
import pytest
from conftest import chat_messages
from live_server import LiveServer

HI = chat_messages("Say hello in one short sentence.")


def test_models_lists_and_retrieves_the_served_model(
    client: openai.OpenAI, model_name: str
) -> None:
    models = client.models.list()
    assert [m.id for m in models.data] == [model_name]
    assert client.models.retrieve(model_name).id == model_name
    with pytest.raises(openai.NotFoundError) as info:
        client.models.retrieve("gpt-9")
    assert info.value.code == "model_not_found"


def test_chat_completion_with_usage(client: openai.OpenAI, model_name: str) -> None:
    resp = client.chat.completions.create(
        model=model_name, messages=HI, max_tokens=12, temperature=0
    )
    choice = resp.choices[0]
    assert resp.object == "chat.completion" and resp.model == model_name
    assert choice.message.role == "assistant" and choice.message.content
    assert choice.finish_reason in ("stop", "length")
    assert resp.usage is not None and resp.usage.prompt_tokens > 0
    assert 0 < resp.usage.completion_tokens <= 12
    assert resp.usage.total_tokens == resp.usage.prompt_tokens + resp.usage.completion_tokens


def test_stream_and_non_stream_agree_at_temperature_zero(
    client: openai.OpenAI, model_name: str
) -> None:
    kwargs: dict[str, Any] = dict(
        model=model_name, messages=HI, max_completion_tokens=16, temperature=0
    )
    full = client.chat.completions.create(**kwargs)
    stream = client.chat.completions.create(
        **kwargs, stream=True, stream_options={"include_usage": True}
    )
    parts, finish, usage = [], None, None
    for chunk in stream:
        usage = chunk.usage or usage
        for c in chunk.choices:
            parts.append(c.delta.content or "")
            finish = c.finish_reason or finish
    assert "".join(parts) == full.choices[0].message.content
    assert finish == full.choices[0].finish_reason
    assert usage is not None and usage.completion_tokens == full.usage.completion_tokens  # type: ignore[union-attr]


def test_n_choices_are_seeded_and_distinct(client: openai.OpenAI, model_name: str) -> None:
    kwargs: dict[str, Any] = dict(
        model=model_name,
        messages=chat_messages("Name a color."),
        max_tokens=8,
        temperature=1.0,
        n=3,
        seed=7,
    )
    first = client.chat.completions.create(**kwargs)
    again = client.chat.completions.create(**kwargs)
    assert sorted(c.index for c in first.choices) == [0, 1, 2]
    texts = [c.message.content for c in sorted(first.choices, key=lambda c: c.index)]
    assert texts == [c.message.content for c in sorted(again.choices, key=lambda c: c.index)]
    assert first.usage is not None and first.usage.completion_tokens >= 3
    seen: dict[int, str] = {}
    for chunk in client.chat.completions.create(**kwargs, stream=True):
        for c in chunk.choices:
            seen[c.index] = seen.get(c.index, "") + (c.delta.content or "")
    assert [seen[i] for i in range(3)] == texts


def test_stop_string_ends_the_text(client: openai.OpenAI, model_name: str) -> None:
    base = (
        client.chat.completions.create(model=model_name, messages=HI, max_tokens=16, temperature=0)
        .choices[0]
        .message.content
        or ""
    )
    words = base.split()
    assert len(words) >= 3, base
    stop = words[2]
    resp = client.chat.completions.create(
        model=model_name, messages=HI, max_tokens=16, temperature=0, stop=[stop]
    )
    text = resp.choices[0].message.content or ""
    assert stop not in text and base.startswith(text)
    assert resp.choices[0].finish_reason == "stop"


def test_chat_logprobs(client: openai.OpenAI, model_name: str) -> None:
    resp = client.chat.completions.create(
        model=model_name, messages=HI, max_tokens=6, temperature=0, logprobs=True, top_logprobs=2
    )
    content = resp.choices[0].logprobs.content  # type: ignore[union-attr]
    assert content is not None and len(content) == resp.usage.completion_tokens  # type: ignore[union-attr]
    for tok in content:
        assert tok.logprob <= 0.0 and len(tok.top_logprobs) == 2
        assert tok.top_logprobs[0].logprob >= tok.top_logprobs[1].logprob
        # greedy: the sampled token is the most likely one
        assert abs(tok.top_logprobs[0].logprob - tok.logprob) < 1e-4
    streamed = []
    for chunk in client.chat.completions.create(
        model=model_name,
        messages=HI,
        max_tokens=6,
        temperature=0,
        logprobs=True,
        top_logprobs=2,
        stream=True,
    ):
        for c in chunk.choices:
            streamed += c.logprobs.content or [] if c.logprobs else []
    assert [t.token for t in streamed] == [t.token for t in content]


def test_completions_prompt_list_stream_and_logprobs(
    client: openai.OpenAI, model_name: str
) -> None:
    prompts = ["The capital of France is", "One, two, three,"]
    resp = client.completions.create(
        model=model_name, prompt=prompts, max_tokens=6, temperature=0, logprobs=1
    )
    assert [c.index for c in resp.choices] == [0, 1]
    for choice in resp.choices:
        assert choice.text and choice.logprobs is not None
        assert len(choice.logprobs.tokens or []) == len(choice.logprobs.token_logprobs or [])
    streamed: dict[int, str] = {}
    for chunk in client.completions.create(
        model=model_name, prompt=prompts, max_tokens=6, temperature=0, stream=True
    ):
        for c in chunk.choices:
            streamed[c.index] = streamed.get(c.index, "") + c.text
    assert [streamed[0], streamed[1]] == [c.text for c in resp.choices]
    echo = client.completions.create(
        model=model_name, prompt=prompts[0], max_tokens=4, temperature=0, echo=True
    )
    assert echo.choices[0].text.startswith(prompts[0])


def test_sixteen_concurrent_streams_match_solo_outputs(server: LiveServer, model_name: str) -> None:
    prompts = ["Count to five.", "What is 2+2?", "Name a fruit.", "Say goodbye."]

    async def run() -> tuple[list[str], list[str]]:
        aclient = openai.AsyncOpenAI(
            base_url=f"{server.url}/v1", api_key="x", max_retries=0, timeout=300
        )

        async def one(prompt: str) -> str:
            stream = await aclient.chat.completions.create(
                model=model_name,
                messages=chat_messages(prompt),
                max_tokens=8,
                temperature=0,
                stream=True,
            )
            return "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])

        solo = [await one(p) for p in prompts]
        together = await asyncio.gather(*(one(prompts[i % 4]) for i in range(16)))
        await aclient.close()
        return solo, list(together)

    solo, together = asyncio.run(run())
    assert all(solo)
    assert together == [solo[i % 4] for i in range(16)]
