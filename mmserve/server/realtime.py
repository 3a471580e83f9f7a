"""``WS /v1/realtime``: the OpenAI Realtime (GA) event protocol for text.

One ``RealtimeSocket`` per connection holds the session settings and the
conversation. The read loop only parses and dispatches; a response runs as its
own task (``realtime_response.ResponseRun``), so the loop stays responsive and
``response.cancel`` lands mid-stream. Every bad event (malformed JSON, unknown
or not-yet-supported type, wrong fields) is answered with an ``error`` event and
the socket stays open. Sends go through one lock, so events never interleave.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

from fastapi import APIRouter, WebSocket, WebSocketDisconnect
from pydantic import ValidationError

from mmserve.errors import MMServeError
from mmserve.server.errors import from_exception
from mmserve.server.limits import check_json, check_prompt_bytes
from mmserve.server.memory import trim_heap
from mmserve.server.realtime_audio_run import AudioResponseRun
from mmserve.server.realtime_conversation import Conversation, RealtimeError
from mmserve.server.realtime_protocol import (
    CLIENT_EVENTS,
    NOT_YET_SUPPORTED,
    SessionConfig,
    error_event,
    object_id,
    server_event,
)
from mmserve.server.realtime_response import ResponseRun, template_messages
from mmserve.server.realtime_voice import SessionVoice
from mmserve.server.serving import ServerState

router = APIRouter()
ENDPOINT = "/v1/realtime"
DEFAULT_INSTRUCTIONS = "You are a helpful, concise assistant."
DEFAULT_TEMPERATURE = 0.8


class RealtimeSocket:
    """Session settings, conversation and the active response of one WebSocket."""

    def __init__(self, ws: WebSocket, state: ServerState) -> None:
        self.ws = ws
        self.state = state
        self.session_id = object_id("sess")
        self.voice = SessionVoice(getattr(ws.app.state, "speech", None))
        self.config = SessionConfig(
            instructions=DEFAULT_INSTRUCTIONS,
            max_output_tokens="inf",
            output_modalities=["audio"] if self.voice.available else ["text"],
            tools=[],
            tool_choice="auto",
            audio=self.voice.audio_config() if self.voice.available else None,
        )
        cfg = state.config
        self.conversation = Conversation(
            object_id("conv"), cfg.realtime_max_items, cfg.realtime_max_bytes
        )
        self.active: ResponseRun | None = None
        self.active_task: asyncio.Task[Any] | None = None
        self._send_lock = asyncio.Lock()

    async def send(self, event: dict[str, Any]) -> None:
        async with self._send_lock:
            await self.ws.send_text(json.dumps(event))

    def session_wire(self) -> dict[str, Any]:
        data = self.config.model_dump(exclude_none=True)
        data.update(id=self.session_id, object="realtime.session", model=self.state.model_name)
        return data

    async def serve(self) -> None:
        await self.send(server_event("session.created", session=self.session_wire()))
        try:
            while True:
                message = await self.ws.receive()
                if message["type"] == "websocket.disconnect":
                    return
                await self.handle_raw(message.get("text"), message.get("bytes"))
        except WebSocketDisconnect:
            return
        finally:
            await self.stop_active(send_events=False)
            held = self.conversation.num_bytes
            self.conversation.clear()
            if held >= 1 << 20:  # give a large session's text back to the OS
                await asyncio.to_thread(trim_heap)

    async def handle_raw(self, text: str | None, data: bytes | None) -> None:
        if text is None:
            await self.send(
                error_event(
                    "binary frames are not supported; send JSON text events", "invalid_event"
                )
            )
            return
        if len(text) > self.state.config.max_body_bytes:
            await self.send(
                error_event("event is larger than the server's limit", "request_too_large")
            )
            return
        try:
            event = json.loads(text)
        except ValueError:
            await self.send(error_event("event is not valid JSON", "invalid_json"))
            return
        except RecursionError:
            await self.send(error_event("event JSON is nested too deeply", "json_too_deep"))
            return
        try:
            check_json(event, self.state.config.max_json_depth)
        except MMServeError as exc:
            err = from_exception(exc)[0]["error"]
            await self.send(error_event(err["message"], err["code"], err["param"]))
            return
        if not isinstance(event, dict) or not isinstance(event.get("type"), str):
            await self.send(
                error_event(
                    "an event must be a JSON object with a string 'type'", "invalid_event", "type"
                )
            )
            return
        await self.dispatch(event)

    async def dispatch(self, event: dict[str, Any]) -> None:
        kind, client_id = event["type"], event.get("event_id")
        client_id = client_id if isinstance(client_id, str) else None
        if kind in NOT_YET_SUPPORTED:
            msg = f"'{kind}' is not supported yet: this server takes text input only"
            await self.send(error_event(msg, "unsupported_event", "type", client_id))
            return
        model = CLIENT_EVENTS.get(kind)
        if model is None:
            msg = f"unknown event type '{kind}'"
            await self.send(error_event(msg, "invalid_event_type", "type", client_id))
            return
        try:
            parsed = model.model_validate(event)
            await getattr(self, "on_" + kind.replace(".", "_"))(parsed)
        except ValidationError as exc:
            first = exc.errors()[0]
            param = ".".join(str(p) for p in first["loc"])
            await self.send(
                error_event(f"{param}: {first['msg']}", "invalid_value", param, client_id)
            )
        except RealtimeError as exc:
            await self.send(error_event(str(exc), exc.code, exc.param, client_id))
        except MMServeError as exc:
            err = from_exception(exc)[0]["error"]
            await self.send(error_event(err["message"], err["code"], err["param"], client_id))

    async def on_session_update(self, event: Any) -> None:
        update = event.session
        self.voice.apply(update)  # raises before anything changes
        for name in update.model_fields_set - {"type", "voice", "output_audio_format"}:
            setattr(self.config, name, getattr(update, name))
        if self.voice.available:
            self.config.audio = self.voice.audio_config()
        await self.send(server_event("session.updated", session=self.session_wire()))

    async def on_conversation_item_create(self, event: Any) -> None:
        prev = self.conversation.insert(event.item, event.previous_item_id)
        wire = event.item.to_wire()
        for kind in (
            "conversation.item.created",
            "conversation.item.added",
            "conversation.item.done",
        ):
            await self.send(server_event(kind, item=wire, previous_item_id=prev))

    async def on_conversation_item_delete(self, event: Any) -> None:
        self.conversation.delete(event.item_id)
        await self.send(server_event("conversation.item.deleted", item_id=event.item_id))

    async def on_conversation_item_truncate(self, event: Any) -> None:
        self.voice.truncate(event, self.conversation)
        await self.send(
            server_event(
                "conversation.item.truncated",
                item_id=event.item_id,
                content_index=event.content_index,
                audio_end_ms=event.audio_end_ms,
            )
        )

    async def on_conversation_item_retrieve(self, event: Any) -> None:
        item = self.conversation.get(event.item_id)
        await self.send(server_event("conversation.item.retrieved", item=item.to_wire()))

    async def on_response_create(self, event: Any) -> None:
        if self.active is not None:
            raise RealtimeError(
                f"response {self.active.id} is still in progress; cancel it or "
                "wait for response.done",
                "conversation_already_has_active_response",
            )
        run = self.active = self._new_run(event.response)
        self.active_task = asyncio.ensure_future(self._run_active(run))
        # the session is free again however the task ends, even cancelled before it ran
        self.active_task.add_done_callback(lambda _: self._release(run))

    def _release(self, run: ResponseRun) -> None:
        if self.active is run:
            self.active, self.active_task = None, None

    async def on_response_cancel(self, event: Any) -> None:
        active = self.active
        if active is None or (event.response_id and event.response_id != active.id):
            raise RealtimeError(
                "there is no active response to cancel", "response_cancel_not_active", "response_id"
            )
        if active.cancel_requested:  # a second click: another task.cancel() could land
            return  # after ``run``'s handler and end the task before its ``response.done``
        active.cancel_requested = True
        if self.active_task is not None and active.started:
            self.active_task.cancel()  # unstarted, ``run`` sees the flag and ends at once

    def _new_run(self, params: Any) -> ResponseRun:
        cfg = self.config
        modalities = (
            params.output_modalities
            if params and params.output_modalities
            else cfg.output_modalities
        ) or ["text"]
        if "audio" in modalities:
            self.voice.require("response.output_modalities")
        instructions = (
            params.instructions if params and params.instructions is not None else cfg.instructions
        )
        out_of_band = params is not None and params.conversation == "none"
        items = params.input if params and params.input is not None else self.conversation.items
        limit = (
            params.max_output_tokens
            if params and params.max_output_tokens is not None
            else cfg.max_output_tokens
        )
        messages = template_messages(instructions, list(items))
        check_prompt_bytes(
            (str(m.get("content") or "") for m in messages),
            self.state.config.max_prompt_bytes,
            "input",
        )
        common = dict(
            engine=self.state.engine,
            send=self.send,
            messages=messages,
            max_output_tokens=limit if isinstance(limit, int) else None,
            temperature=DEFAULT_TEMPERATURE if cfg.temperature is None else cfg.temperature,
            ignore_eos=bool(cfg.ignore_eos),
            conversation_id=None if out_of_band else self.conversation.id,
            metadata=params.metadata if params else None,
        )
        if "audio" not in modalities:
            return ResponseRun(**common)  # type: ignore[arg-type]
        run = AudioResponseRun(
            **common,  # type: ignore[arg-type]
            speech=self.voice.speech,  # type: ignore[arg-type]
            voice=self.voice.voice,
            metrics=self.state.metrics,
            buffer_s=self.state.config.realtime_audio_buffer_ms / 1000,
        )
        self.voice.remember(run.item.id, run.timeline)  # type: ignore[arg-type]
        return run

    async def _run_active(self, run: ResponseRun) -> None:
        try:
            item = await run.run()
            if item is not None and run.conversation_id is not None:
                self.conversation.insert(item, None)
        except RealtimeError as exc:  # the answer itself does not fit the conversation
            await self.send(error_event(str(exc), exc.code, exc.param))
        finally:
            self._release(run)

    async def stop_active(self, send_events: bool) -> None:
        task = self.active_task
        if task is not None and not task.done():
            if self.active is not None:
                self.active.cancel_requested = send_events
            task.cancel()
            with contextlib.suppress(BaseException):
                await task


@router.websocket(ENDPOINT)
async def realtime(ws: WebSocket) -> None:
    state: ServerState = ws.app.state.mm
    requested = ws.query_params.get("model")
    offered = [p.strip() for p in ws.headers.get("sec-websocket-protocol", "").split(",")]
    await ws.accept(subprotocol="realtime" if "realtime" in offered else None)
    if requested and requested not in (state.model_name, state.engine.model_name):
        state.metrics.count_request(ENDPOINT, 404)
        await ws.send_text(
            json.dumps(
                error_event(
                    f"The model '{requested}' does not exist; "
                    f"this server serves '{state.model_name}'.",
                    "model_not_found",
                    "model",
                )
            )
        )
        await ws.close(code=1008)
        return
    state.metrics.count_request(ENDPOINT, 101)
    with contextlib.suppress(WebSocketDisconnect, RuntimeError):
        await RealtimeSocket(ws, state).serve()
