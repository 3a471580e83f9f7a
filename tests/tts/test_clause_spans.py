"""Short utterances cut from teacher sentences (``tts.train.spans``): each clause run's
prompt is what espeak-ng itself gives the clause's text spoken alone, its frames are the
sentence's own frames for exactly those phonemes, and ``LMData`` trains and validates on
them without touching the held-out sentences."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("espeakng_loader")

from tts.phoneme_voice import PhonemeVocab  # noqa: E402
from tts.text import phonemize  # noqa: E402
from tts.train.backbone import HOP, LMData, sequence  # noqa: E402
from tts.train.spans import clause_spans  # noqa: E402
from tts.train.teacher import speak  # noqa: E402

VOICE = Path(__file__).resolve().parents[2] / "tts" / "voices" / "default"

# a sentence of the corpus's kinds -> clauses of it as a reply would say them alone
CASES = [
    ("Please bring saddle, telescope, and compass.", ["And compass.", "Telescope, and compass."]),
    ('"We met at noon," said Alice.', ["Said Alice."]),
    ("Quiet! Alice found the lamp yesterday!", ["Quiet!"]),
    ("Is the lamp really warm, or is it cold?", ["Or is it cold?"]),
]


@pytest.fixture(scope="module")
def vocab() -> PhonemeVocab:
    meta = json.loads((VOICE / "voice.json").read_text())
    return PhonemeVocab(meta["symbols"], int(meta["num_q"]), int(meta["codebook"]))


def _sentence(vocab: PhonemeVocab, text: str) -> tuple[np.ndarray, int]:
    """The sentence's training sequence, frame ``i``'s code being ``i`` (traceable)."""
    wav, item = speak(text)
    frames = np.arange(len(wav) // HOP)
    it = {"symbols": item.symbols, "is_phoneme": item.is_phoneme, "starts": item.starts}
    return sequence(vocab, {**it, "length": item.length}, frames)


@pytest.mark.parametrize(("text", "clauses"), CASES)
def test_spans_are_the_clauses_espeak_speaks_alone(vocab, text, clauses):
    seq, start = _sentence(vocab, text)
    spans = clause_spans(seq, start, vocab, max_phonemes=40)
    prompts = [t[:s].tolist() for t, s in spans]
    for clause in clauses:
        assert vocab.prompt(phonemize(clause)) in prompts, clause
    assert seq[:start].tolist() not in prompts  # the whole sentence is not a span

    body = seq[start:-1].reshape(-1, 2)
    names = vocab.names()
    for tokens, s in spans:
        assert tokens[-1] == 2  # <eos>
        marks = [names[t] for t in tokens[1 : s - 1] if names[t] in ",.!?;"]
        assert marks[-1] in ".!?"  # a reply's end, never a comma's pause before <eos>
        n = sum(vocab.q_base <= t < vocab.q_base + vocab.num_q for t in tokens[:s])
        frames = tokens[s:-1].reshape(-1, 2)
        ptr = frames[:, 0] - vocab.q_base
        # (a pause phoneme may end before any frame's centre: no frame points at it)
        assert ptr[0] == 0 and n - 3 <= ptr[-1] <= n - 1 and np.all(np.diff(ptr) >= 0)
        # the sentence's own frames, one contiguous run of them, pointers shifted
        codes = frames[:, 1] - vocab.code_base
        first = int(codes[0])
        assert np.array_equal(codes, np.arange(first, first + len(codes)))
        assert np.array_equal(ptr, body[first : first + len(codes), 0] - body[first, 0])


def test_span_length_bound(vocab):
    seq, start = _sentence(vocab, CASES[0][0])
    for tokens, s in clause_spans(seq, start, vocab, max_phonemes=12):
        assert sum(vocab.q_base <= t < vocab.q_base + vocab.num_q for t in tokens[:s]) <= 12
    assert clause_spans(seq, start, vocab, max_phonemes=3) == []


def test_lm_data_spans_train_and_validate_but_never_hold_out(vocab, tmp_path):
    texts = [c[0] for c in CASES] * 2  # 8 sentences: 4 train, 2 valid, 2 held out
    seqs = [_sentence(vocab, t) for t in texts]
    offsets = np.cumsum([0, *(len(s) for s, _ in seqs)])
    path = tmp_path / "lm_data.npz"
    np.savez(
        path,
        tokens=np.concatenate([s for s, _ in seqs]).astype(np.int32),
        offsets=offsets,
        loss_from=np.array([s for _, s in seqs]),
        symbols=np.array(vocab.symbols),
        num_q=vocab.num_q,
        codebook=vocab.codebook,
    )
    plain = LMData(path, held_out=2, valid=2)
    assert sorted(plain.by_length) == [0, 1, 2, 3] and sorted(plain.valid) == [4, 5]
    with_spans = LMData(path, held_out=2, valid=2, spans=24)
    added_train = sorted(set(with_spans.by_length) - {0, 1, 2, 3})
    added_valid = sorted(set(with_spans.valid) - {4, 5})
    assert len(added_train) == 4 and len(added_valid) == 2  # one span a sentence
    held = {tuple(with_spans.seqs[i][: with_spans.loss_from[i]]) for i in (6, 7)}
    for i in added_train + added_valid:
        assert i >= len(texts) and len(with_spans.seqs[i]) < 0.8 * len(with_spans.seqs[i % 4])
        assert tuple(with_spans.seqs[i][: with_spans.loss_from[i]]) not in held
    ids, mask = with_spans._pack(added_valid, "cpu")
    assert mask.sum() > 0 and int(ids[0, 0]) == 1  # <bos>
