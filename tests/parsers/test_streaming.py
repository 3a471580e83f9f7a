"""What the client sees while the text streams: hold-back (guarantee 2), arguments that
stream before the call closes (3), ``{}`` for no parameters (4), the delta contract."""

from __future__ import annotations

import json
from typing import Any

import pytest
from parsing_kit import TOOLS, check_deltas, stream

from parsers import StreamParser, parse, reconstruct

DS_BEGIN, DS_END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
DS_CALL, DS_CALL_END, DS_SEP = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"


def _text(deltas: list[dict[str, Any]], kind: str) -> str:
    return "".join(d.get(kind, "") for d in deltas)


def test_holds_back_only_what_could_be_a_tag() -> None:
    p = StreamParser(tool_format="hermes", reasoning_format="qwen3")
    assert p.feed("Hello wor") == [{"content": "Hello wor"}]
    assert p.feed("ld <tool") == [{"content": "ld"}]  # " <tool" may still be markup
    assert p.feed("s are fun") == [{"content": " <tools are fun"}]
    assert p.finish() == []


def test_split_close_tag_never_leaks() -> None:
    p = StreamParser(reasoning_format="qwen3")
    first = p.feed("<think>abc</th")
    second = p.feed("ink>def")
    assert first == [{"reasoning_content": "abc"}]
    assert second == [{"content": "def"}]


def test_reasoning_streams_before_it_closes() -> None:
    p = StreamParser(reasoning_format="deepseek_r1")
    got = [p.feed(w + " ") for w in "one two three".split()]
    assert all(d and "reasoning_content" in d[0] for d in got)


def test_several_calls_in_one_chunk_keep_their_braces() -> None:
    text = (
        '<tool_call>{"name": "search", "arguments": {"query": {"deep": [1, {"x": 2}]}}}'
        '</tool_call><tool_call>{"name": "now", "arguments": {}}</tool_call>'
    )
    p = StreamParser(tool_format="hermes", seed=1)
    message = reconstruct(p.feed(text) + p.finish())
    args = [json.loads(c["function"]["arguments"]) for c in message["tool_calls"]]
    assert args == [{"query": {"deep": [1, {"x": 2}]}}, {}]


LONG = "lorem ipsum dolor sit amet " * 100

STREAMING = {
    "hermes": ('<tool_call>{"name": "search", "arguments": {"query": "', LONG, '"}}</tool_call>'),
    "qwen3_coder": (
        "<tool_call>\n<function=search>\n<parameter=query>\n",
        LONG,
        "\n</parameter>\n</function>\n</tool_call>",
    ),
    "llama3_json": ('<|python_tag|>{"name": "search", "parameters": {"query": "', LONG, '"}}'),
    "mistral": ('[TOOL_CALLS]search[ARGS]{"query": "', LONG, '"}'),
    "deepseek_v3": (
        f'{DS_BEGIN}{DS_CALL}function{DS_SEP}search\n```json\n{{"query": "',
        LONG,
        f'"}}\n```{DS_CALL_END}{DS_END}',
    ),
    "deepseek_v31": (
        f'{DS_BEGIN}{DS_CALL}search{DS_SEP}{{"query": "',
        LONG,
        f'"}}{DS_CALL_END}{DS_END}',
    ),
}


@pytest.mark.parametrize("fmt", sorted(STREAMING))
def test_string_arguments_stream_before_the_call_closes(fmt: str) -> None:
    head, body, tail = STREAMING[fmt]
    p = StreamParser(tool_format=fmt, tools=TOOLS, seed=3)
    before: list[dict[str, Any]] = []
    text = head + body
    for k in range(0, len(text), 8):
        before += p.feed(text[k : k + 8])
    after = p.feed(tail) + p.finish()
    check_deltas(before + after)
    frags = [f for d in before for f in d.get("tool_calls", ())]
    assert frags and frags[0]["function"]["name"] == "search"
    streamed = "".join(f["function"]["arguments"] for f in frags)
    assert len(frags) > 100, "arguments must arrive in many fragments"
    assert LONG[:-8] in json.loads(streamed + '"}')["query"]
    message = reconstruct(before + after)
    assert json.loads(message["tool_calls"][0]["function"]["arguments"]) == {"query": LONG}


NO_PARAMS = {
    "hermes": '<tool_call>\n{"name": "now", "arguments": {}}\n</tool_call>',
    "hermes-no-key": '<tool_call>{"name": "now"}</tool_call>',
    "qwen3_coder": "<tool_call>\n<function=now>\n</function>\n</tool_call>",
    "llama3_json": '{"name": "now", "parameters": {}}',
    "llama3_json-no-key": '<|python_tag|>{"name": "now"}',
    "mistral": "[TOOL_CALLS]now[ARGS]{}",
    "mistral-list": '[TOOL_CALLS] [{"name": "now"}]',
    "deepseek_v3": f"{DS_BEGIN}{DS_CALL}function{DS_SEP}now\n```json\n{{}}\n```{DS_CALL_END}",
    "deepseek_v31": f"{DS_BEGIN}{DS_CALL}now{DS_SEP}{{}}{DS_CALL_END}{DS_END}",
}


@pytest.mark.parametrize("case", sorted(NO_PARAMS))
def test_no_parameters_give_empty_object(case: str) -> None:
    fmt = case.split("-")[0]
    text = NO_PARAMS[case]
    for pieces in ([text], list(text)):
        message = reconstruct(stream(text, pieces, tool_format=fmt, tools=TOOLS))
        assert [c["function"]["arguments"] for c in message["tool_calls"]] == ["{}"]
        assert message["content"] is None


def test_name_is_sent_before_the_arguments_close() -> None:
    p = StreamParser(tool_format="hermes", tools=TOOLS)
    deltas = p.feed('<tool_call>{"name": "search", "arguments": {"qu')
    (frag,) = deltas[0]["tool_calls"]
    assert frag["function"]["name"] == "search" and frag["index"] == 0


def test_ids_are_reproducible_with_a_seed_and_random_without() -> None:
    text = '<tool_call>{"name": "now"}</tool_call>' * 2
    a = parse(text, tool_format="hermes", seed=5)
    b = parse(text, tool_format="hermes", seed=5)
    c = parse(text, tool_format="hermes")
    ids = [x["id"] for x in a["tool_calls"]]
    assert ids == [x["id"] for x in b["tool_calls"]] and len(set(ids)) == 2
    assert ids != [x["id"] for x in c["tool_calls"]]


def test_finish_is_idempotent_and_closes_the_stream() -> None:
    p = StreamParser(reasoning_format="qwen3")
    assert p.feed("<think>x ") == [{"reasoning_content": "x"}]
    assert p.finish() == [{"reasoning_content": " "}]  # kept: no markup followed
    assert p.finish() == []
    with pytest.raises(RuntimeError):
        p.feed("more")


def test_bad_options_are_reported_clearly() -> None:
    with pytest.raises(ValueError, match="tool_format"):
        StreamParser(tool_format="nope")
    with pytest.raises(ValueError, match="reasoning_format"):
        StreamParser(reasoning_format="nope")
    with pytest.raises(ValueError, match=r"tools\[0\]"):
        StreamParser(tool_format="hermes", tools=[{"type": "function"}])


def test_no_formats_is_a_pass_through() -> None:
    text = "  <think>a</think>\n<tool_call>{}</tool_call>  "
    assert _text(stream(text, list(text)), "content") == text
