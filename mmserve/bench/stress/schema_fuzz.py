"""Hypothesis strategies for fuzzing the server from its own protocol schemas.

``from_schema`` turns a pydantic model's JSON schema into a strategy for values that
mostly follow it (so requests get past parsing into the routes) and sometimes break it
in the ways that once hurt the server: wrong types, huge and negative integers, lone
surrogates, long strings, deep nesting. Integers named like token limits stay small
when valid, so a fuzz run exercises the engine without generating for minutes.
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

SMALL_INT_FIELDS = (
    "max_tokens",
    "max_completion_tokens",
    "max_output_tokens",
    "n",
    "min_tokens",
    "top_logprobs",
    "logprobs",
)
NASTY_STRINGS = [
    "",
    "\ud800",
    "a\udfff",
    "\x00",
    "😀" * 50,
    "a" * 5000,
    "{{",
    "<think>",
    "</s>",
    "<|im_end|>",
    "\u202e",
    "null",
]
BREAK_ONE_IN = 40
NASTY_INTS = [-1, 0, 2**31, 2**63, -(2**63) - 1, 2**70, 10**30]


def nasty() -> st.SearchStrategy[Any]:
    """A value of any JSON type, often one that has hurt a server."""
    leaf = st.one_of(
        st.sampled_from(NASTY_STRINGS),
        st.sampled_from(NASTY_INTS),
        st.text(max_size=40),
        st.integers(),
        st.floats(allow_nan=False),
        st.booleans(),
        st.none(),
    )
    deep = st.integers(1, 3000).map(lambda d: _nest(d))
    return st.one_of(
        leaf,
        deep,
        st.lists(leaf, max_size=4),
        st.dictionaries(st.text(max_size=8), leaf, max_size=4),
    )


def _nest(depth: int) -> Any:
    value: Any = []
    for _ in range(depth):
        value = [value]
    return value


def from_schema(
    schema: dict[str, Any], defs: dict[str, Any] | None = None, name: str = "", depth: int = 0
) -> st.SearchStrategy[Any]:
    """A strategy for ``schema`` (pydantic's JSON schema), with ~1 field in 40 broken (a
    request of a dozen fields is then valid about three times in four)."""
    defs = defs if defs is not None else schema.get("$defs", {})
    good = _valid(schema, defs, name, depth)
    return st.integers(0, BREAK_ONE_IN - 1).flatmap(lambda i: nasty() if i == 0 else good)


def _valid(
    schema: dict[str, Any], defs: dict[str, Any], name: str, depth: int
) -> st.SearchStrategy[Any]:
    if "$ref" in schema:
        return from_schema(defs[schema["$ref"].split("/")[-1]], defs, name, depth)
    if "const" in schema:
        return st.just(schema["const"])
    if "enum" in schema:
        return st.sampled_from(schema["enum"])
    for key in ("anyOf", "oneOf"):
        if key in schema:
            return st.one_of([_valid(s, defs, name, depth) for s in schema[key]])
    kind = schema.get("type")
    if depth > 6 or kind in (None, "null"):
        return st.none() if kind == "null" else nasty()
    if kind == "object":
        return _object(schema, defs, depth)
    if kind == "array":
        items = schema.get("items", {})
        return st.lists(from_schema(items, defs, name, depth + 1), min_size=1, max_size=3)
    if kind == "string":
        return st.text(max_size=60)
    if kind == "integer":
        if name in SMALL_INT_FIELDS:
            return st.integers(1, 2)
        return st.integers(schema.get("minimum", -5), schema.get("maximum", 2**40))
    if kind == "number":
        return st.floats(schema.get("minimum", -3.0), schema.get("maximum", 3.0), allow_nan=False)
    if kind == "boolean":
        return st.booleans()
    return nasty()


def _object(schema: dict[str, Any], defs: dict[str, Any], depth: int) -> st.SearchStrategy[Any]:
    props = schema.get("properties", {})
    if not props:
        return st.dictionaries(st.text(max_size=8), nasty(), max_size=3)
    required = set(schema.get("required", []))
    fixed = {k: from_schema(v, defs, k, depth + 1) for k, v in props.items() if k in required}
    optional = {
        k: from_schema(v, defs, k, depth + 1) for k, v in props.items() if k not in required
    }
    return st.fixed_dictionaries(fixed, optional=optional)
