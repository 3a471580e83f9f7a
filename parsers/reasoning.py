"""Reasoning formats: where a ``<think>`` block starts and ends.

Both supported families use ``<think>...</think>``; they differ only in where output
starts when the prompt says nothing (``think_open=None``):

* ``qwen3`` starts in content; ``<think>`` opens reasoning (Qwen3 writes it itself unless
  the template already did -- then pass ``think_open=True``).
* ``deepseek_r1`` starts in reasoning: R1-style templates open the block in the prompt,
  so text before a bare ``</think>`` is reasoning.

Rules common to both: ``</think>`` ends reasoning; a ``<think>`` inside reasoning and a
``</think>`` inside content are dropped (never shown as text); a tool call that starts
inside reasoning ends the reasoning; output cut off inside reasoning is reasoning.
"""

from __future__ import annotations

from typing import ClassVar


class ReasoningFormat:
    """A model family's reasoning markup."""

    name: ClassVar[str]
    open_tag: ClassVar[str] = "<think>"
    close_tag: ClassVar[str] = "</think>"
    starts_open: ClassVar[bool] = False  # in reasoning at the start when think_open is None


class Qwen3Reasoning(ReasoningFormat):
    name = "qwen3"


class DeepSeekR1Reasoning(ReasoningFormat):
    name = "deepseek_r1"
    starts_open = True


REASONING_FORMATS: dict[str, type[ReasoningFormat]] = {
    cls.name: cls for cls in (Qwen3Reasoning, DeepSeekR1Reasoning)
}


def get_reasoning_format(name: str | None) -> ReasoningFormat | None:
    """The format called ``name``; None turns reasoning parsing off."""
    if name is None:
        return None
    cls = REASONING_FORMATS.get(name)
    if cls is None:
        raise ValueError(
            f"unknown reasoning_format {name!r}; choose one of {sorted(REASONING_FORMATS)}"
        )
    return cls()
