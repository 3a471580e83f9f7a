"""Pydantic models of the OpenAI Realtime (GA) event protocol: text in, text or audio out.

Client events are parsed leniently (unknown fields ignored) into the models
below; server events are built from them and serialized without ``None`` fields,
in the shapes the ``openai`` SDK's ``openai.types.realtime`` models read.
"""

from __future__ import annotations

import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

NOT_YET_SUPPORTED = (
    "input_audio_buffer.append",
    "input_audio_buffer.commit",
    "input_audio_buffer.clear",
    "output_audio_buffer.clear",
)


def event_id() -> str:
    return f"event_{uuid.uuid4().hex[:20]}"


def object_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:20]}"


class _In(BaseModel):
    model_config = ConfigDict(extra="ignore")


def _output_limit(v: int | str | None) -> int | str | None:
    """``max_output_tokens``: 1 to 4096 tokens or ``"inf"``, as OpenAI has it (0 is no
    'unset': it is refused)."""
    if isinstance(v, int) and not 1 <= v <= 4096:
        raise ValueError(f"must be between 1 and 4096, or 'inf'; got {v}")
    return v


class ContentPart(_In):
    type: str
    text: str | None = None
    transcript: str | None = None


class Item(_In):
    """A conversation item: a message, a function call or a function call's output."""

    id: str | None = None
    type: Literal["message", "function_call", "function_call_output"]
    role: Literal["system", "user", "assistant"] | None = None
    content: list[ContentPart] = Field(default_factory=list)
    status: str | None = None
    name: str | None = None
    arguments: str | None = None
    call_id: str | None = None
    output: str | None = None

    def text(self) -> str:
        return "".join(p.text or p.transcript or "" for p in self.content)

    def to_wire(self) -> dict[str, Any]:
        data = self.model_dump(exclude_none=True)
        data["object"] = "realtime.item"
        if self.type != "message":
            data.pop("content", None)
        return data


class AudioFormat(_In):
    type: str = "audio/pcm"
    rate: int | None = None


class AudioOutput(_In):
    format: AudioFormat | None = None
    voice: str | dict[str, Any] | None = None
    speed: float | None = Field(default=None, ge=0.25, le=1.5)


class AudioConfig(_In):
    output: AudioOutput | None = None


class SessionConfig(_In):
    type: Literal["realtime"] = "realtime"
    instructions: str | None = None
    max_output_tokens: int | Literal["inf"] | None = None
    _limit = field_validator("max_output_tokens")(_output_limit)
    output_modalities: list[Literal["text", "audio"]] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)  # beta field, still honoured
    # mmserve's extension (as ``ignore_eos`` on chat completions): answers run to their
    # token limit past the end-of-sequence token (fixed-length loads: ``mmserve bench serve``)
    ignore_eos: bool | None = None
    audio: AudioConfig | None = None
    voice: str | None = Field(default=None, exclude=True)  # beta: audio.output.voice
    output_audio_format: str | None = Field(default=None, exclude=True)  # beta: "pcm16"


class ResponseParams(_In):
    conversation: str | None = None  # "auto" (default) | "none"
    input: list[Item] | None = None
    instructions: str | None = None
    max_output_tokens: int | Literal["inf"] | None = None
    _limit = field_validator("max_output_tokens")(_output_limit)
    output_modalities: list[Literal["text", "audio"]] | None = None
    metadata: dict[str, str] | None = None


class SessionUpdate(_In):
    type: Literal["session.update"]
    event_id: str | None = None
    session: SessionConfig


class ItemCreate(_In):
    type: Literal["conversation.item.create"]
    event_id: str | None = None
    previous_item_id: str | None = None
    item: Item


class ItemRef(_In):
    type: Literal["conversation.item.delete", "conversation.item.retrieve"]
    event_id: str | None = None
    item_id: str


class ResponseCreate(_In):
    type: Literal["response.create"]
    event_id: str | None = None
    response: ResponseParams | None = None


class ItemTruncate(_In):
    type: Literal["conversation.item.truncate"]
    event_id: str | None = None
    item_id: str
    content_index: int = Field(default=0, ge=0)
    audio_end_ms: int = Field(ge=0)


class ResponseCancel(_In):
    type: Literal["response.cancel"]
    event_id: str | None = None
    response_id: str | None = None


CLIENT_EVENTS: dict[str, type[_In]] = {
    "session.update": SessionUpdate,
    "conversation.item.create": ItemCreate,
    "conversation.item.delete": ItemRef,
    "conversation.item.retrieve": ItemRef,
    "response.create": ResponseCreate,
    "response.cancel": ResponseCancel,
    "conversation.item.truncate": ItemTruncate,
}


class ResponseUsage(BaseModel):
    input_tokens: int = 0
    output_tokens: int = 0
    total_tokens: int = 0


ResponseStatus = Literal["in_progress", "completed", "cancelled", "incomplete", "failed"]


class ResponseStatusDetails(BaseModel):
    type: Literal["completed", "cancelled", "incomplete", "failed"]
    reason: str | None = None
    error: dict[str, Any] | None = None


class RealtimeResponse(BaseModel):
    id: str
    object: Literal["realtime.response"] = "realtime.response"
    status: ResponseStatus
    status_details: ResponseStatusDetails | None = None
    output: list[dict[str, Any]] = Field(default_factory=list)
    conversation_id: str | None = None
    output_modalities: list[str] = Field(default_factory=lambda: ["text"])
    max_output_tokens: int | Literal["inf"] = "inf"
    metadata: dict[str, str] | None = None
    usage: ResponseUsage | None = None


def server_event(type_: str, **fields: Any) -> dict[str, Any]:
    """A server event as JSON-ready dict: ``event_id``, ``type`` and the given fields."""
    body: dict[str, Any] = {"event_id": event_id(), "type": type_}
    for key, value in fields.items():
        if isinstance(value, BaseModel):
            value = value.model_dump(exclude_none=True)
        if value is not None:
            body[key] = value
    return body


def error_event(
    message: str,
    code: str | None = None,
    param: str | None = None,
    client_event_id: str | None = None,
    type_: str = "invalid_request_error",
) -> dict[str, Any]:
    error = {
        "type": type_,
        "code": code,
        "message": message,
        "param": param,
        "event_id": client_event_id,
    }
    return server_event("error", error=error)
