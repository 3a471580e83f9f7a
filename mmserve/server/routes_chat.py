"""``POST /v1/chat/completions``: messages → chat template → engine → message or SSE.

The route only prepares (template, limits, sampling params) and hands the
engine's interleaved choice streams to the builders in ``chat_output``; errors
that can be known before the first token (queue full, prompt too long) are
answered with a status code, because the streams are primed before the
response starts.
"""

from __future__ import annotations

import json
import time
from typing import Any

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response

from connectors.image_source import ImageError
from connectors.prompt import IMAGE_MARKER, ImagePrompt
from mmserve.server.chat_output import (
    ChatContext,
    collect_chat,
    request_parser_settings,
    stream_chat,
)
from mmserve.server.engine_client import PrimedStreams, aclose, fan_out, new_id
from mmserve.server.errors import ParamError
from mmserve.server.images import ImageRef, prepare_images
from mmserve.server.limits import check_fan_out, check_prompt_bytes, check_stop, guard_json_body
from mmserve.server.protocol import ChatCompletionRequest, ChatMessage
from mmserve.server.serving import (
    get_state,
    in_thread,
    resolve_max_tokens,
    timed,
    until_disconnect,
)
from mmserve.server.sse import SSEResponse
from mmserve.server.tool_choice import plan_tools

router = APIRouter()
ENDPOINT = "/v1/chat/completions"


def _content_of(
    message: ChatMessage, index: int, images: list[ImageRef] | None, image_text: str | None
) -> Any:
    """A message's content for the chat template. Image parts are collected into
    ``images`` (None: this server takes no images) and stand in the content as
    ``IMAGE_MARKER`` (string content), or as ``{"type": "image"}`` parts when the
    connector's template prints ``image_text`` for them."""
    if message.content is None or isinstance(message.content, str):
        return message.content or ""
    parts: list[dict[str, Any]] = []
    for j, part in enumerate(message.content):
        where = f"messages.{index}.content.{j}"
        if part.type in ("text", "input_text") and part.text is not None:
            parts.append({"type": "text", "text": part.text})
        elif part.type in ("image_url", "input_image") and part.image_url is not None:
            if images is None:
                raise ParamError(
                    "this server has no vision connector, so it takes no images; "
                    "send text parts, or serve with --connector",
                    param=where,
                )
            images.append(ImageRef(part.image_url.url, where))
            parts.append({"type": "image"})
        else:
            raise ParamError(
                f"content part type {part.type!r} is not supported; send text parts "
                "({'type': 'text', 'text': ...}), image_url parts or a string",
                param=where,
            )
    if image_text is not None:  # the connector's template reads parts, image or not
        return parts
    return "".join(p["text"] if p["type"] == "text" else IMAGE_MARKER for p in parts)


def _text_only(content: Any) -> str:
    """The text of a templated message's content (image parts and markers aside)."""
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content)
    return str(content).replace(IMAGE_MARKER, "")


def _arguments(raw: str | dict[str, Any]) -> Any:
    """Templates expect tool-call arguments as a mapping; keep the string if it isn't JSON."""
    if isinstance(raw, dict):
        return raw
    try:
        return json.loads(raw)
    except ValueError:
        return raw


def template_messages(
    messages: list[ChatMessage], images: list[ImageRef] | None = None, image_text: str | None = None
) -> list[dict[str, Any]]:
    """OpenAI messages → the dicts a Hugging Face chat template reads (image parts are
    collected into ``images``, see ``_content_of``)."""
    out: list[dict[str, Any]] = []
    for i, m in enumerate(messages):
        msg: dict[str, Any] = {
            "role": "system" if m.role == "developer" else m.role,
            "content": _content_of(m, i, images, image_text),
        }
        if m.name:
            msg["name"] = m.name
        if m.tool_call_id:
            msg["tool_call_id"] = m.tool_call_id
        if m.tool_calls:
            msg["tool_calls"] = [
                {
                    "id": c.id,
                    "type": "function",
                    "function": {
                        "name": c.function.name,
                        "arguments": _arguments(c.function.arguments),
                    },
                }
                for c in m.tool_calls
            ]
        out.append(msg)
    return out


@router.post(ENDPOINT, response_model=None, dependencies=[Depends(guard_json_body)])
async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
    start = time.perf_counter()
    state = get_state(request)
    state.check_model(body.model)
    engine = state.engine
    check_stop(body.stop, state.config)
    check_fan_out(body.n, getattr(engine, "max_waiting", None))
    processor = getattr(engine, "image_processor", None)
    refs: list[ImageRef] | None = [] if processor is not None else None
    image_text = processor.image_text if processor is not None else None
    messages = template_messages(body.messages, refs, image_text)
    tools = [t.model_dump(exclude_none=True) for t in body.tools] if body.tools else None
    texts = [_text_only(m["content"]) for m in messages]
    texts += [json.dumps(tools)] if tools else []
    check_prompt_bytes(texts, state.config.max_prompt_bytes, "messages")
    body.refuse_unsupported()  # field errors before any image is fetched or decoded
    choice, tool_format, structured = plan_tools(body, tools, state.formats[0])
    images = await prepare_images(refs, state.config, processor) if refs and processor else []

    def render() -> tuple[str, ImagePrompt]:
        text = engine.tokenizer.apply_chat_template(
            messages, tools=tools, add_generation_prompt=True
        )
        encode = lambda t: engine.tokenizer.encode(t, add_special_tokens=False)  # noqa: E731
        if processor is None:  # with one, text-only prompts too are tokenized its way
            return text, ImagePrompt(encode(text), [], 0)
        try:
            return text, processor.splice(text, images, encode)
        except ImageError as exc:
            raise ParamError(str(exc), param="messages") from exc

    chars = None if images else sum(map(len, texts))  # an image's splice: a thread
    prompt_text, prompt = await in_thread(render, chars)
    prompt_ids = prompt.ids
    max_tokens = resolve_max_tokens(
        body.requested_max_tokens(), len(prompt_ids), engine.max_model_len, "messages"
    )
    params = body.to_sampling_params(max_tokens, structured)
    request_id = new_id("chatcmpl-")
    ctx = ChatContext(
        request_id=request_id,
        model=state.model_name,
        num_prompt_tokens=len(prompt_ids),
        n=params.n,
        parser_settings=request_parser_settings(
            (tool_format, state.formats[1]), tools, choice, prompt_text
        ),
        want_logprobs=body.logprobs,
        include_usage=bool(body.stream_options and body.stream_options.include_usage),
        num_image_tokens=prompt.num_image_tokens,
    )
    streams = PrimedStreams(fan_out(engine, prompt_ids, params, request_id, prompt.spans))
    await until_disconnect(request.receive, streams.prime())
    outputs = timed(state.metrics, ENDPOINT, start, streams.merged())
    if body.stream:
        return SSEResponse(stream_chat(ctx, outputs))
    try:
        response = await until_disconnect(request.receive, collect_chat(ctx, outputs))
    finally:
        await aclose(outputs)
    return JSONResponse(response.model_dump())
