"""qwen3_coder parameter typing by JSON schema."""

from __future__ import annotations

import json
from typing import Any

import pytest

from parsers.formats.param_values import is_string, schema_type, to_json


@pytest.mark.parametrize(
    ("schema", "text", "value"),
    [
        ({"type": "integer"}, " 42 ", 42),
        ({"type": "integer"}, "4.0", 4),
        ({"type": "integer"}, "many", "many"),
        ({"type": "number"}, "2.5", 2.5),
        ({"type": "number"}, "nan", "nan"),
        ({"type": "boolean"}, "True", True),
        ({"type": "boolean"}, "false", False),
        ({"type": "boolean"}, "yes", "yes"),
        ({"type": "object"}, '{"a": 1}', {"a": 1}),
        ({"type": "object"}, "{'a': (1, 2)}", {"a": [1, 2]}),
        ({"type": "array"}, "[1, 'x']", [1, "x"]),
        ({"type": "array"}, "not a list", "not a list"),
        ({"type": "object"}, "null", None),
        ({"type": "object"}, "{(1, 2): 3}", "{(1, 2): 3}"),
        ({"type": "array"}, "[" * 5000, "[" * 5000),
    ],
)
def test_conversion(schema: dict[str, Any], text: str, value: Any) -> None:
    assert json.loads(to_json(text, schema)) == value


def test_schema_types() -> None:
    assert is_string(None) and is_string({}) and is_string({"enum": ["a"]})
    assert is_string({"type": ["null", "string"]})
    assert schema_type({"anyOf": [{"type": "null"}, {"type": "integer"}]}) == "integer"
    assert not is_string({"properties": {}})
