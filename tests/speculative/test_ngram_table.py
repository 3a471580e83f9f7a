"""The global n-gram table: builder against a brute-force Counter reference, file format,
memory-mapping and the drafter."""

from __future__ import annotations

import json
import random
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mmserve.speculative import ngram_format as fmt
from mmserve.speculative.drafter import DraftRequest
from mmserve.speculative.ngram_build import build_table, build_table_from_jsonl
from mmserve.speculative.ngram_table import NgramTable, NgramTableDrafter


def reference_table(
    seqs: list[list[int]], n: int, max_cont: int, min_count: int
) -> dict[tuple[int, ...], tuple[list[int], int, int]]:
    """context -> (greedy most frequent continuation, its count, context count), by brute force."""
    follows: dict[tuple[int, ...], list[tuple[int, ...]]] = defaultdict(list)
    for seq in seqs:
        for i in range(n, len(seq)):
            follows[tuple(seq[i - n : i])].append(tuple(seq[i : i + max_cont]))
    table = {}
    for ctx, conts in follows.items():
        chain: list[int] = []
        alive, count = conts, 0
        for j in range(max_cont):
            tokens = Counter(c[j] for c in alive if len(c) > j)
            ended = sum(1 for c in alive if len(c) <= j)
            if not tokens:
                break
            tok, cnt = min(tokens.items(), key=lambda kv: (-kv[1], kv[0]))
            if cnt < min_count or ended > cnt:
                break
            chain.append(tok)
            count = cnt
            alive = [c for c in alive if len(c) > j and c[j] == tok]
        if chain:
            table[ctx] = (chain, count, len(conts))
    return table


def synthetic_corpus(seed: int, num_seqs: int = 60, vocab: int = 6) -> list[list[int]]:
    rng = random.Random(seed)
    phrases = [[rng.randrange(vocab) for _ in range(rng.randrange(3, 9))] for _ in range(5)]
    seqs = []
    for _ in range(num_seqs):
        seq: list[int] = []
        while len(seq) < rng.randrange(5, 40):
            seq += rng.choice(phrases) if rng.random() < 0.7 else [rng.randrange(vocab)]
        seqs.append(seq)
    return seqs


def test_most_frequent_continuation(tmp_path: Path) -> None:
    seqs = [[1, 2, 3, 4, 5, 6]] * 5 + [[1, 2, 3, 7, 8]] * 3 + [[9, 1, 2, 3, 4, 5, 0]]
    build_table(seqs, tmp_path / "t.bin", n=3, max_continuation=8, min_count=2)
    table = NgramTable(tmp_path / "t.bin")
    assert table.lookup([0, 1, 2, 3], 8) == [4, 5, 6]  # 4 5 seen 6 times; then 6 five times
    assert table.lookup([1, 2, 3], 1) == [4]
    assert table.lookup_with_count([1, 2, 3]) == ([4, 5, 6], 5, 9)
    assert table.lookup([2, 3, 7], 4) == [8]
    assert table.lookup([3, 2, 1], 4) == [] and table.lookup([2, 3], 4) == []  # unseen / short


@pytest.mark.parametrize(("n", "max_cont", "min_count", "load"), [(3, 8, 2, 0.5), (2, 4, 1, 0.95)])
def test_matches_bruteforce_reference(
    tmp_path: Path, n: int, max_cont: int, min_count: int, load: float
) -> None:
    """Every context equals the reference; a load factor of 0.95 forces long probe chains."""
    seqs = synthetic_corpus(seed=n)
    stats = build_table(seqs, tmp_path / "t.bin", n, max_cont, min_count, load_factor=load)
    ref = reference_table(seqs, n, max_cont, min_count)
    assert stats.num_entries == len(ref)
    mapped, loaded = NgramTable(tmp_path / "t.bin"), NgramTable(tmp_path / "t.bin", in_memory=True)
    assert isinstance(mapped._records, np.memmap) and not isinstance(loaded._records, np.memmap)
    contexts = {tuple(s[i - n : i]) for s in seqs for i in range(n, len(s) + 1)}
    contexts |= {tuple(random.Random(i).choices(range(8), k=n)) for i in range(200)}
    for ctx in contexts:
        expected = ref.get(ctx, ([], 0, 0))
        assert mapped.lookup_with_count(list(ctx)) == expected
        assert loaded.lookup_with_count(list(ctx)) == expected
        assert mapped.lookup([5, *ctx], 3) == loaded.lookup([5, *ctx], 3) == expected[0][:3]
    mapped.verify()


@settings(max_examples=50, deadline=None)
@given(st.lists(st.lists(st.integers(0, 2**31 - 1), min_size=1, max_size=5), min_size=1))
def test_vectorised_hash_equals_scalar(windows: list[list[int]]) -> None:
    width = len(windows[0])
    rows = [w[:width] + [0] * (width - len(w)) for w in windows]
    vectorised = fmt.hash_windows(np.array(rows, dtype=np.int64))
    assert [int(h) for h in vectorised] == [fmt.hash_context(r) for r in rows]


def test_header_records_format(tmp_path: Path) -> None:
    build_table(synthetic_corpus(1), tmp_path / "t.bin", n=2, max_continuation=5)
    header = fmt.read_header(tmp_path / "t.bin")
    assert (tmp_path / "t.bin").read_bytes()[:8] == fmt.MAGIC
    assert int(header["version"]) == fmt.VERSION
    assert (int(header["n"]), int(header["max_continuation"]), int(header["min_count"])) == (
        2,
        5,
        2,
    )


def _corrupt(path: Path, offset: int, data: bytes) -> None:
    raw = bytearray(path.read_bytes())
    raw[offset : offset + len(data)] = data
    path.write_bytes(bytes(raw))


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda p: _corrupt(p, 0, b"GGUF"), "not an mmserve n-gram table"),
        (lambda p: _corrupt(p, 8, (99).to_bytes(4, "little")), "format version 99"),
        (lambda p: _corrupt(p, 12, (4).to_bytes(4, "little")), "corrupt header"),
        (lambda p: p.write_bytes(p.read_bytes()[:-10]), "truncated"),
        (lambda p: p.write_bytes(p.read_bytes()[:40]), "not an mmserve n-gram table"),
        (lambda p: p.unlink(), "does not exist"),
    ],
)
def test_bad_files_give_clear_errors(tmp_path: Path, damage, message: str) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "t.bin"
    build_table(synthetic_corpus(2), path)
    damage(path)
    with pytest.raises(fmt.NgramTableError, match=message) as info:
        NgramTable(path)
    assert "mmserve ngram build" in str(info.value)


def test_corrupt_records_fail_verify(tmp_path: Path) -> None:
    path = tmp_path / "t.bin"
    build_table(synthetic_corpus(3), path)
    _corrupt(path, fmt.HEADER_SIZE + 3, b"\xff")
    table = NgramTable(path)  # opening does not read the records
    with pytest.raises(fmt.NgramTableError, match="checksum"):
        table.verify()


def _bytes_read() -> int:
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    raise AssertionError("no rchar in /proc/self/io")


@pytest.mark.skipif(not Path("/proc/self/io").exists(), reason="needs Linux /proc/self/io")
def test_large_table_opens_without_reading_it(tmp_path: Path) -> None:
    path = tmp_path / "big.bin"
    build_table(synthetic_corpus(4), path, num_slots=2**19)
    size = path.stat().st_size
    assert size > 20 * 2**20
    before = _bytes_read()
    table = NgramTable(path)
    assert _bytes_read() - before < 2**16  # the header only
    assert table.lookup([0, 0, 0], 1) == NgramTable(path, in_memory=True).lookup([0, 0, 0], 1)
    before = _bytes_read()
    NgramTable(path, in_memory=True)
    assert _bytes_read() - before >= size - fmt.HEADER_SIZE  # the contrast: a full read


def test_drafter_and_prefetch(tmp_path: Path) -> None:
    seqs = synthetic_corpus(5)
    build_table(seqs, tmp_path / "t.bin", n=3)
    table = NgramTable(tmp_path / "t.bin")
    drafter = NgramTableDrafter(tmp_path / "t.bin", n=3)
    try:
        batch = [
            DraftRequest(str(i), s[:20], k)
            for i, (s, k) in enumerate(zip(seqs, [0, 1, 4, 8] * 15, strict=True))
        ]
        batch.append(DraftRequest("short", [1], 3))
        drafter.prefetch(batch).result(timeout=10)
        drafts = drafter.propose(batch)
        for req, draft in zip(batch, drafts, strict=True):
            assert draft.probs is None and len(draft.tokens) <= req.k
            assert draft.tokens == table.lookup(req.token_ids, req.k)
        with pytest.raises(ValueError, match="context length 3"):
            NgramTableDrafter(table, n=2)
    finally:
        drafter.close()


def test_build_from_jsonl(tmp_path: Path) -> None:
    texts = ["the cat sat on the mat", "the cat sat down", "", "a cat sat on the mat again"]
    vocab: dict[str, int] = {}
    encode = lambda text: [vocab.setdefault(w, len(vocab)) for w in text.split()]
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text(
        "\n".join(json.dumps({"text": t, "id": i}) for i, t in enumerate(texts)) + "\n\n"
    )
    build_table_from_jsonl(corpus, encode, tmp_path / "a.bin", n=2, min_count=2)
    vocab.clear()
    build_table([encode(t) for t in texts], tmp_path / "b.bin", n=2, min_count=2)
    assert (tmp_path / "a.bin").read_bytes() == (tmp_path / "b.bin").read_bytes()
    table = NgramTable(tmp_path / "a.bin")
    assert table.lookup(encode("the cat"), 4) == encode("sat")  # then "on" once, "down" once
    assert table.lookup(encode("cat sat"), 4) == encode("on the mat")
    corpus.write_text('{"text": "ok"}\n{"txt": "bad"}\n')
    with pytest.raises(ValueError, match=r'corpus.jsonl:2: .*"text"'):
        build_table_from_jsonl(corpus, encode, tmp_path / "c.bin")
    corpus.write_text("not json\n")
    with pytest.raises(ValueError, match="corpus.jsonl:1: not valid JSON"):
        build_table_from_jsonl(corpus, encode, tmp_path / "c.bin")


def test_build_rejects_bad_input(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="token ids"):
        build_table([[1, -2, 3, 4]], tmp_path / "t.bin")
    with pytest.raises(ValueError, match="n \\(context length\\)"):
        build_table([[1, 2]], tmp_path / "t.bin", n=0)
    with pytest.raises(ValueError, match="power of two"):
        build_table([[1, 2, 3, 4, 5]] * 3, tmp_path / "t.bin", n=1, num_slots=3)
