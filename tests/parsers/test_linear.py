"""Guarantee 7: the cost of a chunk does not grow with what came before it.

Feeding 10x more text in the same small chunks must cost about 10x, not 100x; the
bound (30x) is generous so that a loaded machine does not make the test flaky.
"""

from __future__ import annotations

import time

import pytest

from parsers import StreamParser

_WORDS = "lorem ipsum < dolor [sit] amet, {x} "
_HEADS = {
    "content": ("hermes", "qwen3", "Answer: "),
    "reasoning": ("hermes", "qwen3", "<think>"),
    "hermes-string": ("hermes", "qwen3", '<tool_call>{"name": "s", "arguments": {"q": "'),
    "hermes-array": ("hermes", None, '<tool_call>{"name": "s", "arguments": {"q": [1'),
    "args-before-name": ("hermes", None, '<tool_call>{"arguments": {"q": "'),
    "qwen3_coder-value": ("qwen3_coder", None, "<tool_call><function=s><parameter=q>"),
    "deepseek_v31": ("deepseek_v31", None, '<｜tool▁call▁begin｜>s<｜tool▁sep｜>{"q": "'),
}


def _body(kind: str, n: int) -> str:
    unit = ", 2" if kind == "hermes-array" else _WORDS
    return (unit * (n // len(unit) + 1))[:n]


def _feed_time(kind: str, n: int) -> float:
    tool_format, reasoning_format, head = _HEADS[kind]
    text = head + _body(kind, n)
    parser = StreamParser(tool_format=tool_format, reasoning_format=reasoning_format)
    start = time.perf_counter()
    for k in range(0, len(text), 5):
        parser.feed(text[k : k + 5])
    parser.finish()
    return time.perf_counter() - start


@pytest.mark.parametrize("kind", sorted(_HEADS))
def test_cost_is_linear_in_the_text(kind: str) -> None:
    small = min(_feed_time(kind, 10_000) for _ in range(2))
    large = _feed_time(kind, 100_000)
    assert large / small < 30, f"{kind}: 10k chars {small:.3f}s, 100k chars {large:.3f}s"
