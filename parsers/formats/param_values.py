"""Typing XML-style parameter values (qwen3_coder) by the tool's JSON schema.

A value is raw text between tags.  Parameters whose schema type is a string (or that
have no schema) stay strings -- and only those can be streamed before the value ends,
which is why the type is decided from the schema, never from the value.  Other types
are converted at the value's end; anything that does not convert stays a string.
"""

from __future__ import annotations

import ast
import json
import math
from collections.abc import Mapping
from typing import Any

_STRING_TYPES = frozenset({"string", "str", "text", "varchar", "char", "enum"})
_INT_TYPES = frozenset({"integer", "int"})
_NUM_TYPES = frozenset({"number", "float", "double"})
_BOOL_TYPES = frozenset({"boolean", "bool", "binary"})


def schema_type(schema: Mapping[str, Any] | None) -> str:
    """The declared type of a parameter; "string" when unknown."""
    if not schema:
        return "string"
    t = schema.get("type")
    if isinstance(t, list):
        t = next((x for x in t if x != "null"), None)
    if isinstance(t, str):
        return t.lower()
    for key in ("anyOf", "oneOf"):
        options = schema.get(key)
        if isinstance(options, list):
            for option in options:
                if isinstance(option, Mapping) and option.get("type") not in (None, "null"):
                    return schema_type(option)
    if "enum" in schema or "const" in schema:
        return "string"
    return "object" if "properties" in schema else "string"


def is_string(schema: Mapping[str, Any] | None) -> bool:
    return schema_type(schema) in _STRING_TYPES


def to_json(text: str, schema: Mapping[str, Any] | None) -> str:
    """JSON text of a complete non-string value."""
    value = _convert(text, schema_type(schema))
    try:
        return json.dumps(value, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError, RecursionError):
        # a Python literal that JSON cannot hold (tuple keys, nan): keep the text
        return json.dumps(text, ensure_ascii=False)


def _convert(text: str, t: str) -> Any:
    s = text.strip()
    if s.lower() in ("null", "none"):
        return None
    if t in _INT_TYPES:
        return _number(s, integer=True, fallback=text)
    if t in _NUM_TYPES:
        return _number(s, integer=False, fallback=text)
    if t in _BOOL_TYPES:
        low = s.lower()
        return True if low == "true" else False if low == "false" else text
    try:
        return json.loads(s)
    except (ValueError, RecursionError):
        pass
    try:  # models sometimes write Python literals ({'a': 1}, True)
        value = ast.literal_eval(s)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return text
    return value if isinstance(value, dict | list | bool | int | float) else text


def _number(s: str, integer: bool, fallback: str) -> Any:
    try:
        return int(s)
    except ValueError:
        pass
    try:
        value = float(s)
    except ValueError:
        return fallback
    if not math.isfinite(value):
        return fallback
    if integer and value.is_integer():
        return int(value)
    return value
