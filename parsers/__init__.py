"""Streaming reasoning and tool-call parsers (pure Python; imports nothing from mmserve).

::

    p = StreamParser(tool_format="hermes", reasoning_format="qwen3", tools=tools)
    deltas = p.feed(chunk)      # OpenAI chat.completion.chunk ``delta`` dicts
    deltas += p.finish()        # at the end of generation, also when cut by max_tokens
    message = parse(text, tool_format="hermes", reasoning_format="qwen3", tools=tools)

See parsers/README.md for the formats, the delta contract and the policies.
"""

from parsers.api import parse
from parsers.deltas import Delta, reconstruct
from parsers.detect import detect_formats, think_open_from_prompt
from parsers.formats import TOOL_FORMATS
from parsers.reasoning import REASONING_FORMATS
from parsers.stream import StreamParser

__all__ = [
    "REASONING_FORMATS",
    "TOOL_FORMATS",
    "Delta",
    "StreamParser",
    "detect_formats",
    "parse",
    "reconstruct",
    "think_open_from_prompt",
]
