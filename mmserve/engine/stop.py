"""Stop strings: find them in streamed text, and know how much text is safe to stream.

Contract
- ``check`` is called after every append with the new text's length. It searches only
  the tail that can hold a stop string ending in the new text (the last
  ``new_text_len + max_stop_len - 1`` characters), so its cost does not grow with
  the output, and it finds stop strings split across tokens.
- When several stop strings match, the one that *ends* first wins (ties: the longer
  one, i.e. the one starting first). That is the stop a character-by-character stream
  would hit first, so the result is independent of how the text was chunked:
  streaming and one ``check(full_text, len(full_text))`` agree.
- The output is ``text[:truncate_to]``: up to the stop string's start, or its end
  with ``include_stop_str_in_output``.
- ``safe_len`` holds back the longest suffix that is a proper prefix of a stop
  string, so streamed text never has to be taken back. It looks only where a
  stop string's first character occurs in the last ``max_len - 1`` characters,
  and stores nothing but the stop strings themselves (memory linear in their
  length; storing every prefix made a 1 MB stop string cost gigabytes). With
  ``include_stop_str_in_output`` nothing needs holding back: any later match ends
  after the current text, so all of it is output either way.
"""

from __future__ import annotations

from typing import NamedTuple


class StopResult(NamedTuple):
    """``truncate_to`` is the final output length (chars) when ``stopped``, else None."""

    stopped: bool
    stop_str: str | None
    truncate_to: int | None


_NOT_STOPPED = StopResult(False, None, None)


class StopChecker:
    """Per-request stop-string state (immutable; safe to share between requests)."""

    def __init__(self, stop: list[str], include_stop_str_in_output: bool = False) -> None:
        assert all(stop), "stop strings must be non-empty"
        self.stop = list(dict.fromkeys(stop))  # dedupe, keep order
        self.include = include_stop_str_in_output
        self.max_len = max((len(s) for s in self.stop), default=0)

    def __bool__(self) -> bool:
        return bool(self.stop)

    def check(self, text_so_far: str, new_text_len: int) -> StopResult:
        """Did the last ``new_text_len`` characters complete a stop string?"""
        if not self.stop or new_text_len <= 0:
            return _NOT_STOPPED
        start = max(0, len(text_so_far) - new_text_len - self.max_len + 1)
        best: tuple[int, int, str] | None = None  # (end, start, stop string)
        for s in self.stop:
            at = text_so_far.find(s, start)
            if at >= 0 and (best is None or (at + len(s), at) < best[:2]):
                best = (at + len(s), at, s)
        if best is None:
            return _NOT_STOPPED
        end, at, s = best
        return StopResult(True, s, end if self.include else at)

    def safe_len(self, text: str) -> int:
        """How many leading characters of ``text`` can be streamed now."""
        if self.include or self.max_len < 2:
            return len(text)
        tail = len(text) - min(self.max_len - 1, len(text))  # where a held suffix may start
        held = min((_held_start(text, s, tail) for s in self.stop), default=len(text))
        return held


def _held_start(text: str, stop: str, lo: int) -> int:
    """The start of the longest suffix of ``text`` (starting at ``lo`` or later) that is a
    proper prefix of ``stop``; ``len(text)`` when there is none."""
    lo = max(lo, len(text) - len(stop) + 1)
    at = text.find(stop[0], lo)
    while at >= 0:
        if stop.startswith(text[at:]):
            return at
        at = text.find(stop[0], at + 1)
    return len(text)
