"""Short utterances cut from the teacher's sentences at their pauses.

Voice agents say "Okay." and "Thank you!", but 99 % of the teacher sentences have 22
phonemes or more, and a backbone that never heard a short prompt does not keep its place
in one. espeak-ng ends every clause it speaks with a pause phoneme (``_:``, after the
clause's mark: ``, _: _``) and every sentence with the same (``. _: _``), so each run of
whole clauses of a sentence, cut at those pauses, is itself an utterance of the corpus's
own kind: its prompt ends the way a short reply's does, its first frame is the onset of
its first phoneme (as a sentence's is) after the clause before it fell silent, and its
last frames are the pause. The frames are the teacher's own codes, so no audio is spoken
or encoded again (the codec's encoder is not shipped with a voice).
"""

from __future__ import annotations

import numpy as np

from tts.phoneme_voice import BOS, EOS, SPECIALS, SPEECH, PhonemeVocab

PAUSE = "_:"
# a run ends where a reply ends: a comma's pause followed by <eos> would teach the backbone
# to stop at a sentence's inner commas
FINAL_MARKS = frozenset(".!?")


def _items(prompt: np.ndarray, vocab: PhonemeVocab) -> list[tuple[int, int | None]]:
    """A prompt's ``(symbol token, phoneme index or None)`` items, ``<bos>``/``<speech>``
    excluded."""
    items: list[tuple[int, int | None]] = []
    for t in prompt[1:-1].tolist():
        if vocab.q_base <= t < vocab.q_base + vocab.num_q:
            sym, _ = items[-1]
            items[-1] = (sym, t - vocab.q_base)
        else:
            items.append((t, None))
    return items


def _segments(items: list[tuple[int, int | None]], vocab: PhonemeVocab) -> list[tuple[int, int]]:
    """Item ranges ``[a, b)`` of the sentence's clauses: each ends with the pause it was
    spoken with (marks and ``_``-phonemes, word separators dropped), the next starts at
    its first spoken phoneme. Pauses before the first spoken phoneme (a leading quote)
    belong to the first clause."""

    def name(i: int) -> str:
        return vocab.symbols[items[i][0] - len(SPECIALS)]

    def spoken(i: int) -> bool:
        return items[i][1] is not None and not name(i).startswith("_")

    out: list[tuple[int, int]] = []
    start, i, n = 0, 0, len(items)
    seen_spoken = False
    while i < n:
        if spoken(i):
            seen_spoken = True
            i += 1
            continue
        j = i  # a run of marks, separators and pause phonemes
        while j < n and not spoken(j):
            j += 1
        if seen_spoken and any(items[m][1] is not None and name(m) == PAUSE for m in range(i, j)):
            end = j
            while end > i and name(end - 1) == "|":
                end -= 1
            out.append((start, end))
            start, seen_spoken = j, False
        i = j
    if start < n and seen_spoken:
        out.append((start, n))
    return out


def clause_spans(
    seq: np.ndarray, loss_from: int, vocab: PhonemeVocab, max_phonemes: int
) -> list[tuple[np.ndarray, int]]:
    """Every run of whole clauses of one sentence's token sequence (``sequence``'s
    layout) that ends with a sentence's end (``FINAL_MARKS``) and has at most
    ``max_phonemes`` phonemes, the whole sentence excepted, as
    ``(tokens, loss_from)``: the run's prompt with its pointers renumbered from 0, the
    frames whose pointer is in the run (renumbered alike), then ``<eos>``."""
    prompt = seq[:loss_from]
    items = _items(prompt, vocab)
    segs = _segments(items, vocab)
    if len(segs) < 2:
        return []
    body = seq[loss_from:-1].reshape(-1, 2).astype(np.int64)
    ptr = body[:, 0] - vocab.q_base
    ks = [[k for _, k in items[a:b] if k is not None] for a, b in segs]
    final = [
        any(vocab.symbols[sym - len(SPECIALS)] in FINAL_MARKS for sym, k in items[a:b] if k is None)
        for a, b in segs
    ]
    out: list[tuple[np.ndarray, int]] = []
    for first in range(len(segs)):
        for last in range(first, len(segs)):
            if first == 0 and last == len(segs) - 1:
                break
            k0, k1 = ks[first][0], ks[last][-1]
            if k1 - k0 + 1 > max_phonemes:
                break
            if not final[last]:
                continue
            new_prompt = [BOS]
            for sym, k in items[segs[first][0] : segs[last][1]]:
                new_prompt.append(sym)
                if k is not None:
                    new_prompt.append(vocab.q_base + k - k0)
            new_prompt.append(SPEECH)
            keep = (ptr >= k0) & (ptr <= k1)
            frames = body[keep].copy()
            if len(frames) == 0:
                continue
            frames[:, 0] -= k0
            tokens = np.concatenate([new_prompt, frames.reshape(-1), [EOS]])
            out.append((tokens, len(new_prompt)))
    return out
