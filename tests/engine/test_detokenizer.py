"""Incremental detokenizer tests on the default model's real tokenizer: streamed text
equals the one-shot decode and never contains a broken character."""

from __future__ import annotations

import random

import pytest
from tokenizers import Tokenizer

from mmserve.engine.detokenizer import MAX_HELD_TOKENS, IncrementalDetokenizer

TEXT = (
    "héllo 世界 🎉👍🏽 Ünïcödé — naïve café. 自然语言处理是人工智能和语言学领域的分支学科。"
    "日本語の文章を書くときには、漢字とひらがなとカタカナを使い分けます。"
    "한국어는 공용어이다. 😀😃🤣🫠👨‍👩‍👧‍👦🏳️‍🌈 Ελληνικά Русский язык العربية हिन्दी ภาษาไทย\n"
    "def f(x):\n    return x ** 2  # tabs\tand   spaces\n"
)


@pytest.fixture(scope="session")
def backend(default_gguf) -> Tokenizer:
    """The default model's tokenizer, as transformers reads it from the verified GGUF
    (conftest's ``default_gguf``: pulled once into ``$MMSERVE_HOME``)."""
    transformers = pytest.importorskip("transformers")
    tok = transformers.AutoTokenizer.from_pretrained(
        str(default_gguf.parent), gguf_file=default_gguf.name
    )
    return tok.backend_tokenizer


def _stream(
    backend: Tokenizer,
    ids: list[int],
    chunks: list[int],
    prompt: list[int] | None = None,
    skip: bool = True,
) -> list[str]:
    detok = IncrementalDetokenizer(backend, prompt or [], skip_special_tokens=skip)
    out, pos = [], 0
    for n in chunks:
        out.append(detok.add(ids[pos : pos + n]))
        pos += n
    out.append(detok.add(ids[pos:]))
    out.append(detok.flush())
    assert detok.text == "".join(out)
    return out


def test_one_token_at_a_time_never_breaks_a_character(backend: Tokenizer) -> None:
    text = "héllo 世界 🎉👍🏽"
    ids = backend.encode(text).ids
    assert any("\ufffd" in backend.decode([t]) for t in ids)  # the test is meaningful
    pieces = _stream(backend, ids, [1] * len(ids))
    assert all("\ufffd" not in p for p in pieces)
    assert "".join(pieces) == text == backend.decode(ids)


def test_long_multilingual_text_streams_exactly(backend: Tokenizer) -> None:
    ids = backend.encode(TEXT).ids
    prompt = backend.encode("<|im_start|>assistant\n").ids
    pieces = _stream(backend, ids, [1] * len(ids), prompt=prompt)
    assert "".join(pieces) == TEXT and all("\ufffd" not in p for p in pieces)


def test_random_slices_and_chunkings_equal_full_decode(backend: Tokenizer) -> None:
    ids = backend.encode(TEXT * 2).ids
    rng = random.Random(0)
    for _ in range(300):
        a = rng.randrange(len(ids))
        seq = ids[a : a + rng.randrange(1, 60)]  # may start or end inside a character
        chunks = [rng.choice([1, 1, 1, 2, 3, 5]) for _ in range(len(seq))]
        prompt = ids[max(0, a - 7) : a]
        assert "".join(_stream(backend, seq, chunks, prompt=prompt)) == backend.decode(seq)


def test_special_tokens_skipped_or_kept(backend: Tokenizer) -> None:
    im_end = backend.token_to_id("<|im_end|>")
    assert im_end is not None
    ids = backend.encode("Hi 世界").ids
    ids = ids[:2] + [im_end] + ids[2:] + [im_end]
    assert "".join(_stream(backend, ids, [1] * len(ids))) == "Hi 世界"
    kept = "".join(_stream(backend, ids, [1] * len(ids), skip=False))
    assert kept == backend.decode(ids, skip_special_tokens=False)
    assert kept.count("<|im_end|>") == 2


def test_broken_bytes_are_bounded_and_flushed(backend: Tokenizer) -> None:
    lead = [t for t in range(backend.get_vocab_size()) if backend.decode([t]) == "\ufffd"]
    garbage = lead[:3] * 10  # never completes a character
    detok = IncrementalDetokenizer(backend, [])
    held_max = 0
    for t in garbage:
        detok.add([t])
        held_max = max(held_max, len(detok._window))
    detok.add(backend.encode(" ok").ids)
    detok.flush()
    assert held_max <= 2 * (MAX_HELD_TOKENS + 1)
    assert detok.text.endswith(" ok") and "\ufffd" in detok.text


def test_empty_add_and_flush(backend: Tokenizer) -> None:
    detok = IncrementalDetokenizer(backend, [1, 2, 3])
    assert detok.add([]) == "" and detok.flush() == "" and detok.text == ""
