"""The request's tools (names and parameter schemas) and tool-call ids."""

from __future__ import annotations

import random
import secrets
from collections.abc import Mapping, Sequence
from typing import Any


class ToolSet:
    """Names and JSON schemas of the tools a request offers.

    With no tools (``None`` or empty) any non-empty name is accepted: the parser cannot
    tell a real tool from a hallucinated one, and dropping every call would be worse.
    """

    def __init__(self, tools: Sequence[Mapping[str, Any]] | None) -> None:
        self._params: dict[str, Mapping[str, Any]] = {}
        for k, tool in enumerate(tools or ()):
            name, params = _unpack(k, tool)
            self._params[name] = params

    def accepts(self, name: str) -> bool:
        if not name:
            return False
        return not self._params or name in self._params

    def param_schema(self, function: str, param: str) -> Mapping[str, Any] | None:
        """JSON schema of one parameter, or None when the tool does not declare it."""
        props = self._params.get(function, {}).get("properties")
        if not isinstance(props, Mapping):
            return None
        schema = props.get(param)
        return schema if isinstance(schema, Mapping) else None


def _unpack(k: int, tool: Any) -> tuple[str, Mapping[str, Any]]:
    """(name, parameters) of an OpenAI tool dict; also accepts the bare function dict."""
    fn = tool.get("function", tool) if isinstance(tool, Mapping) else None
    name = fn.get("name") if isinstance(fn, Mapping) else None
    if not isinstance(name, str) or not name:
        raise ValueError(
            f"tools[{k}] must look like "
            '{"type": "function", "function": {"name": "...", "parameters": {...}}}; '
            f"got {tool!r:.200}"
        )
    assert isinstance(fn, Mapping)
    params = fn.get("parameters")
    return name, params if isinstance(params, Mapping) else {}


class IdGenerator:
    """``call_`` + 24 hex digits; reproducible when given a seed."""

    def __init__(self, seed: int | None = None) -> None:
        self._rng = None if seed is None else random.Random(seed)

    def next(self) -> str:
        if self._rng is None:
            return "call_" + secrets.token_hex(12)
        return f"call_{self._rng.getrandbits(96):024x}"
