"""Finding literal markup (tags) in a growing buffer without ever re-scanning it.

Every decision here depends only on the text, never on where a chunk ended: when the
buffer ends in something that could still become a tag, the answer is "wait", and only
at the end of generation (``final``) is a partial tag taken as plain text.
"""

from __future__ import annotations

from enum import Enum

WHITESPACE = " \t\r\n"


class Match(Enum):
    """Outcome of testing for one literal at a position."""

    YES = 1
    NO = 2
    MORE = 3  # the buffer ends inside what could still be the literal


def skip_ws(buf: str, i: int) -> int:
    """Index of the first non-whitespace character at or after ``i``."""
    n = len(buf)
    while i < n and buf[i] in WHITESPACE:
        i += 1
    return i


def match_literal(buf: str, i: int, lit: str, final: bool) -> Match:
    """Does ``lit`` start at ``buf[i]``?  MORE when the buffer is too short to tell."""
    avail = buf[i : i + len(lit)]
    if avail == lit:
        return Match.YES
    if not final and len(avail) < len(lit) and lit.startswith(avail):
        return Match.MORE
    return Match.NO


def match_any(buf: str, i: int, lits: tuple[str, ...], final: bool) -> tuple[Match, str]:
    """First of ``lits`` that matches at ``i``; MORE as soon as one might still match.

    Callers list a literal before any shorter literal that is its prefix.
    """
    for lit in lits:
        m = match_literal(buf, i, lit, final)
        if m is not Match.NO:
            return m, lit
    return Match.NO, ""


class TagSet:
    """An immutable set of tags; :meth:`finder` gives a per-stream searcher over it."""

    def __init__(self, tags: tuple[str, ...]) -> None:
        assert tags and all(tags), "a TagSet needs non-empty tags"
        self.tags = tags
        self.maxlen = max(len(t) for t in tags)
        # Every proper prefix of every tag: what the end of a buffer may hold back.
        self.prefixes = frozenset(t[:k] for t in tags for k in range(1, len(t)))
        self.first_chars = frozenset(t[0] for t in tags)

    def finder(self) -> TagFinder:
        return TagFinder(self)

    def partial_tail(self, buf: str, start: int) -> int:
        """Length of the longest suffix of ``buf[start:]`` that is a proper tag prefix."""
        n = len(buf)
        for k in range(min(self.maxlen - 1, n - start), 0, -1):
            if buf[n - k] in self.first_chars and buf[n - k :] in self.prefixes:
                return k
        return 0


class TagFinder:
    """Finds the earliest tag of a :class:`TagSet` in a buffer.

    Remembers, per tag, where it was last found in the current buffer, so that many
    steps over one large buffer cost one pass per tag rather than one pass per step.
    """

    def __init__(self, tagset: TagSet) -> None:
        self.tagset = tagset
        self._buf: str | None = None
        self._next: dict[str, tuple[int, int]] = {}  # tag -> (found at or -1, searched from)

    def _find(self, buf: str, tag: str, i: int) -> int:
        hit = self._next.get(tag)
        if hit is not None:
            pos, start = hit
            if (pos == -1 and start <= i) or pos >= i:
                return pos
        pos = buf.find(tag, i)
        self._next[tag] = (pos, i)
        return pos

    def scan(self, buf: str, i: int, final: bool) -> tuple[int, str | None]:
        """Return ``(end, tag)``: ``buf[i:end]`` is certainly text; ``tag`` starts at ``end``.

        With no tag, ``end`` stops before anything that could still become a tag (or at
        the buffer's end when ``final``).
        """
        if buf is not self._buf:
            self._buf = buf
            self._next.clear()
        best, best_tag = -1, ""
        for tag in self.tagset.tags:
            pos = self._find(buf, tag, i)
            if pos == -1:
                continue
            if best == -1 or pos < best or (pos == best and len(tag) > len(best_tag)):
                best, best_tag = pos, tag
        if best != -1:
            if not final and self._could_grow(buf, best, best_tag):
                return best, None
            return best, best_tag
        if final:
            return len(buf), None
        return len(buf) - self.tagset.partial_tail(buf, i), None

    def _could_grow(self, buf: str, pos: int, tag: str) -> bool:
        """A longer tag that starts with ``tag`` may still match at ``pos``."""
        rest = buf[pos : pos + self.tagset.maxlen]
        return any(
            len(t) > len(tag) and t.startswith(rest) and len(rest) < len(t)
            for t in self.tagset.tags
        )
