"""``POST /v1/completions``: raw prompt(s) → engine → text completion or SSE.

A list of prompts fans out to ``len(prompts) * n`` engine requests; choice
``p * n + j`` is the j-th sample of prompt p, as in the OpenAI API.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response

from mmserve.engine.outputs import RequestOutput
from mmserve.server.engine_client import EngineClient, PrimedStreams, aclose, fan_out, new_id
from mmserve.server.errors import ParamError
from mmserve.server.limits import check_fan_out, check_prompt_bytes, check_stop, guard_json_body
from mmserve.server.protocol import CompletionRequest
from mmserve.server.protocol_out import (
    CompletionChoice,
    CompletionLogprobs,
    CompletionResponse,
    Usage,
    extend_completion_logprobs,
    make_usage,
)
from mmserve.server.serving import (
    get_state,
    in_thread,
    resolve_max_tokens,
    timed,
    until_disconnect,
)
from mmserve.server.sse import SSEResponse

router = APIRouter()
ENDPOINT = "/v1/completions"


@dataclass
class _Choice:
    index: int
    echo: str
    logprobs: CompletionLogprobs | None
    text: list[str] = field(default_factory=list)
    offset: int = 0
    num_tokens: int = 0
    num_draft: int = 0
    num_accepted: int = 0
    finish_reason: str | None = None

    def feed(self, out: RequestOutput) -> CompletionChoice:
        """Take one engine delta; return the streamed choice for it."""
        text = self.echo + out.new_text
        self.echo = ""
        self.text.append(text)
        self.num_tokens = len(out.token_ids)
        self.num_draft, self.num_accepted = out.num_draft_tokens, out.num_accepted_tokens
        self.finish_reason = out.finish_reason if out.finished else None
        delta_lp = None
        if self.logprobs is not None:
            delta_lp = CompletionLogprobs()
            self.offset = extend_completion_logprobs(delta_lp, out.new_logprobs or [], self.offset)
            for name in ("tokens", "token_logprobs", "top_logprobs", "text_offset"):
                getattr(self.logprobs, name).extend(getattr(delta_lp, name))
        return CompletionChoice(
            index=self.index, text=text, logprobs=delta_lp, finish_reason=self.finish_reason
        )

    def final(self) -> CompletionChoice:
        return CompletionChoice(
            index=self.index,
            text="".join(self.text),
            logprobs=self.logprobs,
            finish_reason=self.finish_reason,
        )


def _items(body: CompletionRequest) -> list[str | list[int]]:
    """The request's prompts: strings or token-id lists."""
    raw: Any = body.prompt
    if isinstance(raw, str):
        return [raw]
    if all(isinstance(x, int) for x in raw):
        return [list(raw)]
    return list(raw)


def _check_ids(items: list[str | list[int]], vocab_size: int) -> None:
    for p, item in enumerate(items):
        if isinstance(item, list) and item and not 0 <= min(item) <= max(item) < vocab_size:
            bad = next(t for t in item if not 0 <= t < vocab_size)
            raise ParamError(
                f"prompt {p} holds token id {bad}; token ids must be in [0, {vocab_size})",
                param="prompt",
                code="invalid_token_id",
            )


def _prompts(items: list[str | list[int]], engine: EngineClient) -> list[tuple[str, list[int]]]:
    """Each prompt as (text, token ids); token-id prompts are decoded for ``echo``."""
    tok = engine.tokenizer
    return [
        (p, tok.encode(p, add_special_tokens=True)) if isinstance(p, str) else (tok.decode(p), p)
        for p in items
    ]


@router.post(ENDPOINT, response_model=None, dependencies=[Depends(guard_json_body)])
async def completions(body: CompletionRequest, request: Request) -> Response:
    start = time.perf_counter()
    state = get_state(request)
    state.check_model(body.model)
    if body.suffix:
        raise ParamError("suffix is not supported", param="suffix")
    engine = state.engine
    check_stop(body.stop, state.config)
    items = _items(body)
    check_fan_out(len(items) * body.n, getattr(engine, "max_waiting", None))
    check_prompt_bytes(
        (p for p in items if isinstance(p, str)), state.config.max_prompt_bytes, "prompt"
    )
    _check_ids(items, engine.tokenizer.vocab_size)
    prompts = await in_thread(lambda: _prompts(items, engine))
    streams = []
    request_id = new_id("cmpl-")
    for p, (_, ids) in enumerate(prompts):
        max_tokens = resolve_max_tokens(
            body.requested_max_tokens(), len(ids), engine.max_model_len, "prompt"
        )
        params = body.to_sampling_params(max_tokens)
        streams.extend(fan_out(engine, ids, params, f"{request_id}-p{p}"))
    choices = [
        _Choice(
            k,
            prompts[k // body.n][0] if body.echo else "",
            CompletionLogprobs() if body.logprobs is not None else None,
        )
        for k in range(len(streams))
    ]
    num_prompt = sum(len(ids) for _, ids in prompts)
    primed = PrimedStreams(streams)
    await until_disconnect(request.receive, primed.prime())
    outputs = timed(state.metrics, ENDPOINT, start, primed.merged())

    def usage() -> Usage:
        return make_usage(
            num_prompt,
            sum(c.num_tokens for c in choices),
            0,
            sum(c.num_draft for c in choices),
            sum(c.num_accepted for c in choices),
        )

    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)

        async def chunks() -> AsyncIterator[CompletionResponse]:
            try:
                async for k, out in outputs:
                    choice = choices[k].feed(out)
                    yield CompletionResponse(
                        id=request_id, model=state.model_name, choices=[choice]
                    )
            finally:
                await aclose(outputs)
            if include_usage:
                yield CompletionResponse(
                    id=request_id, model=state.model_name, choices=[], usage=usage()
                )

        return SSEResponse(chunks())

    async def collect() -> None:
        async for k, out in outputs:
            choices[k].feed(out)

    try:
        await until_disconnect(request.receive, collect())
    finally:
        await aclose(outputs)
    response = CompletionResponse(
        id=request_id, model=state.model_name, choices=[c.final() for c in choices], usage=usage()
    )
    return JSONResponse(response.model_dump())
