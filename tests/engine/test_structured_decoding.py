"""Constrained decoding in the engine, on the real default model: every constrained
output validates; constrained and free requests share steps without changing each
other's tokens (batch invariance); speculation, preemption, prefix caching and async
scheduling leave greedy constrained outputs unchanged; a grammar cut by max_tokens ends
with "length"; logit_bias moves the pick."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest

from mmserve import LLM, SamplingParams
from mmserve.structured import StructuredOutput

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer"},
        "pet": {"enum": ["cat", "dog", "none"]},
    },
    "required": ["name", "age", "pet"],
    "additionalProperties": False,
}
LIST = {
    "type": "object",
    "properties": {"items": {"type": "array", "items": {"type": "integer"}, "maxItems": 3}},
    "required": ["items"],
    "additionalProperties": False,
}
CONSTRAINTS = [
    StructuredOutput.json_schema(PERSON),
    StructuredOutput.json_schema(LIST),
    StructuredOutput("regex", r"[A-Z][a-z]{1,8}, [0-9]{2}"),
    StructuredOutput.choices(["Paris", "London", "Rome"]),
]
ASKS = [
    "Describe a person as JSON.",
    "List a few numbers as JSON.",
    "Name a city and a number.",
    "What is the capital of France?",
]
FREE = ["The capital of France is", "def fibonacci(n):"]
MAX = 40


def _valid(spec: StructuredOutput, text: str) -> bool:
    if spec.kind == "json":
        jsonschema.validate(json.loads(text), json.loads(spec.value))
        return True
    if spec.kind == "regex":
        return re.fullmatch(spec.value, text) is not None
    return text in json.loads(spec.value)


@pytest.fixture(scope="module")
def llm(default_model_dir):
    return LLM(
        str(default_model_dir),
        max_num_seqs=16,
        speculative_config={"method": "ngram", "num_speculative_tokens": 3},
    )


def test_the_grammar_compiler_is_built_at_start_up(llm):
    """Before any constrained request (this test runs first on the module's engine), the
    compiler is built in the background: the first constraint does not stall the loop."""
    import time

    loader = llm.engine._grammars
    deadline = time.monotonic() + 120
    while not loader.ready and time.monotonic() < deadline:
        time.sleep(0.05)
    assert loader.ready and llm.engine.grammars.compiles == 0


def _prompts(llm):
    chats = [llm.tokenizer.apply_chat_template([{"role": "user", "content": a}]) for a in ASKS]
    return [llm.tokenizer.encode(c) for c in chats] + [llm.tokenizer.encode(f) for f in FREE]


def _params(i: int, temperature: float = 0.0) -> SamplingParams:
    spec = CONSTRAINTS[i] if i < len(CONSTRAINTS) else None
    return SamplingParams(
        temperature=temperature, seed=i, max_tokens=MAX if spec else 12, structured=spec
    )


def _run(llm, prompts, params) -> list:
    eng = llm.engine
    ids = [eng.add_request(p, params(i)) for i, p in enumerate(prompts)]
    finals = {}
    while eng.has_unfinished():
        for out in eng.step():
            if out.finished:
                finals[out.request_id] = out
    assert eng.blocks.num_used_blocks == 0
    return [finals[i] for i in ids]


@pytest.fixture(scope="module")
def alone(llm):
    """Each request by itself, speculation off: the reference."""
    llm.engine.set_speculation(False)
    try:
        prompts = _prompts(llm)
        return [_run(llm, [p], lambda _, i=i: _params(i))[0] for i, p in enumerate(prompts)]
    finally:
        llm.engine.set_speculation(True)


def test_alone_outputs_validate(alone):
    for spec, out in zip(CONSTRAINTS, alone, strict=False):
        assert out.finish_reason == "stop", out.text
        assert _valid(spec, out.text), out.text


def test_batched_with_free_requests_and_speculation_equal_alone(llm, alone):
    """Constrained and free rows in one step, with speculation drafting, greedy: every
    token equals the request run alone with speculation off."""
    together = _run(llm, _prompts(llm), _params)
    assert [o.token_ids for o in together] == [o.token_ids for o in alone]


def test_async_scheduling_with_constrained_rows_changes_nothing(llm, alone):
    """Constrained rows go ahead too (their masks filled once the token before is in,
    while the step runs): the tokens are those of each request run alone."""
    eng = llm.engine
    eng.set_speculation(False)
    eng.async_scheduling = True
    ahead = eng.ahead_steps
    try:
        out = _run(llm, _prompts(llm), _params)
    finally:
        eng.async_scheduling = False
        eng.set_speculation(True)
    assert [o.token_ids for o in out] == [o.token_ids for o in alone]
    assert eng.ahead_steps - ahead >= MAX // 2  # most decode steps went ahead


def test_async_scheduling_with_sampled_constrained_rows_draws_the_same(llm):
    """Sampled constrained rows launched ahead draw what the synchronous engine draws."""
    eng = llm.engine
    eng.set_speculation(False)
    try:
        sync = _run(llm, _prompts(llm), lambda i: _params(i, temperature=0.9))
        eng.async_scheduling = True
        try:
            ahead = _run(llm, _prompts(llm), lambda i: _params(i, temperature=0.9))
        finally:
            eng.async_scheduling = False
    finally:
        eng.set_speculation(True)
    assert [o.token_ids for o in ahead] == [o.token_ids for o in sync]
    for spec, out in zip(CONSTRAINTS, ahead, strict=False):
        assert _valid(spec, out.text), out.text


def test_preemption_and_prefix_cache_keep_constrained_outputs(default_model_dir, alone):
    small = LLM(str(default_model_dir), num_kv_blocks=14)
    prompts = _prompts(small)
    out = _run(small, prompts + prompts[:4], lambda i: _params(i % 6))
    assert small.engine.scheduler.num_preemptions > 0
    assert small.engine.blocks.prefix_hits > 0
    assert [o.token_ids for o in out] == [o.token_ids for o in alone + alone[:4]]


def test_sampled_constrained_outputs_validate_with_speculation(llm):
    out = _run(llm, _prompts(llm)[:4], lambda i: _params(i, temperature=1.0))
    for spec, o in zip(CONSTRAINTS, out, strict=True):
        if o.finish_reason == "stop":
            assert _valid(spec, o.text), o.text
        else:
            assert o.finish_reason == "length"


def test_a_grammar_cut_by_max_tokens_ends_with_length(llm):
    prompt = _prompts(llm)[0]
    p = SamplingParams(temperature=0, max_tokens=4, structured=CONSTRAINTS[0])
    out = _run(llm, [prompt], lambda _: p)[0]
    assert out.finish_reason == "length" and len(out.token_ids) == 4


def test_logit_bias_moves_the_greedy_pick(llm):
    prompt = _prompts(llm)[4]
    plain = _run(llm, [prompt], lambda _: SamplingParams(temperature=0, max_tokens=1))[0]
    target = llm.tokenizer.encode(" banana")[0]
    biased = _run(
        llm,
        [prompt],
        lambda _: SamplingParams(temperature=0, max_tokens=1, logit_bias={target: 100.0}),
    )[0]
    assert plain.token_ids != [target] and biased.token_ids == [target]
