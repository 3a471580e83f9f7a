"""Guessing parser settings from a chat template and a rendered prompt."""

from __future__ import annotations

_DEEPSEEK_CALLS = "tool▁calls▁begin"
_TURN_MARKERS = (
    "<|im_end|>",
    "<|im_start|>",
    "<|eot_id|>",
    "<|start_header_id|>",
    "<｜User｜>",
    "<｜Assistant｜>",
    "<｜end▁of▁sentence｜>",
    "[INST]",
    "[/INST]",
    "</s>",
    "<end_of_turn>",
    "<start_of_turn>",
    "<|end|>",
)


def detect_formats(chat_template: str) -> tuple[str | None, str | None]:
    """``(tool_format, reasoning_format)`` suggested by a Jinja chat template's markup."""
    return _tool_format(chat_template), _reasoning_format(chat_template)


def _tool_format(t: str) -> str | None:
    if _DEEPSEEK_CALLS in t:
        # V3 puts the type and a ```json fence around the arguments; V3.1 does not.
        return "deepseek_v3" if "```json" in t else "deepseek_v31"
    if "<function=" in t and "<parameter=" in t:
        return "qwen3_coder"  # checked before hermes: its templates also use <tool_call>
    if "<tool_call>" in t:
        return "hermes"
    if "[TOOL_CALLS]" in t:
        return "mistral"
    if "<|python_tag|>" in t or "ipython" in t:
        return "llama3_json"
    return None


def _reasoning_format(t: str) -> str | None:
    if "<think>" not in t and "</think>" not in t:
        return None
    return "deepseek_r1" if "<｜Assistant｜>" in t or _DEEPSEEK_CALLS in t else "qwen3"


def think_open_from_prompt(prompt: str) -> bool:
    """True when the rendered prompt leaves a ``<think>`` block open for the model.

    Only a ``<think>`` after the last ``</think>`` and after the last turn marker counts,
    so a user who merely quotes ``<think>`` earlier in the conversation does not make
    the whole answer reasoning.
    """
    opened = prompt.rfind("<think>")
    if opened == -1 or prompt.rfind("</think>") > opened:
        return False
    tail = prompt[opened:]
    return not any(marker in tail for marker in _TURN_MARKERS)
