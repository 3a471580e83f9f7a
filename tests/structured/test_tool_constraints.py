"""tool_choice grammars (``mmserve.structured.tools``) compiled for the default model's
tokenizer and driven token by token: "required" admits only calls, a named function
exactly one call of that function with arguments its schema accepts,
``parallel_tool_calls=False`` one call, "auto" with ``parallel_tool_calls=False`` free
text or one call that ends the output; for hermes and llama3_json markup."""

from __future__ import annotations

import json
from typing import Any

import pytest

from mmserve.models.tokenizer import Tokenizer
from mmserve.structured import StructuredOutput
from mmserve.structured.grammar import GrammarCompiler
from mmserve.structured.tools import tool_call_constraint

VOCAB = 49152
ADD = {
    "type": "function",
    "function": {
        "name": "add",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            "required": ["a", "b"],
            "additionalProperties": False,
        },
    },
}
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}
TOOLS = [ADD, WEATHER]
NAMED = {"type": "function", "function": {"name": "add"}}


def _hermes(name: str, args: dict[str, Any]) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": args}) + "\n</tool_call>"


def _llama(name: str, args: dict[str, Any]) -> str:
    return json.dumps({"name": name, "parameters": args})


CALL = _hermes("add", {"a": 2, "b": 3})
OTHER = _hermes("get_weather", {"city": "Paris"})


@pytest.fixture(scope="module")
def tok(default_model_dir) -> Tokenizer:
    return Tokenizer(default_model_dir)


@pytest.fixture(scope="module")
def grammars(tok) -> GrammarCompiler:
    return GrammarCompiler(tok, VOCAB)


@pytest.fixture(scope="module")
def check(grammars, tok):
    """``check(spec, text)`` -> "done" (the grammar takes all of ``text`` and may end
    there), "open" (takes it, needs more) or "refused"."""

    def run(spec: StructuredOutput, text: str) -> str:
        state = grammars.state(spec)
        for t in tok.encode(text):
            if not state.accept(t):
                return "refused"
        return "done" if state.completed else "open"

    return run


def test_required_admits_only_calls_and_parallel_false_holds_one(check):
    one = tool_call_constraint("hermes", TOOLS, "required", parallel=False)
    assert check(one, CALL) == "done" and check(one, OTHER) == "done"
    assert check(one, "The answer is 5.") == "refused"
    assert check(one, "<tool_call>\n") == "open"  # a call must follow its opener
    assert check(one, CALL + "\n" + OTHER) == "refused"
    many = tool_call_constraint("hermes", TOOLS, "required", parallel=True)
    assert check(many, CALL + "\n" + OTHER) == "done"


def test_named_admits_one_call_of_that_function_with_valid_arguments(check):
    spec = tool_call_constraint("hermes", TOOLS, NAMED, parallel=True)
    assert check(spec, CALL) == "done"
    assert check(spec, CALL + "\n" + CALL) == "refused"  # one call, even with parallel
    assert check(spec, OTHER) == "refused"
    assert check(spec, _hermes("add", {"a": "two", "b": 3})) == "refused"
    assert check(spec, _hermes("add", {"a": 2})) == "refused"  # b is required


def test_auto_with_parallel_false_is_free_text_or_one_call_that_ends_it(check):
    assert tool_call_constraint("hermes", TOOLS, "auto", parallel=True) is None
    assert tool_call_constraint("hermes", TOOLS, "none", parallel=False) is None
    spec = tool_call_constraint("hermes", TOOLS, "auto", parallel=False)
    assert check(spec, "It is 5, no tool needed.") == "done"
    assert check(spec, "Let me add them. " + CALL) == "done"
    assert check(spec, "Let me add them. " + CALL + "\n" + OTHER) == "refused"
    assert check(spec, '<tool_call>\n{"name": "sub"') == "refused"


def test_llama3_json_calls(check):
    one = tool_call_constraint("llama3_json", TOOLS, "required", parallel=False)
    assert check(one, _llama("add", {"a": 1, "b": 2})) == "done"
    assert check(one, _llama("add", {"a": 1, "b": 2}) + "; ") == "refused"
    assert check(one, "Sure!") == "refused"
    many = tool_call_constraint("llama3_json", TOOLS, "required", parallel=True)
    two = _llama("add", {"a": 1, "b": 2}) + "; " + _llama("get_weather", {"city": "Rome"})
    assert check(many, two) == "done"
    named = tool_call_constraint("llama3_json", TOOLS, NAMED, parallel=True)
    assert check(named, _llama("get_weather", {"city": "Rome"})) == "refused"
    assert check(named, _llama("add", {"a": 1, "b": 2}) + "; ") == "refused"
    assert tool_call_constraint("llama3_json", TOOLS, "auto", parallel=False) is None


def test_a_format_without_a_grammar_is_refused_with_the_ones_that_have_one():
    with pytest.raises(ValueError, match="hermes, llama3_json"):
        tool_call_constraint("mistral", TOOLS, "required", parallel=True)
