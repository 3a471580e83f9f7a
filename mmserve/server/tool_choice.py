"""``tool_choice`` and ``parallel_tool_calls`` checked and turned into an output constraint.

``"required"`` / a named function are enforced by a grammar over the tool format the
server parses (``mmserve.structured.tools``), so the streaming parser always finds a call;
a server started without a tool format enforces and parses hermes markup for them.
``"none"`` turns call parsing off (any call-like text stays content); ``"auto"`` is free
(with ``parallel_tool_calls=false``: at most one call), and a 400 on a server with no tool
format, as in vLLM: its calls would never be parsed, the tools silently ignored.
"""

from __future__ import annotations

from typing import Any

from mmserve.server.errors import ParamError
from mmserve.server.protocol import ChatCompletionRequest
from mmserve.structured.spec import StructuredOutput
from mmserve.structured.tools import FALLBACK_FORMAT, tool_call_constraint


def checked_choice(body: ChatCompletionRequest, tools: list[dict[str, Any]] | None) -> Any:
    """The request's tool_choice, normalized ("auto" with tools, "none" without), or 400."""
    choice = body.tool_choice
    if choice is None:
        return "auto" if tools else "none"
    if isinstance(choice, str):
        if choice not in ("auto", "none", "required"):
            raise ParamError(
                f"tool_choice must be 'auto', 'none', 'required' or "
                f"{{'type': 'function', 'function': {{'name': ...}}}}; got "
                f"{choice!r}",
                param="tool_choice",
            )
        if choice == "required" and not tools:
            raise ParamError("tool_choice 'required' needs tools", param="tool_choice")
        return choice
    fn = choice.get("function")
    name = fn.get("name") if isinstance(fn, dict) else None
    if choice.get("type") != "function" or not isinstance(name, str):
        raise ParamError(
            "tool_choice must name a function as {'type': 'function', 'function': {'name': ...}}",
            param="tool_choice",
        )
    names = [t["function"]["name"] for t in tools or []]
    if name not in names:
        raise ParamError(
            f"tool_choice names {name!r}, which is not among the tools "
            f"({', '.join(names) or 'none given'})",
            param="tool_choice",
        )
    return {"type": "function", "function": {"name": name}}


def plan_tools(
    body: ChatCompletionRequest, tools: list[dict[str, Any]] | None, tool_format: str | None
) -> tuple[Any, str | None, StructuredOutput | None]:
    """-> (tool_choice, the tool format to parse with, the output constraint)."""
    choice = checked_choice(body, tools)
    structured = body.structured()
    forced = choice not in ("auto", "none")
    if not tools or choice == "none":
        return choice, tool_format, structured
    if forced and structured is not None:
        raise ParamError(
            "response_format/structured_outputs cannot be combined with a "
            "tool_choice that forces a call",
            param="tool_choice",
        )
    parallel = body.parallel_tool_calls is not False
    if tool_format is None:
        if not forced:  # the calls would never be parsed: the tools would be ignored
            raise ParamError(
                "tool_choice 'auto' (the default with tools) needs a server that parses "
                "tool calls: start it with --tool-call-parser (auto reads the chat "
                "template); 'required' or a named function are enforced without one, "
                "and 'none' answers without the tools",
                param="tool_choice",
            )
        tool_format = FALLBACK_FORMAT
    if structured is not None:  # auto with a response_format: the format holds the output
        return choice, tool_format, structured
    try:
        return choice, tool_format, tool_call_constraint(tool_format, tools, choice, parallel)
    except ValueError as err:
        raise ParamError(str(err), param="tool_choice") from err
