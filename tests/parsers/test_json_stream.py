"""The incremental JSON scanner: validation, hold-back, and the completion property that
makes streamed-then-broken arguments closable."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from parsers.json_stream import JsonScanner


def _scan(text: str, final: bool = False) -> tuple[JsonScanner, int]:
    s = JsonScanner()
    return s, s.step(text, 0, final)


def _closed(text: str) -> str:
    """Safe prefix of ``text`` plus the scanner's completion."""
    s, j = _scan(text)
    return text[: j - s.hold] + s.completion()


@pytest.mark.parametrize(
    "doc", ['{"a": [1, -2.5e+3, true, false, null, "x\\"y\\u00e9"], "b": {}}', "[]", '"s"', "0"]
)
def test_valid_documents_scan_to_the_end(doc: str) -> None:
    s, j = _scan(doc + " tail", final=True)
    assert s.done and not s.error and j == len(doc)


@pytest.mark.parametrize("bad", ['{"a" 1}', "[1,]", '{"a":1,}', "tru!", '"a\nb"', "[01]", "{a}"])
def test_invalid_text_stops_at_the_error(bad: str) -> None:
    s, _ = _scan(bad, final=True)
    assert s.error
    json.loads(_closed(bad))


def test_a_comma_and_an_escape_are_held_back() -> None:
    s, j = _scan('{"a": 1,  ')
    assert s.hold == 3 and j == 10
    s, j = _scan('["x\\u00')
    assert s.hold == 4


def _json_values() -> st.SearchStrategy[Any]:
    scalars = (
        st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
    )
    scalars = scalars | st.text(max_size=8)
    return st.recursive(
        scalars,
        lambda kids: (
            st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=5), kids, max_size=4)
        ),
        max_leaves=12,
    )


@settings(max_examples=150, deadline=None)
@given(value=_json_values(), indent=st.sampled_from([None, 1]), ascii_only=st.booleans())
def test_every_prefix_closes_into_valid_json(
    value: Any, indent: int | None, ascii_only: bool
) -> None:
    doc = json.dumps(value, indent=indent, ensure_ascii=ascii_only)
    for k in range(len(doc) + 1):
        closed = _closed(doc[:k])
        if closed:
            json.loads(closed)
    s, _ = _scan(doc, final=True)
    assert s.done and _closed(doc) == doc
