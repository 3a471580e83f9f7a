"""Shared helpers for the parser tests: tools, chunkings, and the checks every case gets."""

from __future__ import annotations

import json
import random
import re
from collections.abc import Iterator
from typing import Any

from parsers import StreamParser, parse, reconstruct

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string"},
                    "days": {"type": "integer"},
                    "ratio": {"type": "number"},
                    "metric": {"type": "boolean"},
                    "opts": {"type": "object"},
                    "tags": {"type": "array", "items": {"type": "string"}},
                    "unit": {"type": ["string", "null"], "enum": ["c", "f"]},
                },
            },
        },
    },
    {"type": "function", "function": {"name": "now", "parameters": {"type": "object"}}},
    {
        "type": "function",
        "function": {
            "name": "search",
            "parameters": {"type": "object", "properties": {"query": {"type": "string"}}},
        },
    },
]

# Markup that must never reach content or reasoning of a well-formed case.
MARKUP = (
    "<think>",
    "</think>",
    "<tool_call>",
    "</tool_call>",
    "<function=",
    "</function>",
    "<parameter=",
    "</parameter>",
    "<|python_tag|>",
    "[TOOL_CALLS]",
    "[ARGS]",
    "[CALL_ID]",
    "｜tool▁",
)

_ID = re.compile(r"call_[A-Za-z0-9]{24}")


def stream(text: str, pieces: list[str] | None = None, **kw: Any) -> list[dict[str, Any]]:
    """Deltas of ``text`` fed as ``pieces`` (which must join to ``text``)."""
    pieces = [text] if pieces is None else pieces
    assert "".join(pieces) == text
    parser = StreamParser(seed=kw.pop("seed", 7), **kw)
    deltas: list[dict[str, Any]] = []
    for piece in pieces:
        deltas += parser.feed(piece)
    return deltas + parser.finish()


def random_split(text: str, rng: random.Random, max_len: int = 12) -> list[str]:
    pieces, i = [], 0
    while i < len(text):
        k = rng.randint(1, max_len)
        pieces.append(text[i : i + k])
        i += k
    return pieces


def chunkings(text: str, seed: int = 0, n_random: int = 10) -> Iterator[list[str]]:
    """Whole, one character at a time, every two-way split, and random splits."""
    yield [text]
    yield list(text)
    for k in range(1, len(text)):
        yield [text[:k], text[k:]]
    rng = random.Random(seed)
    for _ in range(n_random):
        yield random_split(text, rng)


def check_deltas(deltas: list[dict[str, Any]]) -> None:
    """The delta contract: one kind per delta; first call fragment carries index, id,
    type and name; later fragments only index and arguments; indices in order."""
    seen: set[int] = set()
    for delta in deltas:
        assert len(delta) == 1, delta
        ((kind, value),) = delta.items()
        assert kind in ("content", "reasoning_content", "tool_calls"), delta
        if kind != "tool_calls":
            assert isinstance(value, str) and value, delta
            continue
        for frag in value:
            index = frag["index"]
            if index in seen:
                assert set(frag) == {"index", "function"}, frag
                assert set(frag["function"]) == {"arguments"}, frag
            else:
                assert index == len(seen), f"index {index} out of order"
                seen.add(index)
                assert set(frag) == {"index", "id", "type", "function"}, frag
                assert frag["type"] == "function" and _ID.fullmatch(frag["id"]), frag
                assert set(frag["function"]) == {"name", "arguments"}, frag


def check_message(message: dict[str, Any], markup_free: bool = True) -> None:
    for call in message["tool_calls"]:
        json.loads(call["function"]["arguments"])
    if markup_free:
        for field in ("content", "reasoning_content"):
            for tag in MARKUP:
                assert tag not in (message[field] or ""), (field, tag, message[field])


def check_invariant(text: str, markup_free: bool = True, **kw: Any) -> dict[str, Any]:
    """Every chunking reconstructs exactly ``parse(text)``; returns that message."""
    expected = parse(text, seed=7, **kw)
    check_message(expected, markup_free)
    for pieces in chunkings(text):
        deltas = stream(text, pieces, **kw)
        check_deltas(deltas)
        got = reconstruct(deltas)
        assert got == expected, f"chunking {pieces!r} differs:\n{got}\n!=\n{expected}"
    return expected


def strip_ids(message: dict[str, Any]) -> dict[str, Any]:
    calls = [
        {"name": c["function"]["name"], "arguments": json.loads(c["function"]["arguments"])}
        for c in message["tool_calls"]
    ]
    return {
        "reasoning_content": message["reasoning_content"],
        "content": message["content"],
        "tool_calls": calls,
    }
