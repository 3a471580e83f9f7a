"""PromptLookupDrafter against a brute-force, non-incremental reference."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mmserve.speculative.drafter import DraftRequest
from mmserve.speculative.prompt_lookup import PromptLookupDrafter


def reference_lookup(tokens: list[int], k: int, min_n: int, max_n: int) -> list[int]:
    """Scan every earlier position; copy forward from the most recent match of the longest n."""
    length = len(tokens)
    for n in range(max_n, min_n - 1, -1):
        if n >= length:
            continue
        suffix = tokens[length - n :]
        for end in range(length - 1, n - 1, -1):  # most recent earlier occurrence first
            if tokens[end - n : end] == suffix:
                seq = list(tokens)
                for i in range(k):
                    seq.append(seq[end + i])  # the copy may run into its own output
                return seq[length:]
    return []


def test_known_cases() -> None:
    d = PromptLookupDrafter(min_n=1, max_n=3)
    assert d.propose([DraftRequest("a", [1, 2, 3, 4, 1, 2], 2)])[0].tokens == [3, 4]
    assert d.propose([DraftRequest("b", [7, 7, 7], 4)])[0].tokens == [7, 7, 7, 7]
    assert d.propose([DraftRequest("c", [1, 2, 3], 3)])[0].tokens == []  # no earlier match
    assert d.propose([DraftRequest("d", [5, 1, 2, 9, 1, 2], 0)])[0].tokens == []  # k = 0


def test_prefers_longest_n_then_most_recent() -> None:
    # "2 3" last occurred followed by 8; the 1-gram "3" occurred more recently followed by 5.
    tokens = [2, 3, 8, 3, 5, 0, 2, 3]
    d = PromptLookupDrafter(min_n=1, max_n=2)
    assert d.propose([DraftRequest("a", tokens, 1)])[0].tokens == [8]
    d1 = PromptLookupDrafter(min_n=1, max_n=1)
    assert d1.propose([DraftRequest("a", tokens, 1)])[0].tokens == [5]
    d3 = PromptLookupDrafter(min_n=3, max_n=3)
    assert d3.propose([DraftRequest("a", tokens, 1)])[0].tokens == []


def test_min_match_of_a_request_raises_min_n_for_it() -> None:
    """A probe asks for a match of 2 tokens or more: a 1-token match drafts nothing."""
    d = PromptLookupDrafter(min_n=1, max_n=3)
    tokens = [4, 1, 9, 7, 1]  # only "1" recurs
    assert d.propose([DraftRequest("a", tokens, 2)])[0].tokens == [9, 7]
    assert d.propose([DraftRequest("a", tokens, 2, min_match=2)])[0].tokens == []
    tokens = [4, 1, 9, 7, 4, 1]  # "4 1" recurs
    assert d.propose([DraftRequest("b", tokens, 2, min_match=2)])[0].tokens == [9, 7]
    assert d.propose([DraftRequest("b", tokens, 2, min_match=3)])[0].tokens == []


def test_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="min_n <= max_n"):
        PromptLookupDrafter(min_n=3, max_n=2)
    with pytest.raises(ValueError, match="1 <= min_n"):
        PromptLookupDrafter(min_n=0, max_n=2)


@settings(max_examples=150, deadline=None)
@given(
    vocab=st.integers(2, 5),
    data=st.data(),
    min_n=st.integers(1, 3),
    extra_n=st.integers(0, 2),
)
def test_incremental_equals_reference(
    vocab: int, data: st.DataObject, min_n: int, extra_n: int
) -> None:
    """Streaming (growing the same request step by step, two requests interleaved) equals
    the non-incremental reference at every step."""
    max_n = min_n + extra_n
    drafter = PromptLookupDrafter(min_n, max_n)
    seqs: dict[str, list[int]] = {"a": [], "b": []}
    for _ in range(data.draw(st.integers(1, 12))):
        for rid in ("a", "b"):
            seqs[rid] += data.draw(st.lists(st.integers(0, vocab - 1), min_size=0, max_size=6))
        ks = [data.draw(st.integers(0, 6)) for _ in seqs]
        batch = [DraftRequest(rid, seqs[rid], k) for rid, k in zip(seqs, ks, strict=True)]
        drafts = drafter.propose(batch)
        for req, draft in zip(batch, drafts, strict=True):
            assert draft.probs is None
            expected = reference_lookup(list(req.token_ids), req.k, min_n, max_n)
            assert draft.tokens == expected


def test_rewritten_history_is_reindexed() -> None:
    d = PromptLookupDrafter(1, 2)
    d.propose([DraftRequest("a", [1, 2, 1, 2, 1], 2)])
    tokens = [4, 5, 4]  # same id, different (shorter) history
    assert d.propose([DraftRequest("a", tokens, 2)])[0].tokens == reference_lookup(tokens, 2, 1, 2)
    tokens = [9, 9, 4, 5, 6, 4]  # longer, but not an extension of the previous history
    assert d.propose([DraftRequest("a", tokens, 2)])[0].tokens == reference_lookup(tokens, 2, 1, 2)


def test_on_finished_releases_state() -> None:
    d = PromptLookupDrafter()
    d.propose([DraftRequest("a", [1, 2, 1], 2), DraftRequest("b", [3, 3], 1)])
    d.on_finished("a")
    d.on_finished("unknown")
    assert set(d._indexes) == {"b"}


class CountingTokens(Sequence[int]):
    """A token buffer that counts how many elements are read (to catch per-step copies)."""

    def __init__(self, tokens: list[int]) -> None:
        self.tokens = tokens
        self.reads = 0

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, index):  # type: ignore[no-untyped-def, override]
        out = self.tokens[index]
        self.reads += len(out) if isinstance(index, slice) else 1
        return out


def test_step_cost_does_not_grow_with_context() -> None:
    d = PromptLookupDrafter(1, 4)
    buf = CountingTokens([i % 97 for i in range(20_000)])
    d.propose([DraftRequest("a", buf, 4)])  # indexes the whole prompt once
    for step in range(5):
        buf.tokens.append(step)
        buf.reads = 0
        d.propose([DraftRequest("a", buf, 4)])
        assert buf.reads < 100  # a few n-grams and the draft, not the 20k-token context


@settings(max_examples=60, deadline=None)
@given(data=st.data(), min_n=st.integers(1, 3), extra_n=st.integers(0, 2))
def test_index_grown_in_steps_of_any_size_is_the_index_built_at_once(
    data: st.DataObject, min_n: int, extra_n: int
) -> None:
    """Appends of 0-20 tokens (one by one below ``SHORT_UPDATE`` new positions, in bulk
    above it) leave each n's dict equal to one built from scratch: every n-gram ending at
    1..len-1 mapped to its latest end, in first-occurrence order."""
    max_n = min_n + extra_n
    drafter = PromptLookupDrafter(min_n, max_n)
    tokens: list[int] = []
    for _ in range(data.draw(st.integers(1, 10))):
        tokens = tokens + data.draw(st.lists(st.integers(0, 3), max_size=20))
        if len(tokens) < 2:
            continue
        drafter.prepare(DraftRequest("r", tokens, 1))
        index = drafter._indexes["r"]
        for n in range(min_n, max_n + 1):
            want: dict[tuple[int, ...], int] = {}
            for e in range(n, len(tokens)):
                want[tuple(tokens[e - n : e])] = e
            got = index.ends[n - min_n]
            assert got == want and list(got) == list(want)
