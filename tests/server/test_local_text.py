"""``LocalText``: an API server of the engine core makes a request's text from its token
ids, so the core detokenizes nothing for requests without stop strings. The reference
is the engine's own text, delta for delta, on the real default model: finishes by
length, by EOS, by a stop token id, with and without special tokens, and text with
multi-byte characters."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from mmserve.config import EngineConfig
from mmserve.engine.detokenizer import IncrementalDetokenizer
from mmserve.engine.factory import create_engine
from mmserve.sampling_params import SamplingParams
from mmserve.server.core_client import LocalText

PROMPTS = [
    "Say hello in French, Spanish and Japanese.",
    "Write three emoji and the word naïve.",
    "What is 2 + 2? Answer with one number.",
    "Tell me a story about a café.",
]


@pytest.fixture(scope="module")
def engine(default_model_dir):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield create_engine(
        EngineConfig(model=str(default_model_dir), device="cpu", kv_cache_memory_mb=64)
    )
    torch.set_num_threads(threads)


def _run(engine, requests):
    """Every step's delta of each request, the engine's own text included."""
    deltas = {engine.add_request(ids, params): [] for ids, params in requests}
    while engine.has_unfinished():
        for out in engine.step():
            if out.request_id in deltas:
                deltas[out.request_id].append(dataclasses.replace(out))
    return list(deltas.values())


def test_local_text_is_the_engine_text_delta_for_delta(engine):
    tok = engine.tokenizer
    ids = [
        tok.encode(
            tok.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True),
            add_special_tokens=False,
        )
        for p in PROMPTS
    ]
    greedy = SamplingParams(temperature=0, max_tokens=48)
    first = _run(engine, [(i, greedy) for i in ids])
    # a stop token id: the fourth token each answer greedily gives
    requests = [(i, greedy) for i in ids]
    requests += [(i, dataclasses.replace(greedy, max_tokens=10)) for i in ids]
    requests += [
        (i, dataclasses.replace(greedy, stop_token_ids=[d[3].new_token_ids[0]]))
        for i, d in zip(ids, first, strict=True)
    ]
    requests += [(i, dataclasses.replace(greedy, skip_special_tokens=False)) for i in ids]
    reasons = set()
    for (prompt, params), deltas in zip(requests, _run(engine, requests), strict=True):
        local = LocalText(
            IncrementalDetokenizer(
                tok.backend, prompt, params.skip_special_tokens, tok.all_special_ids
            )
        )
        got = [local.delta(dataclasses.replace(d, new_text="")) for d in deltas]
        assert got == [d.new_text for d in deltas]
        assert "".join(got) == deltas[-1].text
        reasons.add((deltas[-1].finish_reason, type(deltas[-1].stop_reason)))
    # every kind of finish was met: length, EOS (stop, None) and a stop token (stop, int)
    assert {("length", type(None)), ("stop", type(None)), ("stop", int)} <= reasons, reasons
    assert any(ord(c) > 127 for d in first for o in d for c in o.new_text)
