"""Guarantee 8: property-based fuzzing.

* Random soup of text, tags, tag fragments and JSON pieces: parsing never raises, every
  reported call has valid JSON arguments and a known name, and the result is the same
  for the whole text, one character at a time and random splits.
* Round trip: random calls (random JSON arguments) rendered in each format around
  random content and reasoning come back exactly, under random chunking.
* Text on both sides of calls stays two pieces: the whitespace around the calls (a
  newline where there was none) separates them, under random chunking.
"""

from __future__ import annotations

import json
import random
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from parsing_kit import TOOLS, check_deltas, check_message, random_split, stream

from parsers import TOOL_FORMATS, parse, reconstruct

DS_BEGIN, DS_END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
DS_CALL, DS_CALL_END, DS_SEP = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"
TAGS = [
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
    DS_BEGIN,
    DS_END,
    DS_CALL,
    DS_CALL_END,
    DS_SEP,
    "```json",
    "```",
]
JSON_BITS = [
    '{"name": ',
    '"get_weather"',
    '"now"',
    '"bogus"',
    '"arguments": ',
    '"parameters": ',
    "{",
    "}",
    "[",
    "]",
    ",",
    ":",
    '"',
    "\\",
    "\\u00e9",
    "1",
    "-2.5e3",
    "true",
    "null",
    '"city"',
    '"x<tool_call>y"',
    ";",
    ">",
    "now",
    "search",
    "query",
    "\n",
    " ",
]
FRAGMENTS = TAGS + [t[: len(t) // 2] for t in TAGS] + [t[len(t) // 2 :] for t in TAGS] + JSON_BITS
NAMES = {"get_weather", "now", "search"}

soup = st.lists(st.sampled_from(FRAGMENTS) | st.text(max_size=3), max_size=40).map("".join)
formats = st.sampled_from([None, *sorted(TOOL_FORMATS)])
reasonings = st.sampled_from([None, "qwen3", "deepseek_r1"])


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    text=soup,
    fmt=formats,
    reasoning=reasonings,
    think_open=st.sampled_from([None, True]),
    with_tools=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_soup_never_raises_and_is_chunking_invariant(
    text: str,
    fmt: str | None,
    reasoning: str | None,
    think_open: bool | None,
    with_tools: bool,
    seed: int,
) -> None:
    kw: dict[str, Any] = {
        "tool_format": fmt,
        "reasoning_format": reasoning,
        "think_open": think_open,
        "tools": TOOLS if with_tools else None,
    }
    expected = parse(text, seed=7, **kw)
    check_message(expected, markup_free=False)
    if with_tools:
        assert {c["function"]["name"] for c in expected["tool_calls"]} <= NAMES
    rng = random.Random(seed)
    for pieces in (list(text), random_split(text, rng, 4), random_split(text, rng, 30)):
        deltas = stream(text, pieces, **kw)
        check_deltas(deltas)
        assert reconstruct(deltas) == expected, pieces


# ---- round trip -------------------------------------------------------------------

_safe_text = st.text(
    alphabet=st.characters(blacklist_characters="<>[]{}｜\\\r", blacklist_categories=("Cs",)),
    max_size=30,
).map(str.strip)
_scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(10**6), 10**6)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=10)
)
_json = st.recursive(
    _scalars,
    lambda k: st.lists(k, max_size=3) | st.dictionaries(st.text(max_size=4), k, max_size=3),
    max_leaves=8,
)
_args = st.dictionaries(st.text(max_size=6), _json, max_size=4)
_xml_args = st.dictionaries(
    st.from_regex(r"[a-z_]{1,8}", fullmatch=True),
    st.text(max_size=20).filter(lambda v: "<" not in v),
    max_size=3,
)


def _render(fmt: str, calls: list[tuple[str, dict[str, Any]]]) -> str:
    if fmt == "hermes":
        return "\n".join(
            f"<tool_call>\n{json.dumps({'name': n, 'arguments': a})}\n</tool_call>"
            for n, a in calls
        )
    if fmt == "llama3_json":
        return "<|python_tag|>" + "; ".join(
            json.dumps({"name": n, "parameters": a}) for n, a in calls
        )
    if fmt == "mistral":
        return "[TOOL_CALLS] " + json.dumps([{"name": n, "arguments": a} for n, a in calls])
    if fmt == "qwen3_coder":
        return "\n".join(
            "<tool_call>\n<function="
            + n
            + ">\n"
            + "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in a.items())
            + "</function>\n</tool_call>"
            for n, a in calls
        )
    if fmt == "deepseek_v3":
        body = "".join(
            f"{DS_CALL}function{DS_SEP}{n}\n```json\n{json.dumps(a)}\n```{DS_CALL_END}"
            for n, a in calls
        )
    else:
        body = "".join(f"{DS_CALL}{n}{DS_SEP}{json.dumps(a)}{DS_CALL_END}" for n, a in calls)
    return DS_BEGIN + body + DS_END


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    data=st.data(),
    fmt=st.sampled_from(sorted(TOOL_FORMATS)),
    reasoning=_safe_text,
    content=_safe_text,
    seed=st.integers(0, 2**16),
)
def test_round_trip(data: st.DataObject, fmt: str, reasoning: str, content: str, seed: int) -> None:
    args = _xml_args if fmt == "qwen3_coder" else _args
    calls = data.draw(st.lists(st.tuples(st.sampled_from(sorted(NAMES)), args), max_size=3))
    text = (f"<think>\n{reasoning}\n</think>\n\n" if reasoning else "") + content
    if calls:
        text += "\n" + _render(fmt, calls)
    tools = None if fmt == "qwen3_coder" else TOOLS  # no schema: every value is a string
    kw: dict[str, Any] = {"tool_format": fmt, "reasoning_format": "qwen3", "tools": tools}
    expected = {
        "reasoning_content": reasoning or None,
        "content": content or None,
        "tool_calls": [{"name": n, "arguments": a} for n, a in calls],
    }
    rng = random.Random(seed)
    for pieces in ([text], random_split(text, rng, 3), random_split(text, rng, 20)):
        message = reconstruct(stream(text, pieces, **kw))
        got = {
            "reasoning_content": message["reasoning_content"],
            "content": message["content"],
            "tool_calls": [
                {"name": c["function"]["name"], "arguments": json.loads(c["function"]["arguments"])}
                for c in message["tool_calls"]
            ],
        }
        assert got == expected


_gaps = st.sampled_from(["", " ", "\n", "\n\n", " \n"])


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    data=st.data(),
    fmt=st.sampled_from(["deepseek_v3", "deepseek_v31", "hermes", "qwen3_coder"]),
    before=_safe_text.filter(bool),
    after=_safe_text.filter(bool),
    gap1=_gaps,
    gap2=_gaps,
    seed=st.integers(0, 2**16),
)
def test_text_after_calls_is_not_glued_to_text_before(
    data: st.DataObject,
    fmt: str,
    before: str,
    after: str,
    gap1: str,
    gap2: str,
    seed: int,
) -> None:
    args = _xml_args if fmt == "qwen3_coder" else _args
    calls = data.draw(
        st.lists(st.tuples(st.sampled_from(sorted(NAMES)), args), min_size=1, max_size=3)
    )
    text = before + gap1 + _render(fmt, calls) + gap2 + after
    tools = None if fmt == "qwen3_coder" else TOOLS
    kw: dict[str, Any] = {"tool_format": fmt, "tools": tools}
    rng = random.Random(seed)
    for pieces in ([text], list(text), random_split(text, rng, 7)):
        message = reconstruct(stream(text, pieces, **kw))
        assert len(message["tool_calls"]) == len(calls)
        content = message["content"]
        assert content.startswith(before) and content.endswith(after), pieces
        middle = content[len(before) : len(content) - len(after)]
        assert middle and not middle.strip(), pieces  # a separator, only whitespace
        if len(calls) == 1:  # the whitespace that touched the call, or a newline
            assert middle == (gap1 + gap2 or "\n"), pieces


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    data=st.data(),
    fmt=st.sampled_from(sorted(TOOL_FORMATS)),
    think_open=st.sampled_from([None, True]),
    seed=st.integers(0, 2**16),
)
def test_mutated_calls_stay_consistent(
    data: st.DataObject, fmt: str, think_open: bool | None, seed: int
) -> None:
    """Near-valid text (valid calls with spans cut, repeated or spliced) is where parsers
    break; the invariants must hold there too."""
    args = _xml_args if fmt == "qwen3_coder" else _args
    calls = data.draw(
        st.lists(st.tuples(st.sampled_from([*NAMES, "bogus"]), args), min_size=1, max_size=3)
    )
    text = "ok <think>hm</think> " + _render(fmt, calls)
    rng = random.Random(seed)
    for _ in range(rng.randint(1, 3)):
        a, b = sorted(rng.randrange(len(text) + 1) for _ in range(2))
        op = rng.randrange(3)
        if op == 0:
            text = text[:a] + text[b:]
        elif op == 1:
            text = text[:b] + text[a:b] + text[b:]
        else:
            text = text[:a] + rng.choice(FRAGMENTS) + text[a:]
    kw: dict[str, Any] = {
        "tool_format": fmt,
        "reasoning_format": "qwen3",
        "think_open": think_open,
        "tools": TOOLS,
    }
    expected = parse(text, seed=7, **kw)
    check_message(expected, markup_free=False)
    assert {c["function"]["name"] for c in expected["tool_calls"]} <= NAMES
    for pieces in (list(text), random_split(text, rng, 5)):
        deltas = stream(text, pieces, **kw)
        check_deltas(deltas)
        assert reconstruct(deltas) == expected, pieces
