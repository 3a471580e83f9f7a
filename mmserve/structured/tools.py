"""tool_choice as a grammar over the served model's own tool-call markup.

``"required"`` and a named function become an xgrammar structural tag that admits only
calls written exactly as the model's tool format writes them (the markup its streaming
parser in ``parsers/formats`` reads), each call's ``arguments`` held to that function's
JSON schema; a named function, or ``parallel_tool_calls=False``, holds it to one call (as
OpenAI and vLLM answer a named ``tool_choice`` with exactly one call: a small model let
free would repeat the call until ``max_tokens``). ``"auto"`` stays free,
except that with ``parallel_tool_calls=False`` the text after the first call opener is
held to one well-formed call and the output ends there. The result is plain data (a
``StructuredOutput``): the engine process compiles it.

Formats with a grammar here: ``hermes`` (``<tool_call>\\n{"name": ..., "arguments": ...}
\\n</tool_call>``, also what mmserve enforces for a model with no tool format of its own)
and ``llama3_json`` (bare ``{"name": ..., "parameters": ...}``, calls separated by ``; ``).
"""

from __future__ import annotations

import json
from typing import Any

from mmserve.structured.spec import StructuredOutput

ENFORCED_FORMATS = ("hermes", "llama3_json")
FALLBACK_FORMAT = "hermes"


def _call_schema(tool: dict[str, Any], args_key: str) -> dict[str, Any]:
    fn = tool["function"]
    params = fn.get("parameters") or {"type": "object", "properties": {}}
    return {
        "type": "object",
        "properties": {"name": {"const": fn["name"]}, args_key: params},
        "required": ["name", args_key],
        "additionalProperties": False,
    }


def _hermes_tags(tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        {
            "type": "tag",
            "begin": "<tool_call>\n",
            "content": {"type": "json_schema", "json_schema": _call_schema(t, "arguments")},
            "end": "\n</tool_call>",
        }
        for t in tools
    ]


def tool_call_constraint(
    tool_format: str, tools: list[dict[str, Any]], choice: Any, parallel: bool
) -> StructuredOutput | None:
    """The constraint for ``tool_choice`` ``choice`` (already checked: "auto", "none",
    "required", or a named function present in ``tools``), or None: nothing to enforce."""
    if choice == "none":
        return None
    if isinstance(choice, dict):
        name = choice["function"]["name"]
        tools = [t for t in tools if t["function"]["name"] == name]
        parallel = False  # a named function is called exactly once
    forced = choice != "auto"
    if not forced and parallel:
        return None  # auto: the model may answer or call, as it likes
    if tool_format == "hermes":
        tags = _hermes_tags(tools)
        if forced:
            fmt: dict[str, Any] = {
                "type": "tags_with_separator",
                "tags": tags,
                "separator": "\n",
                "at_least_one": True,
                "stop_after_first": not parallel,
            }
        else:
            fmt = {
                "type": "triggered_tags",
                "triggers": ["<tool_call>"],
                "tags": tags,
                "at_least_one": False,
                "stop_after_first": True,
            }
    elif tool_format == "llama3_json":
        if not forced:
            return None  # a bare-JSON call has no opener to trigger on: one call cannot be held
        one = {
            "type": "json_schema",
            "json_schema": {"anyOf": [_call_schema(t, "parameters") for t in tools]},
        }
        fmt = (
            one
            if not parallel
            else {
                "type": "sequence",
                "elements": [
                    one,
                    {
                        "type": "star",
                        "content": {
                            "type": "sequence",
                            "elements": [{"type": "const_string", "value": "; "}, one],
                        },
                    },
                ],
            }
        )
    else:
        raise ValueError(
            f"tool_choice={_show(choice)} is enforced for the tool formats "
            f"{', '.join(ENFORCED_FORMATS)}; this server parses {tool_format!r}"
        )
    return StructuredOutput("structural_tag", json.dumps({"type": "structural_tag", "format": fmt}))


def _show(choice: Any) -> str:
    return json.dumps(choice) if isinstance(choice, dict) else repr(choice)
