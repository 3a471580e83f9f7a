"""The conversation of one Realtime socket: an ordered list of items by id.

Items are checked on the way in (text content only until speech and image
input land), get a server id when the client sent none, and can be inserted
after a given item (``previous_item_id``; ``"root"`` means first).
"""

from __future__ import annotations

from mmserve.server.limits import utf8_len
from mmserve.server.realtime_protocol import Item, object_id

TEXT_PARTS = ("input_text", "text", "output_text", "output_audio")  # audio: its transcript


class RealtimeError(Exception):
    """A client error answered with an ``error`` event (the socket stays open)."""

    def __init__(self, message: str, code: str, param: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.param = param


def check_item(item: Item) -> None:
    """Raise ``RealtimeError`` unless ``item`` is a well-formed item we can serve."""
    if item.type == "message":
        if item.role is None:
            raise RealtimeError(
                "a message item needs a role: system, user or assistant",
                "invalid_value",
                "item.role",
            )
        for i, part in enumerate(item.content):
            if part.type not in TEXT_PARTS:
                raise RealtimeError(
                    f"content type '{part.type}' is not supported yet; send 'input_text' parts",
                    "unsupported_content_type",
                    f"item.content.{i}.type",
                )
    elif item.type == "function_call":
        if not item.name:
            raise RealtimeError("a function_call item needs a name", "invalid_value", "item.name")
    elif item.call_id is None or item.output is None:
        raise RealtimeError(
            "a function_call_output item needs call_id and output", "invalid_value", "item.call_id"
        )


def item_bytes(item: Item) -> int:
    """The UTF-8 size of an item's text: what it adds to every later prompt."""
    parts = [p.text or p.transcript or "" for p in item.content]
    parts += [item.arguments or "", item.output or "", item.name or ""]
    return sum(utf8_len(p) for p in parts)


class Conversation:
    """Ordered conversation items of one socket, at most ``max_items`` items and
    ``max_bytes`` bytes of text (``ServerConfig.realtime_max_items`` / ``_max_bytes``)."""

    def __init__(self, conversation_id: str, max_items: int, max_bytes: int) -> None:
        self.id = conversation_id
        self.items: list[Item] = []
        self.max_items, self.max_bytes = max_items, max_bytes
        self.num_bytes = 0

    def index_of(self, item_id: str) -> int:
        for i, item in enumerate(self.items):
            if item.id == item_id:
                return i
        raise RealtimeError(
            f"no item with id '{item_id}' in the conversation", "item_not_found", "item_id"
        )

    def get(self, item_id: str) -> Item:
        return self.items[self.index_of(item_id)]

    def insert(self, item: Item, previous_item_id: str | None) -> str | None:
        """Insert after ``previous_item_id`` (end when ``None``); returns the predecessor's id."""
        check_item(item)
        if len(self.items) >= self.max_items:
            raise RealtimeError(
                f"the conversation is full: it holds {len(self.items)} items, the server's "
                f"limit (realtime_max_items); delete some",
                "conversation_full",
            )
        size = item_bytes(item)
        if self.num_bytes + size > self.max_bytes:
            raise RealtimeError(
                f"the item would bring the conversation to {self.num_bytes + size} bytes of "
                f"text, over the server's limit of {self.max_bytes} (realtime_max_bytes); "
                "delete some items",
                "conversation_too_large",
            )
        if item.id is None:
            item.id = object_id("item")
        elif any(existing.id == item.id for existing in self.items):
            raise RealtimeError(
                f"an item with id '{item.id}' already exists", "duplicate_item_id", "item.id"
            )
        if item.status is None:
            item.status = "completed"
        if previous_item_id is None:
            position = len(self.items)
        elif previous_item_id == "root":
            position = 0
        else:
            position = self.index_of(previous_item_id) + 1
        self.items.insert(position, item)
        self.num_bytes += size
        return self.items[position - 1].id if position > 0 else None

    def set_transcript(self, item_id: str, transcript: str) -> None:
        """An assistant audio item's transcript, cut to what its listener heard."""
        item = self.get(item_id)
        before = item_bytes(item)
        for part in item.content:
            if part.type == "output_audio":
                part.transcript = transcript
        self.num_bytes += item_bytes(item) - before

    def delete(self, item_id: str) -> None:
        item = self.items.pop(self.index_of(item_id))
        self.num_bytes -= item_bytes(item)

    def clear(self) -> None:
        self.items.clear()
        self.num_bytes = 0
