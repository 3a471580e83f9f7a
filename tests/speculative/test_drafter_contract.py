"""The Drafter contract, checked for every drafter: one draft per request, at most k
tokens, k = 0 gives nothing, results independent of batch order and of other requests."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from mmserve.speculative.drafter import Draft, Drafter, DraftRequest
from mmserve.speculative.ngram_build import build_table
from mmserve.speculative.ngram_table import NgramTableDrafter
from mmserve.speculative.prompt_lookup import PromptLookupDrafter


def corpus(seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    phrase = [rng.randrange(8) for _ in range(6)]
    return [phrase * rng.randrange(1, 4) + [rng.randrange(8) for _ in range(20)] for _ in range(30)]


@pytest.fixture(params=["prompt_lookup", "ngram_table"])
def drafter(request: pytest.FixtureRequest, tmp_path: Path) -> Drafter:
    if request.param == "prompt_lookup":
        return PromptLookupDrafter(1, 3)
    build_table(corpus(0), tmp_path / "t.bin", n=2)
    d = NgramTableDrafter(tmp_path / "t.bin")
    request.addfinalizer(d.close)
    return d


def test_contract(drafter: Drafter) -> None:
    seqs = corpus(1)
    batch = [DraftRequest(f"r{i}", s, i % 6) for i, s in enumerate(seqs)]
    drafts = drafter.propose(batch)
    assert len(drafts) == len(batch)
    assert any(d.tokens for d in drafts)
    for req, draft in zip(batch, drafts, strict=True):
        assert len(draft.tokens) <= req.k and (req.k > 0 or draft.tokens == [])
        assert all(isinstance(t, int) for t in draft.tokens)
    reordered = list(reversed(batch))
    assert [d.tokens for d in drafter.propose(reordered)] == [d.tokens for d in reversed(drafts)]
    for req, draft in zip(batch, drafts, strict=True):  # alone, in a batch of one
        assert drafter.propose([req])[0].tokens == draft.tokens
    snapshot = [list(s) for s in seqs]
    for req in batch:
        drafter.on_finished(req.request_id)
    assert seqs == snapshot  # token buffers untouched


def test_draft_probs_shape_is_checked() -> None:
    Draft([1, 2], torch.full((2, 5), 0.2))
    with pytest.raises(AssertionError, match="len\\(tokens\\)=2"):
        Draft([1, 2], torch.full((3, 5), 0.2))
