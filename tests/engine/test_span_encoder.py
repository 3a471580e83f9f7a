"""Pending embedding spans on the real default model: the engine encodes them once per
step for all requests, caches encodings by content, and its output equals the same
vectors given ready (and the plain tokens those vectors are the embeddings of)."""

from collections.abc import Sequence

import pytest
import torch

from mmserve import LLM, SamplingParams
from mmserve.engine.request import EmbeddingSpan
from mmserve.engine.span_encoder import EncoderCache, SpanEncoder
from mmserve.errors import InvalidRequestError

GREEDY = SamplingParams(temperature=0, max_tokens=4)
TEXTS = [
    "The quick brown fox jumps over the lazy dog. The dog",
    "Paris is the capital of France, and Berlin is the capital of",
    "One, two, three, four, five, six, seven,",
]


class TokenEncoder(SpanEncoder):
    """Payloads are token-id tensors; their encoding is the model's own embedding."""

    def __init__(self, model) -> None:
        self.model, self.calls = model, []
        self.hidden_size = model.embed_tokens.embedding_dim

    def encode(self, payloads: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        self.calls.append(len(payloads))
        with torch.no_grad():
            return [self.model.embed(p) for p in payloads]


@pytest.fixture(scope="module")
def llm(default_model_dir):
    llm = LLM(str(default_model_dir), max_model_len=256)
    llm.engine.set_span_encoder(TokenEncoder(llm.engine.model))
    return llm


def _pending(ids: list[int], lo: int, hi: int, tag: bytes) -> tuple[list[int], EmbeddingSpan]:
    """``ids`` with ``lo:hi`` replaced by placeholders and a pending span carrying them,
    cut in two runs (as an image with a wrapper token would be) -> (prompt, spans)."""
    payload = torch.tensor(ids[lo:hi])
    placeholder = ids[:lo] + [0] * (hi - lo) + ids[hi:]
    return placeholder, EmbeddingSpan(lo, None, tag, payload=payload, source=tag, length=hi - lo)


def test_pending_spans_batched_cached_and_equal_plain(llm):
    enc = llm.engine.spans.encoder
    ids = [llm.tokenizer.encode(t, add_special_tokens=True) for t in TEXTS]
    plain = [r.token_ids for r in llm.generate(ids, GREEDY)]
    prompts, spans = [], []
    for i, x in enumerate(ids):
        p, sp = _pending(x, 2, 9, bytes([i]) * 16)
        prompts.append(p)
        spans.append([sp])
    enc.calls.clear()
    out = [r.token_ids for r in llm.generate(prompts, GREEDY, spans=spans)]
    assert out == plain
    assert enc.calls == [3]  # one encode for the three requests' spans, in one step
    # the same payloads again behind a different first token: no prefix hit, cache hits
    stats = llm.engine.stats()
    again_prompts = [[p[0] + 1] + p[1:] for p in prompts]
    again = [[_pending(x, 2, 9, bytes([i]) * 16)[1]] for i, x in enumerate(ids)]
    llm.generate(again_prompts, GREEDY, spans=again)
    after = llm.engine.stats()
    assert enc.calls == [3]
    assert after.encoder_cache_hits_total - stats.encoder_cache_hits_total == 3
    assert llm.engine.blocks.num_used_blocks == 0


def test_split_runs_of_one_payload_encode_once(llm):
    enc = llm.engine.spans.encoder
    ids = llm.tokenizer.encode(TEXTS[1], add_special_tokens=True)
    plain = llm.generate([ids], GREEDY)[0].token_ids
    tag = b"split-payload-00"
    payload = torch.tensor(ids[1:4] + ids[5:8])  # two runs around one real token
    prompt = ids[:1] + [0] * 3 + ids[4:5] + [0] * 3 + ids[8:]
    spans = [
        EmbeddingSpan(1, None, tag + b"a", payload=payload, source=tag, length=3),
        EmbeddingSpan(5, None, tag + b"b", payload=payload, source=tag, length=3, offset=3),
    ]
    enc.calls.clear()
    assert llm.generate([prompt], GREEDY, spans=[spans])[0].token_ids == plain
    assert enc.calls == [1]


def test_prefix_cache_hit_skips_the_encoder(llm):
    enc = llm.engine.spans.encoder
    ids = llm.tokenizer.encode(TEXTS[2] * 3, add_special_tokens=True)  # 42 tokens
    prompt, sp = _pending(ids, 1, 20, b"prefix-payload-0")  # blocks 0-1 of 16
    first = llm.generate([prompt], GREEDY, spans=[[sp]])[0].token_ids
    llm.engine.spans.cache = EncoderCache(1 << 20)  # forget the encoding
    enc.calls.clear()
    hits = llm.engine.stats().prefix_cache_hit_tokens_total
    _, sp2 = _pending(ids, 1, 20, b"prefix-payload-0")
    # the span's blocks all come from the prefix cache: nothing is encoded
    prompt2 = prompt + llm.tokenizer.encode(" and", add_special_tokens=False)
    second = llm.generate([prompt2], GREEDY, spans=[[sp2]])[0].token_ids
    assert enc.calls == []
    assert llm.engine.stats().prefix_cache_hit_tokens_total - hits >= 32
    assert sp2.pending and first  # never materialized
    with torch.no_grad():  # the reference: the same vectors given ready (own digest: no hit)
        ready = EmbeddingSpan(1, llm.engine.model.embed(torch.tensor(ids[1:20])))
    assert llm.generate([prompt2], GREEDY, spans=[[ready]])[0].token_ids == second


def test_pending_span_without_encoder_or_payload_is_refused(llm):
    ids = llm.tokenizer.encode(TEXTS[0], add_special_tokens=True)
    bad = EmbeddingSpan(2, None, b"d" * 16, payload=None, source=b"s" * 16, length=3)
    with pytest.raises(InvalidRequestError, match="payload"):
        llm.engine.add_request(ids, GREEDY, spans=[bad])
    long = EmbeddingSpan(
        2, None, b"d" * 16, payload=torch.tensor([1]), source=b"s" * 16, length=len(ids)
    )
    with pytest.raises(InvalidRequestError, match="does not fit"):
        llm.engine.add_request(ids, GREEDY, spans=[long])
    ok = EmbeddingSpan(2, None, b"d" * 16, payload=torch.tensor([1]), source=b"s" * 16, length=1)
    encoder, llm.engine.spans = llm.engine.spans, None
    try:
        with pytest.raises(InvalidRequestError, match="no encoder"):
            llm.engine.add_request(ids, GREEDY, spans=[ok])
    finally:
        llm.engine.spans = encoder
    assert llm.engine.blocks.num_used_blocks == 0
