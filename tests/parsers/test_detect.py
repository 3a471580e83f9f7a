"""Format detection from chat templates, and whether a prompt leaves <think> open."""

from __future__ import annotations

import pytest

from parsers import detect_formats, think_open_from_prompt

QWEN3 = (
    '{%- if tools %}<tool_call>\\n{"name": <function-name>}</tool_call>{%- endif %}'
    "{{- '<|im_start|>assistant\\n<think>\\n\\n</think>\\n\\n' }}"
)
QWEN3_CODER = "<tool_call>\n<function=example>\n<parameter=x>\nv\n</parameter>\n</function>"
DS_V3 = (
    "<｜Assistant｜><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>' + tool['type'] + "
    "'<｜tool▁sep｜>' + name + '\\n```json\\n' + args + '\\n```<｜tool▁call▁end｜>'"
)
DS_V31 = (
    "<｜Assistant｜><think><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>'+ name + "
    "'<｜tool▁sep｜>' + args + '<｜tool▁call▁end｜>'"
)


@pytest.mark.parametrize(
    ("template", "expected"),
    [
        (QWEN3, ("hermes", "qwen3")),
        (QWEN3_CODER, ("qwen3_coder", None)),
        ("{{ '[TOOL_CALLS]' + tool_calls|tojson }}", ("mistral", None)),
        ("{%- if builtin_tools %}<|python_tag|>{% endif %}", ("llama3_json", None)),
        ("<|start_header_id|>ipython<|end_header_id|>", ("llama3_json", None)),
        (DS_V3, ("deepseek_v3", None)),
        (DS_V31, ("deepseek_v31", "deepseek_r1")),
        ("{{ messages }}", (None, None)),
    ],
)
def test_detect_formats(template: str, expected: tuple[str | None, str | None]) -> None:
    assert detect_formats(template) == expected


@pytest.mark.parametrize(
    ("prompt", "is_open"),
    [
        ("<|im_start|>assistant\n<think>\n", True),
        ("<｜User｜>hi<｜Assistant｜><think>\n", True),
        ("<|im_start|>assistant\n<think>\nLet me", True),
        ("<|im_start|>assistant\n<think>\n\n</think>\n\n", False),
        ("<|im_start|>user\nwhat is <think>?<|im_end|>\n<|im_start|>assistant\n", False),
        ("<|im_start|>assistant\n", False),
    ],
)
def test_think_open_from_prompt(prompt: str, is_open: bool) -> None:
    assert think_open_from_prompt(prompt) is is_open
