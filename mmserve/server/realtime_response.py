"""One Realtime response: conversation → prompt → engine → text events.

Runs as its own task so the socket keeps reading (``response.cancel`` must get
through while tokens stream). Event order per response, as the GA protocol has
it: ``response.created``, ``response.output_item.added``,
``conversation.item.added``, ``response.content_part.added``,
``response.output_text.delta``…, ``response.output_text.done``,
``response.content_part.done``, ``response.output_item.done``,
``conversation.item.done``, ``response.done`` (an out-of-band response, which adds no
item to the conversation, sends no ``conversation.item.*``). A cancelled or failed
response still closes every part it opened, and ``response.done`` always comes last.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from mmserve.engine.outputs import RequestOutput
from mmserve.sampling_params import SamplingParams
from mmserve.server.engine_client import EngineClient, aclose
from mmserve.server.errors import from_exception
from mmserve.server.realtime_protocol import (
    ContentPart,
    Item,
    RealtimeResponse,
    ResponseStatus,
    ResponseStatusDetails,
    ResponseUsage,
    error_event,
    object_id,
    server_event,
)
from mmserve.server.serving import in_thread, resolve_max_tokens

Send = Callable[[dict[str, Any]], Awaitable[None]]

_DONE_STATUS: dict[str, tuple[ResponseStatus, str | None]] = {
    "stop": ("completed", None),
    "length": ("incomplete", "max_output_tokens"),
}


def template_messages(instructions: str | None, items: list[Item]) -> list[dict[str, Any]]:
    """Conversation items → chat-template messages (instructions become the system turn)."""
    messages: list[dict[str, Any]] = []
    if instructions:
        messages.append({"role": "system", "content": instructions})
    for item in items:
        if item.type == "message":
            messages.append({"role": item.role, "content": item.text()})
        elif item.type == "function_call":
            call = {
                "type": "function",
                "id": item.call_id,
                "function": {"name": item.name, "arguments": item.arguments or "{}"},
            }
            messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
        else:
            messages.append({"role": "tool", "tool_call_id": item.call_id, "content": item.output})
    return messages


@dataclass
class ResponseRun:
    """State of one in-flight response; ``run`` is its task body."""

    engine: EngineClient
    send: Send
    messages: list[dict[str, Any]]
    max_output_tokens: int | None
    temperature: float
    conversation_id: str | None
    metadata: dict[str, str] | None = None
    ignore_eos: bool = False
    id: str = field(default_factory=lambda: object_id("resp"))
    item: Item = field(
        default_factory=lambda: Item(
            id=object_id("item"), type="message", role="assistant", status="in_progress"
        )
    )
    text: list[str] = field(default_factory=list)
    usage: ResponseUsage = field(default_factory=ResponseUsage)
    cancel_requested: bool = False
    started: bool = False  # ``run`` has begun (its task may be cancelled)

    def _response(
        self,
        status: ResponseStatus,
        details: ResponseStatusDetails | None = None,
        output: list[dict[str, Any]] | None = None,
    ) -> RealtimeResponse:
        return RealtimeResponse(
            id=self.id,
            status=status,
            status_details=details,
            output=output or [],
            conversation_id=self.conversation_id,
            metadata=self.metadata,
            max_output_tokens=self.max_output_tokens or "inf",
            usage=self.usage if status != "in_progress" else None,
        )

    async def run(self) -> Item | None:
        """Stream the response; returns the assistant item (``None`` if it never started).

        A cancel that came before this task first ran (``cancel_requested`` with the task
        left uncancelled: an unstarted coroutine cannot run its handlers) still gets its
        ``response.created`` and a cancelled ``response.done``."""
        self.started = True
        stream = None
        status: ResponseStatus = "completed"
        reason: str | None = None
        try:
            await self.send(
                server_event("response.created", response=self._response("in_progress"))
            )
            if self.cancel_requested:
                raise asyncio.CancelledError
            try:
                stream = await self._start()
            except Exception as exc:  # noqa: BLE001 - reported to the client, socket stays open
                await self._fail(exc)
                return None
            await self._open_parts()
            status, reason = await self._consume(stream)
        except asyncio.CancelledError:
            if not self.cancel_requested:
                raise
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                task.uncancel()
            status, reason = "cancelled", "client_cancelled"
        finally:
            if stream is not None:
                await aclose(stream)
        if stream is None:  # cancelled before its first token
            details = ResponseStatusDetails(type="cancelled", reason=reason)
            await self.send(server_event("response.done", response=self._response(status, details)))
            return None
        await self._close_parts(status, reason)
        return self.item

    async def _consume(self, stream: Any) -> tuple[ResponseStatus, str | None]:
        """Stream the model's output to the client -> the response's status and reason."""
        status: tuple[ResponseStatus, str | None] = ("completed", None)
        async for out in stream:
            await self._delta(out)
            if out.finished:
                status = finish_status(out)
        return status

    async def _start(self) -> Any:
        """Template, check limits, submit; the first output is awaited so errors show here."""
        tok = self.engine.tokenizer
        messages = self.messages

        def render() -> list[int]:
            text = tok.apply_chat_template(messages, add_generation_prompt=True)
            return list(tok.encode(text, add_special_tokens=False))

        chars = sum(len(str(m.get("content") or "")) for m in messages)
        prompt_ids = await in_thread(render, chars)
        max_tokens = resolve_max_tokens(
            self.max_output_tokens, len(prompt_ids), self.engine.max_model_len, "input"
        )
        params = SamplingParams(
            temperature=self.temperature, max_tokens=max_tokens, ignore_eos=self.ignore_eos
        )
        self.usage.input_tokens = len(prompt_ids)
        stream = self.engine.generate(prompt_ids, params, self.id)
        first = await anext(stream)
        return _prepend(first, stream)

    async def _open_parts(self) -> None:
        ids = {"response_id": self.id, "output_index": 0}
        await self.send(server_event("response.output_item.added", item=self.item.to_wire(), **ids))
        await self._conversation_event("conversation.item.added", self.item.to_wire())
        await self.send(
            server_event(
                "response.content_part.added",
                item_id=self.item.id,
                content_index=0,
                part={"type": "text", "text": ""},
                **ids,
            )
        )

    async def _delta(self, out: RequestOutput) -> None:
        self.usage.output_tokens = len(out.token_ids)
        self.usage.total_tokens = self.usage.input_tokens + self.usage.output_tokens
        if out.new_text:
            self.text.append(out.new_text)
            await self.send(
                server_event(
                    "response.output_text.delta",
                    response_id=self.id,
                    item_id=self.item.id,
                    output_index=0,
                    content_index=0,
                    delta=out.new_text,
                )
            )

    async def _close_parts(self, status: ResponseStatus, reason: str | None) -> None:
        text = "".join(self.text)
        ids = {
            "response_id": self.id,
            "item_id": self.item.id,
            "output_index": 0,
            "content_index": 0,
        }
        await self.send(server_event("response.output_text.done", text=text, **ids))
        await self.send(
            server_event("response.content_part.done", part={"type": "text", "text": text}, **ids)
        )
        self.item.status = "completed" if status == "completed" else "incomplete"
        self.item.content = [ContentPart(type="output_text", text=text)]
        wire = self.item.to_wire()
        await self.send(
            server_event(
                "response.output_item.done", response_id=self.id, output_index=0, item=wire
            )
        )
        await self._conversation_event("conversation.item.done", wire)
        details = ResponseStatusDetails(type=status, reason=reason)  # type: ignore[arg-type]
        await self.send(
            server_event("response.done", response=self._response(status, details, [wire]))
        )

    async def _conversation_event(self, kind: str, item: dict[str, Any]) -> None:
        """``conversation.item.*`` for the answer's item, only where the answer joins the
        conversation: an out-of-band response (``conversation: "none"``) adds nothing."""
        if self.conversation_id is not None:
            await self.send(server_event(kind, item=item))

    async def _fail(self, exc: Exception) -> None:
        body, _ = from_exception(exc)
        err = body["error"]
        await self.send(error_event(err["message"], err["code"], err["param"], type_=err["type"]))
        details = ResponseStatusDetails(type="failed", error=err)
        await self.send(server_event("response.done", response=self._response("failed", details)))


def finish_status(out: RequestOutput) -> tuple[ResponseStatus, str | None]:
    """A finished output's response status and reason."""
    return _DONE_STATUS.get(out.finish_reason or "stop", ("completed", None))


async def _prepend(first: RequestOutput, rest: Any) -> Any:
    try:
        yield first
        if not first.finished:
            async for out in rest:
                yield out
    finally:
        await aclose(rest)
