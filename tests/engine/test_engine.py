"""The engine on the real default model: invariance across batching, preemption and
prefix caching; cancellation; seeded sampling; stop strings; streaming text; spans."""

import asyncio

import pytest
import torch

from mmserve import LLM, SamplingParams
from mmserve.engine.async_engine import AsyncEngine
from mmserve.engine.request import EmbeddingSpan
from mmserve.errors import InvalidRequestError, QueueFullError

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time",
    "1, 2, 3, 4,",
    "The best way to learn Python is",
    "Water boils at",
    "My favourite colour is",
    "import numpy as np\n",
    "Dear Sir or Madam,",
    "The three laws of robotics are",
    "Q: What is 7 times 8?\nA:",
    "A haiku about the sea:\n",
    "SELECT * FROM",
    "In 1969, the first",
    "Photosynthesis is the process",
    "To be or not to be,",
]
GREEDY = SamplingParams(temperature=0, max_tokens=16)


@pytest.fixture(scope="module")
def llm(default_model_dir):
    return LLM(str(default_model_dir))


@pytest.fixture(scope="module")
def alone(llm):
    """Each prompt run by itself: the reference for every batching test."""
    return [llm.generate(p, GREEDY)[0].token_ids for p in PROMPTS]


def test_16_concurrent_equal_one_at_a_time(llm, alone):
    together = llm.generate(PROMPTS, GREEDY)
    assert [r.token_ids for r in together] == alone
    assert all(r.finish_reason in ("length", "stop") for r in together)
    assert llm.engine.blocks.num_used_blocks == 0


def test_preemption_keeps_outputs(default_model_dir, alone):
    small = LLM(str(default_model_dir), num_kv_blocks=12, enable_prefix_caching=False)
    out = small.generate(PROMPTS[:8], GREEDY)
    assert small.engine.scheduler.num_preemptions > 0
    assert [r.token_ids for r in out] == alone[:8]
    assert small.engine.blocks.num_used_blocks == 0


def test_prefix_cache_hit_same_output_fewer_prefill_tokens(llm):
    shared = "You are a helpful assistant. Answer briefly and precisely. " * 6
    llm.engine.blocks.reset_prefix_cache()
    first = llm.generate(shared + "What is the capital of Italy?", GREEDY)[0]
    hits_before = llm.engine.blocks.prefix_hits
    second = llm.generate(shared + "What is the capital of Italy?", GREEDY)[0]
    assert second.token_ids == first.token_ids
    hit = llm.engine.blocks.prefix_hits - hits_before
    assert hit >= 64  # the shared prefix spans several 16-token blocks
    uncached = LLM.__new__(LLM)  # same prompt with the cache off gives the same tokens too
    uncached.engine, uncached.tokenizer = llm.engine, llm.tokenizer
    llm.engine.blocks.reset_prefix_cache()
    assert (
        llm.generate(shared + "What is the capital of Italy?", GREEDY)[0].token_ids
        == first.token_ids
    )


def test_cancel_frees_blocks_in_the_same_step(llm):
    eng = llm.engine
    start = eng.blocks.num_used_blocks
    ids = [eng.add_request(llm.tokenizer.encode(p), GREEDY) for p in PROMPTS[:6]]
    eng.step()
    eng.step()
    assert eng.blocks.num_used_blocks > start
    for rid in ids:
        out = eng.abort(rid)
        assert out is not None and out.finish_reason == "abort"
    assert eng.blocks.num_used_blocks == start
    assert not eng.has_unfinished()


def test_seeded_sampling_reproducible_alone_and_batched(llm):
    p = SamplingParams(temperature=0.9, top_p=0.95, seed=1234, max_tokens=20)
    a = llm.generate("Write a sentence about cats.", p)[0].token_ids
    b = llm.generate("Write a sentence about cats.", p)[0].token_ids
    others = [SamplingParams(temperature=1.0, seed=i, max_tokens=20) for i in range(3)]
    eng = llm.engine
    for i, q in enumerate(others):
        eng.add_request(llm.tokenizer.encode(PROMPTS[i]), q)
    rid = eng.add_request(
        llm.tokenizer.encode("Write a sentence about cats.", add_special_tokens=True), p
    )
    batched = None
    while eng.has_unfinished():
        for o in eng.step():
            if o.request_id == rid and o.finished:
                batched = o.token_ids
    assert a == b == batched
    # min_tokens: EOS is this prompt's first token ~40 % of the time at temperature 1, so
    # three runs of just EOS (~8 %) made the check flaky
    unseeded = SamplingParams(temperature=1.0, max_tokens=20, min_tokens=8)
    runs = {
        tuple(llm.generate("Write a sentence about cats.", unseeded)[0].token_ids) for _ in range(3)
    }
    assert len(runs) > 1  # without a seed, runs differ


def test_stop_string_split_across_tokens(llm):
    full = llm.generate(PROMPTS[0], GREEDY)[0]
    toks = full.token_ids
    pieces = [llm.tokenizer.decode(toks[:i]) for i in range(len(toks) + 1)]
    # a stop string that starts inside token 3's text and ends inside token 4's
    cut = len(pieces[3]) - 1
    stop = full.text[cut : len(pieces[4]) + 1]
    assert len(stop) >= 2
    got = llm.generate(PROMPTS[0], SamplingParams(temperature=0, max_tokens=20, stop=[stop]))[0]
    assert got.finish_reason == "stop"
    assert got.text == full.text[: full.text.index(stop)]


def test_streamed_deltas_rebuild_text_without_broken_characters(default_model_dir):
    async def go():
        engine = AsyncEngine.from_config(_config(default_model_dir))
        try:
            prompt = engine.tokenizer.encode("Écris une phrase en français sur l'été: ")
            deltas, final = [], None
            async for out in engine.generate(prompt, SamplingParams(temperature=0, max_tokens=40)):
                deltas.append(out.new_text)
                final = out
            return deltas, final
        finally:
            await engine.shutdown()

    deltas, final = asyncio.run(go())
    assert "".join(deltas) == final.text
    assert all("\ufffd" not in d for d in deltas)
    assert any(ord(c) > 127 for c in final.text)  # the model did write accented characters


def test_async_cancel_and_queue_bound(default_model_dir):
    async def go():
        engine = AsyncEngine.from_config(_config(default_model_dir, max_waiting=2, max_num_seqs=1))
        try:
            start = engine.stats().kv_blocks_used
            prompt = engine.tokenizer.encode("Tell me a long story about a dragon.")
            gen = engine.generate(prompt, SamplingParams(temperature=0, max_tokens=200))
            async for out in gen:
                if len(out.token_ids) >= 3:
                    break
            await gen.aclose()
            for _ in range(100):
                if engine.stats().kv_blocks_used == start:
                    break
                await asyncio.sleep(0.05)
            freed = engine.stats().kv_blocks_used == start
            long = SamplingParams(temperature=0, max_tokens=50)
            streams = [engine.generate(prompt, long) for _ in range(4)]
            tasks = [asyncio.ensure_future(s.__anext__()) for s in streams]
            results = await asyncio.gather(*tasks, return_exceptions=True)
            for s in streams:
                await s.aclose()
            return freed, results
        finally:
            await engine.shutdown()

    freed, results = asyncio.run(go())
    assert freed
    assert any(isinstance(r, QueueFullError) for r in results)


def test_embedding_spans_equal_plain_tokens(llm):
    ids = llm.tokenizer.encode(
        "The quick brown fox jumps over the lazy dog. The dog", add_special_tokens=True
    )
    plain = llm.generate([ids], GREEDY)[0].token_ids
    with torch.no_grad():
        vectors = llm.engine.model.embed(torch.tensor(ids[2:9]))
    placeholder = list(ids)
    placeholder[2:9] = [0] * 7  # the span, not the ids, must decide the output
    spanned = llm.generate([placeholder], GREEDY, spans=[[EmbeddingSpan(2, vectors)]])[0]
    assert spanned.token_ids == plain


def test_bad_arguments_say_what_is_allowed(llm):
    with pytest.raises(ValueError, match="max_tokens must be >= 1"):
        SamplingParams(max_tokens=-1)
    with pytest.raises(InvalidRequestError, match="at most"):
        llm.generate([[1] * (llm.engine.max_model_len + 5)], GREEDY)
    with pytest.raises(ValueError, match="top_p"):
        SamplingParams(top_p=0)
    with pytest.raises(TypeError, match="allowed"):
        LLM("smollm2-135m-instruct", not_an_option=1)
    assert llm.engine.blocks.num_used_blocks == 0


def test_unknown_model_lists_known_names():
    from mmserve.errors import UnknownModelError

    with pytest.raises(UnknownModelError, match="smollm2-135m-instruct"):
        LLM("no-such-model-anywhere")


def _config(model_dir, **kw):
    from mmserve.config import EngineConfig

    return EngineConfig(model=str(model_dir), **kw)
