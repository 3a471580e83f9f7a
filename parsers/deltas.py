"""OpenAI ``chat.completion.chunk`` delta objects: building them and folding them back.

A delta is one of::

    {"reasoning_content": str}
    {"content": str}
    {"tool_calls": [{"index": i, "id": "call_...", "type": "function",
                     "function": {"name": str, "arguments": str}}]}   # a call's first fragment
    {"tool_calls": [{"index": i, "function": {"arguments": str}}]}    # every later fragment

:func:`reconstruct` folds a delta list into the non-streaming message; ``parse`` is
exactly that fold applied to a stream, so the two cannot disagree.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

Delta = dict[str, Any]


@dataclass
class _Item:
    """One delta under construction; text pieces are joined once, in :meth:`take`."""

    kind: str  # "content", "reasoning_content" or "call"
    index: int = -1
    header: tuple[str, str] | None = None  # (id, name) on a call's first fragment
    pieces: list[str] = field(default_factory=list)


class DeltaBuilder:
    """Collects the deltas of one ``feed``/``finish`` call, merging neighbours of one kind."""

    def __init__(self) -> None:
        self._items: list[_Item] = []

    def content(self, text: str) -> None:
        self._text("content", text)

    def reasoning(self, text: str) -> None:
        self._text("reasoning_content", text)

    def _text(self, kind: str, text: str) -> None:
        if not text:
            return
        if self._items and self._items[-1].kind == kind:
            self._items[-1].pieces.append(text)
        else:
            self._items.append(_Item(kind, pieces=[text]))

    def call_open(self, index: int, call_id: str, name: str) -> None:
        self._items.append(_Item("call", index, (call_id, name)))

    def call_args(self, index: int, text: str) -> None:
        if not text:
            return
        last = self._items[-1] if self._items else None
        if last is not None and last.kind == "call" and last.index == index:
            last.pieces.append(text)
        else:
            self._items.append(_Item("call", index, pieces=[text]))

    def take(self) -> list[Delta]:
        """The deltas collected since the last ``take``."""
        items, self._items = self._items, []
        return [_to_delta(item) for item in items]


def _to_delta(item: _Item) -> Delta:
    text = "".join(item.pieces)
    if item.kind != "call":
        return {item.kind: text}
    if item.header is None:
        return {"tool_calls": [{"index": item.index, "function": {"arguments": text}}]}
    call_id, name = item.header
    frag = {
        "index": item.index,
        "id": call_id,
        "type": "function",
        "function": {"name": name, "arguments": text},
    }
    return {"tool_calls": [frag]}


def reconstruct(deltas: list[Delta]) -> dict[str, Any]:
    """Fold streamed deltas into ``{"reasoning_content", "content", "tool_calls"}``.

    Empty reasoning or content is ``None``; calls are ordered by index.
    """
    reasoning: list[str] = []
    content: list[str] = []
    calls: dict[int, dict[str, Any]] = {}
    args: dict[int, list[str]] = {}
    for delta in deltas:
        reasoning.append(delta.get("reasoning_content") or "")
        content.append(delta.get("content") or "")
        for frag in delta.get("tool_calls") or ():
            index = frag["index"]
            if index not in calls:
                fn = frag["function"]
                calls[index] = {"id": frag["id"], "type": "function", "name": fn["name"]}
                args[index] = []
            args[index].append(frag["function"].get("arguments") or "")
    tool_calls = [
        {
            "id": calls[i]["id"],
            "type": "function",
            "function": {"name": calls[i]["name"], "arguments": "".join(args[i])},
        }
        for i in sorted(calls)
    ]
    return {
        "reasoning_content": "".join(reasoning) or None,
        "content": "".join(content) or None,
        "tool_calls": tool_calls,
    }
