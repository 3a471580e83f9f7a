"""Structured output: constraints as plain data, compiled grammars, token bitmasks."""

from mmserve.structured.spec import StructuredOutput

__all__ = ["StructuredOutput"]
