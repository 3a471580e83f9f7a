"""Pydantic response models of the OpenAI HTTP API, and logprob conversions.

Field names follow the OpenAI reference so the ``openai`` SDK parses every
response; ``reasoning_content`` is the field vLLM and SGLang use for reasoning.
"""

from __future__ import annotations

import time
from typing import Any, Literal

from pydantic import BaseModel, Field

from mmserve.engine.outputs import TokenLogprob


class PromptTokensDetails(BaseModel):
    cached_tokens: int = 0
    image_tokens: int = 0  # prompt tokens that images occupy (included in prompt_tokens)


class CompletionTokensDetails(BaseModel):
    """Speculation's drafted tokens in OpenAI's predicted-output terms: accepted and
    rejected draft tokens (``accepted + rejected`` = drafted)."""

    accepted_prediction_tokens: int = 0
    rejected_prediction_tokens: int = 0


class Usage(BaseModel):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0
    prompt_tokens_details: PromptTokensDetails | None = None
    completion_tokens_details: CompletionTokensDetails | None = None


def make_usage(
    prompt_tokens: int,
    completion_tokens: int,
    cached_tokens: int = 0,
    draft_tokens: int = 0,
    accepted_tokens: int = 0,
    image_tokens: int = 0,
) -> Usage:
    return Usage(
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        total_tokens=prompt_tokens + completion_tokens,
        prompt_tokens_details=PromptTokensDetails(
            cached_tokens=cached_tokens, image_tokens=image_tokens
        ),
        completion_tokens_details=CompletionTokensDetails(
            accepted_prediction_tokens=accepted_tokens,
            rejected_prediction_tokens=draft_tokens - accepted_tokens,
        ),
    )


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None = None


class ChatTokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob] = Field(default_factory=list)


class ChatLogprobs(BaseModel):
    content: list[ChatTokenLogprob] = Field(default_factory=list)


class ChatMessageOut(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[dict[str, Any]] | None = None


class ChatChoice(BaseModel):
    index: int
    message: ChatMessageOut
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatChoice]
    usage: Usage


class ChatChunkChoice(BaseModel):
    index: int
    delta: dict[str, Any]  # OpenAI delta: role / content / reasoning_content / tool_calls
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None


class CompletionLogprobs(BaseModel):
    tokens: list[str] = Field(default_factory=list)
    token_logprobs: list[float | None] = Field(default_factory=list)
    top_logprobs: list[dict[str, float] | None] = Field(default_factory=list)
    text_offset: list[int] = Field(default_factory=list)


class CompletionChoice(BaseModel):
    index: int
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None = None


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = Field(default_factory=lambda: int(time.time()))
    owned_by: str = "mmserve"
    max_model_len: int | None = None


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


def chat_logprobs(items: list[TokenLogprob]) -> ChatLogprobs:
    return ChatLogprobs(
        content=[
            ChatTokenLogprob(
                token=lp.token,
                logprob=lp.logprob,
                bytes=list(lp.token.encode()),
                top_logprobs=[
                    TopLogprob(token=text, logprob=value, bytes=list(text.encode()))
                    for _, text, value in lp.top
                ],
            )
            for lp in items
        ]
    )


def extend_completion_logprobs(
    acc: CompletionLogprobs, items: list[TokenLogprob], text_offset: int
) -> int:
    """Append ``items`` to ``acc`` (legacy completions shape); returns the next text offset."""
    for lp in items:
        acc.tokens.append(lp.token)
        acc.token_logprobs.append(lp.logprob)
        acc.top_logprobs.append({text: value for _, text, value in lp.top} or None)
        acc.text_offset.append(text_offset)
        text_offset += len(lp.token)
    return text_offset
