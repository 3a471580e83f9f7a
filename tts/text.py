"""Text for speech: splitting at clause boundaries, and the phoneme symbols a voice reads.

``split_clauses`` cuts long input into pieces a voice speaks one request at a time: at
sentence ends first (not after a title such as "Dr.", nor before a lowercase word), then
at clause punctuation, then between words, so no piece is longer than ``max_chars`` (a
word longer than that is cut). With ``join_sentences``, consecutive sentences that fit
one piece together stay together: each piece is spoken as an utterance of its own, with
its own edge silence, so cutting "Smooth! Anna repaired it!" in two puts a pause between
the sentences that a voice speaking whole paragraphs (Orpheus) never makes. A voice
trained on one sentence an utterance (the default voice) ends its utterance at the first
sentence end and drops the rest, so it takes one sentence a piece. Every character of
the input lands in exactly one piece (whitespace between pieces aside), so nothing is
dropped.

``ClauseStream`` does the same incrementally, for text that is still being written (an LLM's
answer spoken while it streams): ``feed(delta)`` returns the pieces that became complete
(a sentence end, or a clause mark once the piece has ``min_chars``, or ``max_chars`` cut
between words) and ``flush()`` the rest; the pieces do not depend on how the text was
chunked.

``phoneme_symbols`` turns espeak's phoneme events into the symbol string the default
voice reads: each phoneme (stress marks kept), ``|`` before each word but the first, and
the punctuation that caused a clause pause (``, . ? ! ; :``) just before that pause, since
the punctuation is what sets espeak's intonation.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from tts.espeak import Espeak, Phoneme

PUNCTUATION = ",.?!;:"
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+|(?<=[.!?][\"')\]])\s+")
_CLAUSE_END = re.compile(r"(?<=[,;:])\s+|\s+(?=[-\u2013\u2014]\s)")


def split_clauses(text: str, max_chars: int = 200, join_sentences: bool = True) -> list[str]:
    """Pieces of ``text`` of at most ``max_chars`` characters, cut where speech pauses
    (with ``join_sentences``, short consecutive sentences share a piece)."""
    out: list[str] = []
    short = ""  # consecutive sentences that fit one piece together
    for sentence in _sentences(text):
        if len(sentence) <= max_chars:
            if short and (not join_sentences or len(short) + 1 + len(sentence) > max_chars):
                out.append(short)
                short = ""
            short = f"{short} {sentence}" if short else sentence
            continue
        if short:
            out.append(short)
            short = ""
        for clause in _pack(_CLAUSE_END.split(sentence), max_chars, " "):
            out += (
                [clause]
                if len(clause) <= max_chars
                else _pack(clause.split(), max_chars, " ", cut=True)
            )
    if short:
        out.append(short)
    return [p.strip() for p in out if p.strip()]


# a period after these ends no sentence ("Dr. Smith"); nor does one before a lowercase word
# ("at 3 p.m. today", "e.g. apples"). Left out: words that also end sentences ("No.")
_TITLES = frozenset("mr mrs ms dr prof st jr sr mt vs".split())


def _sentences(text: str) -> list[str]:
    """``text`` cut at sentence ends, except after a title or before a lowercase word."""
    out: list[str] = []
    for part in _SENTENCE_END.split(text.strip()):
        prev = out[-1] if out else ""
        last_word = prev.rsplit(None, 1)[-1] if prev else ""
        if prev and (part[:1].islower() or last_word[:-1].lower() in _TITLES):
            out[-1] = f"{prev} {part}"
        else:
            out.append(part)
    return out


def _pack(parts: list[str], limit: int, sep: str, cut: bool = False) -> list[str]:
    """Greedily join consecutive ``parts`` into pieces of at most ``limit`` characters."""
    pieces: list[str] = []
    cur = ""
    for part in parts:
        while cut and len(part) > limit:  # a "word" longer than a piece
            if cur:
                pieces.append(cur)
                cur = ""
            pieces.append(part[:limit])
            part = part[limit:]
        if cur and len(cur) + len(sep) + len(part) > limit:
            pieces.append(cur)
            cur = part
        else:
            cur = f"{cur}{sep}{part}" if cur else part
    if cur:
        pieces.append(cur)
    return pieces


class ClauseStream:
    """Incremental clause splitting (see the module docstring)."""

    def __init__(self, min_chars: int = 20, max_chars: int = 200) -> None:
        self.min_chars, self.max_chars = min_chars, max_chars
        self.buf = ""

    def feed(self, delta: str) -> list[str]:
        self.buf += delta
        out = []
        while (cut := self._cut()) is not None:
            piece, self.buf = self.buf[:cut].strip(), self.buf[cut:]
            if piece:
                out.append(piece)
        return out

    def flush(self) -> list[str]:
        rest, self.buf = self.buf.strip(), ""
        return [rest] if rest else []

    def _cut(self) -> int | None:
        """Where the first complete piece of ``buf`` ends (after the whitespace that
        proves it ended), or None while it may still grow."""
        for m in re.finditer(r"[.!?][\"')\]]?\s|[,;:]\s|\s[-\u2013\u2014]\s", self.buf):
            end = m.end()
            if len(self.buf[:end].rstrip()) > self.max_chars:
                break  # too long a piece: cut between words below
            if m.group(0)[0] in ".!?" or len(self.buf[:end].strip()) >= self.min_chars:
                return end
        if len(self.buf) > self.max_chars:
            space = self.buf.rfind(" ", 0, self.max_chars + 1)
            return space + 1 if space > 0 else self.max_chars
        return None


@dataclass
class Phonemized:
    """A text's symbols, which of them are phonemes (with a duration in speech), and each
    phoneme's start sample in espeak's own rendering (22,050 Hz; teacher data only)."""

    symbols: list[str]
    is_phoneme: list[bool]
    starts: list[int]  # one per phoneme
    num_samples: int  # length of espeak's rendering

    @property
    def num_phonemes(self) -> int:
        return len(self.starts)


def phoneme_symbols(text: str, events: list[Phoneme], num_samples: int = 0) -> Phonemized:
    symbols: list[str] = []
    is_ph: list[bool] = []
    starts: list[int] = []
    for i, ev in enumerate(events):
        if ev.word_start and i > 0 and symbols and symbols[-1] != "|":
            symbols.append("|")
            is_ph.append(False)
        if ev.name == "_:":
            mark = _punctuation_at(text, ev.text_position)
            if mark:
                symbols.append(mark)
                is_ph.append(False)
        symbols.append(ev.name)
        is_ph.append(True)
        starts.append(ev.sample)
    return Phonemized(symbols, is_ph, starts, num_samples)


def _punctuation_at(text: str, position: int) -> str | None:
    """The punctuation mark at or just before espeak's 1-based ``position``."""
    for i in (position - 1, position - 2, position - 3):
        if 0 <= i < len(text) and text[i] in PUNCTUATION:
            return text[i]
    return None


def phonemize(text: str) -> Phonemized:
    """The symbols the default voice reads for ``text`` (espeak-ng, en-us)."""
    audio, events = Espeak.get().synthesize(text)
    return phoneme_symbols(text, events, len(audio))
