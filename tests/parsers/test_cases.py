"""The case table: every format, each case checked under every chunking (guarantee 1),
for markup-free content/reasoning and valid argument JSON (guarantee 2), and against
its expected message."""

from __future__ import annotations

from typing import Any

import pytest
from parsing_kit import TOOLS, check_invariant, strip_ids

DS_BEGIN, DS_END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
DS_CALL, DS_CALL_END, DS_SEP = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"

# (id, parser kwargs, text, (reasoning, content, [(name, arguments)]))
CASES: list[tuple[str, dict[str, Any], str, tuple[Any, Any, list[tuple[str, Any]]]]] = [
    # --- reasoning only
    (
        "r-qwen3",
        {"reasoning_format": "qwen3"},
        "<think>\nStep 1.\n</think>\n\nAnswer.",
        ("Step 1.", "Answer.", []),
    ),
    (
        "r-qwen3-no-think",
        {"reasoning_format": "qwen3"},
        "Just an answer.",
        (None, "Just an answer.", []),
    ),
    (
        "r-r1-missing-open",
        {"reasoning_format": "deepseek_r1"},
        "I ponder.\n</think>\n\nDone.",
        ("I ponder.", "Done.", []),
    ),
    (
        "r-r1-with-open",
        {"reasoning_format": "deepseek_r1"},
        "<think>\nI ponder.</think>Done.",
        ("I ponder.", "Done.", []),
    ),
    (
        "r-empty-block",
        {"reasoning_format": "qwen3"},
        "<think></think>\n\nHi there",
        (None, "Hi there", []),
    ),
    (
        "r-truncated",
        {"reasoning_format": "qwen3"},
        "<think>\nStill thinking about <thi",
        ("Still thinking about <thi", None, []),
    ),
    (
        "r-think-open",
        {"reasoning_format": "qwen3", "think_open": True},
        "Hmm.\n</think>\nYes.",
        ("Hmm.", "Yes.", []),
    ),
    (
        "r-r1-closed-prompt",
        {"reasoning_format": "deepseek_r1", "think_open": False},
        "Plain.",
        (None, "Plain.", []),
    ),
    ("r-off", {}, "<think>x</think>y", (None, "<think>x</think>y", [])),
    (
        "r-stray-tags",
        {"reasoning_format": "qwen3"},
        "a </think>b<think>c<think>d</think>e",
        ("cd", "a be", []),
    ),
    # --- hermes
    (
        "h-basic",
        {"tool_format": "hermes", "reasoning_format": "qwen3"},
        "<think>\nPlan.\n</think>\n\nChecking.\n<tool_call>\n"
        '{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}\n</tool_call>',
        ("Plan.", "Checking.", [("get_weather", {"city": "Paris", "days": 3})]),
    ),
    (
        "h-parallel",
        {"tool_format": "hermes"},
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "A"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "now", "arguments": {}}\n</tool_call>\n'
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "B"}}\n</tool_call>',
        (None, None, [("get_weather", {"city": "A"}), ("now", {}), ("get_weather", {"city": "B"})]),
    ),
    (
        "h-compact",
        {"tool_format": "hermes"},
        '<tool_call>{"name":"now","arguments":{}}</tool_call>',
        (None, None, [("now", {})]),
    ),
    (
        "h-no-args-key",
        {"tool_format": "hermes"},
        '<tool_call>{"name": "now"}</tool_call>',
        (None, None, [("now", {})]),
    ),
    (
        "h-args-null",
        {"tool_format": "hermes"},
        '<tool_call>{"name": "now", "arguments": null}</tool_call>',
        (None, None, [("now", {})]),
    ),
    (
        "h-tags-in-strings",
        {"tool_format": "hermes", "reasoning_format": "qwen3"},
        '<tool_call>{"name": "search", "arguments": {"query": "</tool_call> <think> }{ \\"q\\""}}'
        "</tool_call>",
        (None, None, [("search", {"query": '</tool_call> <think> }{ "q"'})]),
    ),
    (
        "h-escapes",
        {"tool_format": "hermes"},
        '<tool_call>{"name": "get_weather", "arguments": {"city": '
        '"Z\\u00fcrich \\ud83d\\ude00 \\\\",'
        ' "tags": ["a", [], {}], "ratio": -1.5e3, "metric": false, "opts": null}}</tool_call>',
        (
            None,
            None,
            [
                (
                    "get_weather",
                    {
                        "city": "Zürich 😀 \\",
                        "tags": ["a", [], {}],
                        "ratio": -1500.0,
                        "metric": False,
                        "opts": None,
                    },
                )
            ],
        ),
    ),
    (
        "h-args-before-name",
        {"tool_format": "hermes"},
        '<tool_call>{"arguments": {"query": "x"}, "name": "search"}</tool_call>',
        (None, None, [("search", {"query": "x"})]),
    ),
    (
        "h-args-as-string",
        {"tool_format": "hermes"},
        '<tool_call>{"name": "search", "arguments": "{\\"query\\": \\"x\\"}"}</tool_call>',
        (None, None, [("search", {"query": "x"})]),
    ),
    (
        "h-call-in-reasoning",
        {"tool_format": "hermes", "reasoning_format": "qwen3", "think_open": True},
        'I should look.\n<tool_call>\n{"name": "now"}\n</tool_call>\nAfter.',
        ("I should look.", "After.", [("now", {})]),
    ),
    (
        "h-two-in-one-block",
        {"tool_format": "hermes"},
        '<tool_call>\n{"name": "now"}\n'
        '{"name": "search", "arguments": {"query": "q"}}\n</tool_call>',
        (None, None, [("now", {}), ("search", {"query": "q"})]),
    ),
    (
        "h-text-around",
        {"tool_format": "hermes"},
        'Before <b>bold</b>.\n<tool_call>{"name": "now"}</tool_call>\nAfter { it }.',
        (None, "Before <b>bold</b>.\n\nAfter { it }.", [("now", {})]),
    ),
    (
        "h-text-after-call",
        {"tool_format": "hermes"},
        'Checking.\n<tool_call>{"name": "now"}</tool_call>\nI called the tool.',
        (None, "Checking.\n\nI called the tool.", [("now", {})]),
    ),
    (
        "h-text-glued-to-call",
        {"tool_format": "hermes"},
        'Checking.<tool_call>{"name": "now"}</tool_call>Done.',
        (None, "Checking.\nDone.", [("now", {})]),
    ),
    (
        "h-truncated-args",
        {"tool_format": "hermes"},
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Par',
        (None, None, [("get_weather", {"city": "Par"})]),
    ),
    # --- qwen3_coder
    (
        "qc-types",
        {"tool_format": "qwen3_coder", "tools": TOOLS},
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nNew\nYork\n</parameter>\n"
        "<parameter=days>\n5\n</parameter>\n<parameter=ratio>\n0.5\n</parameter>\n"
        '<parameter=metric>\nTrue\n</parameter>\n<parameter=opts>\n{"a": [1, 2]}\n</parameter>\n'
        "<parameter=tags>\n['x', 'y']\n</parameter>\n<parameter=unit>\nc\n</parameter>\n"
        "</function>\n</tool_call>",
        (
            None,
            None,
            [
                (
                    "get_weather",
                    {
                        "city": "New\nYork",
                        "days": 5,
                        "ratio": 0.5,
                        "metric": True,
                        "opts": {"a": [1, 2]},
                        "tags": ["x", "y"],
                        "unit": "c",
                    },
                )
            ],
        ),
    ),
    (
        "qc-parallel",
        {"tool_format": "qwen3_coder", "reasoning_format": "qwen3", "tools": TOOLS},
        "<think>ok</think>\nSure.\n<tool_call>\n<function=now>\n</function>\n</tool_call>\n"
        "<tool_call>\n<function=search>\n<parameter=query>\na < b && c > d\n</parameter>\n"
        "</function>\n</tool_call>",
        ("ok", "Sure.", [("now", {}), ("search", {"query": "a < b && c > d"})]),
    ),
    (
        "qc-code-value",
        {"tool_format": "qwen3_coder", "tools": TOOLS},
        '<tool_call>\n<function=search>\n<parameter=query>\n<div class="x">\n  "quoted"\\n\t'
        "</div>\n\n</parameter>\n</function>\n</tool_call>",
        (None, None, [("search", {"query": '<div class="x">\n  "quoted"\\n\t</div>\n'})]),
    ),
    (
        "qc-blank-lines",
        {"tool_format": "qwen3_coder", "tools": TOOLS},
        "<tool_call>\n<function=search>\n<parameter=query>\n\n\nX\n\n\n</parameter>\n</function>",
        (None, None, [("search", {"query": "\n\nX\n\n"})]),
    ),
    (
        "qc-bare-function",
        {"tool_format": "qwen3_coder", "tools": TOOLS},
        "Run it.\n<function=search>\n<parameter=query>\nx\n</parameter>\n</function>",
        (None, "Run it.", [("search", {"query": "x"})]),
    ),
    (
        "qc-missing-param-end",
        {"tool_format": "qwen3_coder", "tools": TOOLS},
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n<parameter=days>\n2\n"
        "</function>\n</tool_call>",
        (None, None, [("get_weather", {"city": "Oslo", "days": 2})]),
    ),
    (
        "qc-no-schema",
        {"tool_format": "qwen3_coder"},
        "<tool_call><function=anything><parameter=n>42</parameter></function></tool_call>",
        (None, None, [("anything", {"n": "42"})]),
    ),
    (
        "qc-in-reasoning",
        {"tool_format": "qwen3_coder", "reasoning_format": "deepseek_r1"},
        "Need a tool.<tool_call>\n<function=now>\n</function>\n</tool_call>",
        ("Need a tool.", None, [("now", {})]),
    ),
    # --- llama3_json
    (
        "ll-python-tag",
        {"tool_format": "llama3_json", "tools": TOOLS},
        '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Oslo"}}; '
        '{"name": "now", "parameters": {}}',
        (None, None, [("get_weather", {"city": "Oslo"}), ("now", {})]),
    ),
    (
        "ll-bare",
        {"tool_format": "llama3_json", "tools": TOOLS},
        '\n{"type": "function", "name": "search", "arguments": {"query": "a;b"}}',
        (None, None, [("search", {"query": "a;b"})]),
    ),
    (
        "ll-json-content",
        {"tool_format": "llama3_json", "tools": TOOLS},
        '{"answer": 42, "name": "now"}',
        (None, '{"answer": 42, "name": "now"}', []),
    ),
    (
        "ll-json-with-name-is-content",
        {"tool_format": "llama3_json"},
        '{"name": "Bob", "age": 3}',
        (None, '{"name": "Bob", "age": 3}', []),
    ),
    (
        "ll-late-json-is-content",
        {"tool_format": "llama3_json", "tools": TOOLS},
        'Here: {"name": "now", "parameters": {}}',
        (None, 'Here: {"name": "now", "parameters": {}}', []),
    ),
    (
        "ll-after-reasoning",
        {"tool_format": "llama3_json", "reasoning_format": "deepseek_r1"},
        'Thinking.</think>\n{"name": "now", "parameters": {}}',
        ("Thinking.", None, [("now", {})]),
    ),
    # --- mistral
    (
        "m-list",
        {"tool_format": "mistral", "tools": TOOLS},
        '[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Rome"}}, '
        '{"name": "now", "arguments": {}, "id": "abc123xyz"}]',
        (None, None, [("get_weather", {"city": "Rome"}), ("now", {})]),
    ),
    (
        "m-v11",
        {"tool_format": "mistral", "tools": TOOLS},
        'Let me check.[TOOL_CALLS]get_weather[ARGS]{"city": "Rome"}[TOOL_CALLS]now[ARGS]{}',
        (None, "Let me check.", [("get_weather", {"city": "Rome"}), ("now", {})]),
    ),
    (
        "m-call-id",
        {"tool_format": "mistral", "tools": TOOLS},
        '[TOOL_CALLS]search[CALL_ID]a1B2c3D4e[ARGS]{"query": "[ARGS]"}',
        (None, None, [("search", {"query": "[ARGS]"})]),
    ),
    # --- deepseek
    (
        "ds3",
        {"tool_format": "deepseek_v3", "reasoning_format": "deepseek_r1", "tools": TOOLS},
        f"Weather needed.</think>Checking.{DS_BEGIN}{DS_CALL}function{DS_SEP}get_weather\n"
        f'```json\n{{"city": "Lima"}}\n```{DS_CALL_END}{DS_CALL}function{DS_SEP}now\n'
        f"```json\n{{}}\n```{DS_CALL_END}{DS_END}",
        ("Weather needed.", "Checking.", [("get_weather", {"city": "Lima"}), ("now", {})]),
    ),
    (
        "ds3-no-fence",
        {"tool_format": "deepseek_v3", "tools": TOOLS},
        f'{DS_BEGIN}{DS_CALL}function{DS_SEP}search\n{{"query": "```"}}{DS_CALL_END}{DS_END}',
        (None, None, [("search", {"query": "```"})]),
    ),
    (
        "ds31",
        {"tool_format": "deepseek_v31", "tools": TOOLS},
        f'Ok.{DS_BEGIN}{DS_CALL}get_weather{DS_SEP}{{"city": "Lima"}}{DS_CALL_END}'
        f"{DS_CALL}now{DS_SEP}{{}}{DS_CALL_END}{DS_END}",
        (None, "Ok.", [("get_weather", {"city": "Lima"}), ("now", {})]),
    ),
    (
        "ds31-in-reasoning",
        {"tool_format": "deepseek_v31", "reasoning_format": "deepseek_r1"},
        f'Hmm{DS_BEGIN}{DS_CALL}search{DS_SEP}{{"query": "{DS_CALL_END}"}}{DS_CALL_END}{DS_END}',
        ("Hmm", None, [("search", {"query": DS_CALL_END})]),
    ),
    # --- text on both sides of a call keeps a separator, in every format that lets text
    # follow a call
    (
        "sep-qwen3-coder",
        {"tool_format": "qwen3_coder"},
        "Checking.\n<tool_call>\n<function=now>\n</function>\n</tool_call>\nI called the tool.",
        (None, "Checking.\n\nI called the tool.", [("now", {})]),
    ),
    (
        "sep-llama3-json",
        {"tool_format": "llama3_json", "tools": TOOLS},
        'Checking.\n<|python_tag|>{"name": "now", "parameters": {}}\nI called the tool.',
        (None, "Checking.\nI called the tool.", [("now", {})]),
    ),
    (
        "sep-mistral-list",
        {"tool_format": "mistral", "tools": TOOLS},
        'Checking.\n[TOOL_CALLS] [{"name": "now", "arguments": {}}]\nI called the tool.',
        (None, "Checking.\n\nI called the tool.", [("now", {})]),
    ),
    (
        "sep-mistral-v11",
        {"tool_format": "mistral", "tools": TOOLS},
        "Checking.\n[TOOL_CALLS]now[ARGS]{}\nI called the tool.",
        (None, "Checking.\n\nI called the tool.", [("now", {})]),
    ),
    (
        "sep-ds31",
        {"tool_format": "deepseek_v31", "tools": TOOLS},
        f"Checking.\n{DS_BEGIN}{DS_CALL}now{DS_SEP}{{}}{DS_CALL_END}{DS_END}\nI called the tool.",
        (None, "Checking.\n\nI called the tool.", [("now", {})]),
    ),
]


@pytest.mark.parametrize(
    ("kw", "text", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_case(kw: dict[str, Any], text: str, expected: tuple[Any, Any, list[Any]]) -> None:
    markup_free = kw.get("tool_format") is not None or kw.get("reasoning_format") is not None
    message = check_invariant(text, markup_free=markup_free, **kw)
    reasoning, content, calls = expected
    want = {
        "reasoning_content": reasoning,
        "content": content,
        "tool_calls": [{"name": n, "arguments": a} for n, a in calls],
    }
    assert strip_ids(message) == want
