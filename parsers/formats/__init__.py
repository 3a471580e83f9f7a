"""Tool-call formats by name."""

from __future__ import annotations

from parsers.formats.base import ToolFormat, ToolRegion
from parsers.formats.deepseek import DeepSeekV3Format, DeepSeekV31Format
from parsers.formats.hermes import HermesFormat
from parsers.formats.llama3_json import Llama3JsonFormat
from parsers.formats.mistral import MistralFormat
from parsers.formats.qwen3_coder import Qwen3CoderFormat

TOOL_FORMATS: dict[str, type[ToolFormat]] = {
    cls.name: cls
    for cls in (
        HermesFormat,
        Qwen3CoderFormat,
        Llama3JsonFormat,
        MistralFormat,
        DeepSeekV3Format,
        DeepSeekV31Format,
    )
}


def get_tool_format(name: str | None) -> ToolFormat | None:
    """The format called ``name``; None turns tool-call parsing off."""
    if name is None:
        return None
    cls = TOOL_FORMATS.get(name)
    if cls is None:
        raise ValueError(f"unknown tool_format {name!r}; choose one of {sorted(TOOL_FORMATS)}")
    return cls()


__all__ = ["TOOL_FORMATS", "ToolFormat", "ToolRegion", "get_tool_format"]
