"""Chat-completion output: raw generated text → OpenAI messages and deltas.

The builders here consume an async iterator of ``(choice_index, RequestOutput)``
deltas and know nothing of where they come from: the server feeds them from the
engine, a test from a scripted text source, through the same code. When a tool
or reasoning format is configured the text runs through a ``parsers.StreamParser``
(one per choice), which splits it into ``content``, ``reasoning_content`` and
``tool_calls`` deltas; a choice that made calls finishes with ``"tool_calls"``.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from mmserve.engine.outputs import RequestOutput, TokenLogprob
from mmserve.server.engine_client import aclose
from mmserve.server.protocol_out import (
    ChatChoice,
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatCompletionResponse,
    ChatMessageOut,
    Usage,
    chat_logprobs,
    make_usage,
)


@dataclass(frozen=True)
class ParserSettings:
    """Formats the parsers use for one request; ``None`` turns that part off."""

    tool_format: str | None = None
    reasoning_format: str | None = None
    tools: list[dict[str, Any]] | None = None
    think_open: bool = False

    @property
    def enabled(self) -> bool:
        return self.tool_format is not None or self.reasoning_format is not None


def make_parser(settings: ParserSettings) -> Any | None:
    """A fresh ``StreamParser`` for one choice, or ``None`` when parsing is off."""
    if not settings.enabled:
        return None
    from parsers import StreamParser  # imported lazily: parsing is optional

    return StreamParser(
        tool_format=settings.tool_format,
        reasoning_format=settings.reasoning_format,
        tools=settings.tools,
        think_open=settings.think_open,
    )


@dataclass
class ChoiceState:
    """Streaming state of one choice: parser, accumulated message, token count."""

    index: int
    parser: Any | None
    content: list[str] = field(default_factory=list)
    reasoning: list[str] = field(default_factory=list)
    tool_calls: dict[int, dict[str, Any]] = field(default_factory=dict)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    num_tokens: int = 0
    num_cached: int = 0
    num_draft: int = 0
    num_accepted: int = 0
    finish_reason: str | None = None

    def feed(self, out: RequestOutput) -> list[dict[str, Any]]:
        """Take one engine delta; return the OpenAI deltas it completes (maybe none)."""
        self.num_tokens = len(out.token_ids)
        self.num_draft, self.num_accepted = out.num_draft_tokens, out.num_accepted_tokens
        self.num_cached = out.num_cached_tokens
        self.logprobs.extend(out.new_logprobs or [])
        if self.parser is None:
            deltas = [{"content": out.new_text}] if out.new_text else []
        else:
            deltas = list(self.parser.feed(out.new_text)) if out.new_text else []
            if out.finished:
                deltas.extend(self.parser.finish())
        for delta in deltas:
            self._accumulate(delta)
        if out.finished:
            self.finish_reason = out.finish_reason
            if self.tool_calls and out.finish_reason == "stop":
                self.finish_reason = "tool_calls"
        return deltas

    def _accumulate(self, delta: dict[str, Any]) -> None:
        if delta.get("content"):
            self.content.append(delta["content"])
        if delta.get("reasoning_content"):
            self.reasoning.append(delta["reasoning_content"])
        for call in delta.get("tool_calls") or []:
            acc = self.tool_calls.setdefault(
                call.get("index", len(self.tool_calls)),
                {"id": None, "type": "function", "function": {"name": "", "arguments": ""}},
            )
            acc["id"] = call.get("id") or acc["id"]
            fn = call.get("function") or {}
            acc["function"]["name"] += fn.get("name") or ""
            acc["function"]["arguments"] += fn.get("arguments") or ""

    def message(self) -> ChatMessageOut:
        calls = [self.tool_calls[i] for i in sorted(self.tool_calls)]
        content = "".join(self.content)
        return ChatMessageOut(
            content=content if content or not calls else None,
            reasoning_content="".join(self.reasoning) or None,
            tool_calls=calls or None,
        )


@dataclass
class ChatContext:
    """Per-request facts the builders need besides the outputs."""

    request_id: str
    model: str
    num_prompt_tokens: int
    n: int
    parser_settings: ParserSettings
    want_logprobs: bool = False
    include_usage: bool = False
    num_image_tokens: int = 0  # of num_prompt_tokens, those the images occupy
    created: int = field(default_factory=lambda: int(time.time()))

    @cached_property
    def _chunk_head(self) -> str:
        return (
            f'{{"id":{json.dumps(self.request_id)},"object":"chat.completion.chunk",'
            f'"created":{self.created},"model":{json.dumps(self.model)},'
            f'"choices":[{{"index":'
        )

    def content_json(self, index: int, text: str) -> str:
        """The JSON of a chunk whose one choice carries only ``content``, byte for byte
        what its ``ChatCompletionChunk.model_dump_json()`` gives, without building the
        models: most chunks of a stream are these, and the models cost several times
        the encoding."""
        return (
            f'{self._chunk_head}{index},"delta":{{"content":'
            f'{json.dumps(text, ensure_ascii=False)}}},"logprobs":null,'
            f'"finish_reason":null}}],"usage":null}}'
        )

    def new_states(self) -> list[ChoiceState]:
        return [ChoiceState(i, make_parser(self.parser_settings)) for i in range(self.n)]

    def usage(self, states: list[ChoiceState]) -> Usage:
        cached = max((s.num_cached for s in states), default=0)
        return make_usage(
            self.num_prompt_tokens,
            sum(s.num_tokens for s in states),
            cached,
            sum(s.num_draft for s in states),
            sum(s.num_accepted for s in states),
            self.num_image_tokens,
        )


async def collect_chat(
    ctx: ChatContext, outputs: AsyncIterator[tuple[int, RequestOutput]]
) -> ChatCompletionResponse:
    """Drain the outputs into one non-streamed ``chat.completion``."""
    states = ctx.new_states()
    try:
        async for i, out in outputs:
            states[i].feed(out)
    finally:
        await aclose(outputs)
    choices = [
        ChatChoice(
            index=s.index,
            message=s.message(),
            logprobs=chat_logprobs(s.logprobs) if ctx.want_logprobs else None,
            finish_reason=s.finish_reason,
        )
        for s in states
    ]
    return ChatCompletionResponse(
        id=ctx.request_id,
        created=ctx.created,
        model=ctx.model,
        choices=choices,
        usage=ctx.usage(states),
    )


async def stream_chat(
    ctx: ChatContext, outputs: AsyncIterator[tuple[int, RequestOutput]]
) -> AsyncIterator[ChatCompletionChunk | str]:
    """Turn the outputs into ``chat.completion.chunk`` objects as they arrive; a chunk
    that carries only content comes already encoded (``ChatContext.content_json``)."""
    states = ctx.new_states()
    for s in states:
        yield _chunk(
            ctx, ChatChunkChoice(index=s.index, delta={"role": "assistant", "content": ""})
        )
    try:
        async for i, out in outputs:
            state = states[i]
            if ctx.want_logprobs or out.finished:
                for choice in _chunk_choices(ctx, state, out):
                    yield _chunk(ctx, choice)
                continue
            for delta in state.feed(out):
                if delta.keys() == {"content"}:
                    yield ctx.content_json(state.index, delta["content"])
                else:
                    yield _chunk(ctx, ChatChunkChoice(index=state.index, delta=delta))
    finally:
        await aclose(outputs)
    if ctx.include_usage:
        yield _chunk(ctx, None, usage=ctx.usage(states))


def _chunk_choices(
    ctx: ChatContext, state: ChoiceState, out: RequestOutput
) -> list[ChatChunkChoice]:
    """The chunk choices one engine delta produces; its logprobs ride on the first."""
    logprobs = chat_logprobs(out.new_logprobs) if ctx.want_logprobs and out.new_logprobs else None
    choices = [ChatChunkChoice(index=state.index, delta=d) for d in state.feed(out)]
    if logprobs is not None:
        if choices:
            choices[0].logprobs = logprobs
        else:
            choices.append(ChatChunkChoice(index=state.index, delta={}, logprobs=logprobs))
    if out.finished:
        choices.append(
            ChatChunkChoice(index=state.index, delta={}, finish_reason=state.finish_reason)
        )
    return choices


def _chunk(
    ctx: ChatContext, choice: ChatChunkChoice | None, usage: Usage | None = None
) -> ChatCompletionChunk:
    return ChatCompletionChunk(
        id=ctx.request_id,
        created=ctx.created,
        model=ctx.model,
        choices=[choice] if choice is not None else [],
        usage=usage,
    )


def resolve_formats(
    tool_call_parser: str | None, reasoning_parser: str | None, chat_template: str | None
) -> tuple[str | None, str | None]:
    """Server-wide (tool format, reasoning format); ``"auto"`` asks the chat template.

    Raises ``ValueError`` naming the known formats when a configured one is unknown.
    """
    if tool_call_parser is None and reasoning_parser is None:
        return None, None
    from parsers import REASONING_FORMATS, TOOL_FORMATS, detect_formats

    auto_tool, auto_reasoning = detect_formats(chat_template or "")
    tool = auto_tool if tool_call_parser == "auto" else tool_call_parser
    reasoning = auto_reasoning if reasoning_parser == "auto" else reasoning_parser
    for flag, value, known in (
        ("tool_call_parser", tool, TOOL_FORMATS),
        ("reasoning_parser", reasoning, REASONING_FORMATS),
    ):
        if value is not None and value not in known:
            raise ValueError(
                f"{flag} {value!r} is unknown; use auto or one of {', '.join(sorted(known))}"
            )
    return tool, reasoning


def request_parser_settings(
    formats: tuple[str | None, str | None],
    tools: list[dict[str, Any]] | None,
    tool_choice: Any,
    prompt_text: str,
) -> ParserSettings:
    """Per request: tool calls are parsed only when tools were offered and not refused."""
    tool_format, reasoning_format = formats
    if not tools or tool_choice == "none":
        tool_format = None
    if tool_format is None and reasoning_format is None:
        return ParserSettings()
    from parsers import think_open_from_prompt

    return ParserSettings(
        tool_format, reasoning_format, tools or None, think_open_from_prompt(prompt_text)
    )
