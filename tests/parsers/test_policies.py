"""Unknown names and malformed calls (guarantee 5): the policy of parsers/calls.py, the
same in stream and parse, never harming the neighbouring calls."""

from __future__ import annotations

import json
from typing import Any

import pytest
from parsing_kit import TOOLS, check_invariant, stream

DS_BEGIN, DS_END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
DS_CALL, DS_CALL_END, DS_SEP = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"


def _calls(message: dict[str, Any]) -> list[tuple[str, Any]]:
    return [
        (c["function"]["name"], json.loads(c["function"]["arguments"]))
        for c in message["tool_calls"]
    ]


# format -> (good call A, unknown-name call, good call B); A and B call search/now.
UNKNOWN = {
    "hermes": (
        '<tool_call>{"name": "search", "arguments": {"query": "a"}}</tool_call>',
        '<tool_call>{"name": "bogus", "arguments": {"x": "</tool_call>"}}</tool_call>',
        '<tool_call>{"name": "now"}</tool_call>',
    ),
    "qwen3_coder": (
        "<tool_call>\n<function=search>\n<parameter=query>\na\n</parameter>\n"
        "</function>\n</tool_call>",
        "<tool_call>\n<function=bogus>\n<parameter=x>\n1\n</parameter>\n</function>\n</tool_call>",
        "<tool_call>\n<function=now>\n</function>\n</tool_call>",
    ),
    "mistral": (
        '[TOOL_CALLS]search[ARGS]{"query": "a"}',
        '[TOOL_CALLS]bogus[ARGS]{"x": 1}',
        "[TOOL_CALLS]now[ARGS]{}",
    ),
    "deepseek_v31": (
        f'{DS_CALL}search{DS_SEP}{{"query": "a"}}{DS_CALL_END}',
        f'{DS_CALL}bogus{DS_SEP}{{"x": "{DS_CALL_END}"}}{DS_CALL_END}',
        f"{DS_CALL}now{DS_SEP}{{}}{DS_CALL_END}",
    ),
    "deepseek_v3": (
        f'{DS_CALL}function{DS_SEP}search\n```json\n{{"query": "a"}}\n```{DS_CALL_END}',
        f'{DS_CALL}function{DS_SEP}bogus\n```json\n{{"x": 1}}\n```{DS_CALL_END}',
        f"{DS_CALL}function{DS_SEP}now\n```json\n{{}}\n```{DS_CALL_END}",
    ),
}


@pytest.mark.parametrize("fmt", sorted(UNKNOWN))
def test_unknown_name_becomes_content_and_neighbours_survive(fmt: str) -> None:
    good_a, bogus, good_b = UNKNOWN[fmt]
    wrap = (DS_BEGIN, DS_END) if fmt.startswith("deepseek") else ("", "")
    text = wrap[0] + good_a + bogus + good_b + wrap[1]
    message = check_invariant(text, markup_free=False, tool_format=fmt, tools=TOOLS)
    assert _calls(message) == [("search", {"query": "a"}), ("now", {})]
    assert len({c["id"] for c in message["tool_calls"]}) == 2
    assert message["content"] == bogus
    # streaming never announced the rejected call
    deltas = stream(text, list(text), tool_format=fmt, tools=TOOLS)
    names = [f["function"].get("name") for d in deltas for f in d.get("tool_calls", ())]
    assert "bogus" not in names


def test_without_tools_any_name_is_a_call() -> None:
    message = check_invariant(
        '<tool_call>{"name": "bogus", "arguments": {"x": 1}}</tool_call>', tool_format="hermes"
    )
    assert _calls(message) == [("bogus", {"x": 1})]


@pytest.mark.parametrize(
    ("text", "content"),
    [
        ("<tool_call>not json</tool_call>", "<tool_call>not json</tool_call>"),
        ('<tool_call>{"name": 5}</tool_call>', '<tool_call>{"name": 5}</tool_call>'),
        ('<tool_call>{"arguments": {}}</tool_call>', '<tool_call>{"arguments": {}}</tool_call>'),
        ("<tool_call></tool_call>", "<tool_call></tool_call>"),
        ('<tool_call>{"name": "sea', '<tool_call>{"name": "sea'),  # cut off before the name
    ],
)
def test_broken_before_the_name_is_content(text: str, content: str) -> None:
    tail = '<tool_call>{"name": "now"}</tool_call>'
    full = text if text.endswith("sea") else text + tail
    message = check_invariant(full, markup_free=False, tool_format="hermes", tools=TOOLS)
    assert message["content"] == content
    assert _calls(message) == ([] if full == text else [("now", {})])


def test_broken_after_the_name_keeps_the_call_with_closed_arguments() -> None:
    text = (
        '<tool_call>{"name": "search", "arguments": {"query": "x" oops}}</tool_call>\n'
        '<tool_call>{"name": "get_weather", "arguments": {"city": "y", "days": }</tool_call>'
        '<tool_call>{"name": "now"}</tool_call>'
    )
    message = check_invariant(text, tool_format="hermes", tools=TOOLS)
    assert _calls(message) == [
        ("search", {"query": "x"}),
        ("get_weather", {"city": "y", "days": None}),
        ("now", {}),
    ]
    assert message["content"] is None


@pytest.mark.parametrize(
    ("cut", "args"),
    [
        ('{"city": "Pa', {"city": "Pa"}),
        ('{"city": "Pa\\u00', {"city": "Pa"}),
        ('{"city": "Pa\\', {"city": "Pa"}),
        ('{"city": "Pa", ', {"city": "Pa"}),
        ('{"city": "Pa", "da', {"city": "Pa", "da": None}),
        ('{"city": "Pa", "days"', {"city": "Pa", "days": None}),
        ('{"city": "Pa", "days": 1', {"city": "Pa", "days": 1}),
        ('{"city": "Pa", "days": -', {"city": "Pa", "days": 0}),
        ('{"city": "Pa", "days": 1.', {"city": "Pa", "days": 1.0}),
        ('{"tags": [tr', {"tags": [True]}),
        ('{"tags": ["a", ', {"tags": ["a"]}),
        ("", {}),
    ],
)
def test_cut_by_max_tokens_inside_arguments(cut: str, args: dict[str, Any]) -> None:
    text = '<tool_call>{"name": "get_weather", "arguments": ' + cut
    message = check_invariant(text, tool_format="hermes", tools=TOOLS)
    assert _calls(message) == [("get_weather", args)]


def test_qwen3_coder_cut_inside_a_value_and_bad_names() -> None:
    text = "<tool_call>\n<function=get_weather>\n<parameter=city>\nOs"
    assert _calls(check_invariant(text, tool_format="qwen3_coder", tools=TOOLS)) == [
        ("get_weather", {"city": "Os"})
    ]
    bad = "<tool_call>\n<function=get weather>\n</function>\n</tool_call>"
    message = check_invariant(
        bad + "<function=now></function>", markup_free=False, tool_format="qwen3_coder", tools=TOOLS
    )
    assert message["content"] == bad and _calls(message) == [("now", {})]


def test_mistral_list_with_a_bad_element() -> None:
    text = (
        '[TOOL_CALLS] [{"name": "bogus", "arguments": {}}, '
        '{"name": "search", "arguments": {"query": "q"}}]'
    )
    message = check_invariant(text, markup_free=False, tool_format="mistral", tools=TOOLS)
    assert message["content"] == '{"name": "bogus", "arguments": {}}'
    assert _calls(message) == [("search", {"query": "q"})]
    assert message["tool_calls"][0]["id"].startswith("call_")


def test_deepseek_broken_call_is_skipped_to_its_end() -> None:
    text = (
        f'{DS_BEGIN}{DS_CALL}search{DS_SEP}{{"query": "a" ??? }}{DS_CALL_END}'
        f"{DS_CALL}now{DS_SEP}{{}}{DS_CALL_END}{DS_END}after"
    )
    message = check_invariant(text, tool_format="deepseek_v31", tools=TOOLS)
    assert _calls(message) == [("search", {"query": "a"}), ("now", {})]
    assert message["content"] == "after"


def test_llama3_python_tag_without_json_is_content() -> None:
    text = '<|python_tag|>brave_search.call(query="x")'
    message = check_invariant(text, markup_free=False, tool_format="llama3_json", tools=TOOLS)
    assert message == {"reasoning_content": None, "content": text, "tool_calls": []}


@pytest.mark.parametrize(
    ("text", "content"),
    [
        ("Use the <tool_call> tag, ok?", "Use the <tool_call> tag, ok?"),
        (
            'a <tool_call>{"name": "bogus"}</tool_call> b',
            'a <tool_call>{"name": "bogus"}</tool_call> b',
        ),
        ('a\n<tool_call>{"name": "now"}</tool_call>\nb', "a\n\nb"),
    ],
)
def test_rejected_calls_keep_their_surrounding_text(text: str, content: str) -> None:
    message = check_invariant(text, markup_free=False, tool_format="hermes", tools=TOOLS)
    assert message["content"] == content
