"""What a request constrains its output to: plain data, so it crosses a process boundary.

A ``StructuredOutput`` names one constraint kind and carries its source text; the engine
process compiles it (``mmserve.structured.grammar``), so nothing compiled travels with a
request. The kinds, and what ``value`` holds:

- ``json``: a JSON schema (JSON text), decoded strictly (no properties beyond the schema's);
- ``json_object``: any JSON object (``value`` empty);
- ``regex``: a regular expression the whole output matches;
- ``choice``: a JSON list of strings, the output is exactly one of them;
- ``grammar``: an EBNF grammar (xgrammar's dialect, GBNF-like, ``root`` the start rule);
- ``structural_tag``: an xgrammar structural tag (JSON text); tool_choice is enforced
  with one written in the served model's own tool-call markup (``mmserve.structured.tools``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

KINDS = ("json", "json_object", "regex", "choice", "grammar", "structural_tag")


@dataclass(frozen=True)
class StructuredOutput:
    kind: str
    value: str = ""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(
                f"structured output kind must be one of {', '.join(KINDS)}, got {self.kind!r}"
            )
        if not isinstance(self.value, str):
            raise ValueError("structured output value must be a string")
        if self.kind == "json_object":
            return
        if not self.value:
            raise ValueError(f"structured output of kind {self.kind!r} needs a non-empty value")
        if self.kind in ("json", "structural_tag"):
            _json(self.value, dict, f"a {self.kind} constraint must be a JSON object")
        if self.kind == "choice":
            items = _json(self.value, list, "choice must be a JSON list of strings")
            if not items or not all(isinstance(c, str) and c for c in items):
                raise ValueError("choice must be a non-empty list of non-empty strings")

    @classmethod
    def json_schema(cls, schema: dict | str) -> StructuredOutput:
        return cls("json", schema if isinstance(schema, str) else json.dumps(schema))

    @classmethod
    def choices(cls, options: list[str]) -> StructuredOutput:
        return cls("choice", json.dumps(list(options)))


def _json(text: str, kind: type, message: str):
    try:
        value = json.loads(text)
    except ValueError as err:
        raise ValueError(f"{message}: {err}") from err
    if not isinstance(value, kind):
        raise ValueError(message)
    return value
