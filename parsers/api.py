"""Non-streaming parse, built on the stream parser so the two can never disagree."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from parsers.deltas import reconstruct
from parsers.stream import StreamParser


def parse(
    text: str,
    tool_format: str | None = None,
    reasoning_format: str | None = None,
    tools: Sequence[Mapping[str, Any]] | None = None,
    think_open: bool | None = None,
    seed: int | None = None,
) -> dict[str, Any]:
    """Parse a whole generation into ``{"reasoning_content", "content", "tool_calls"}``.

    Equal to :func:`parsers.deltas.reconstruct` of the deltas a :class:`StreamParser`
    with the same arguments gives for any chunking of ``text`` (ids too, given a seed).
    """
    parser = StreamParser(tool_format, reasoning_format, tools, think_open, seed)
    return reconstruct(parser.feed(text) + parser.finish())
