"""Text channels: where content and reasoning text go, with the whitespace rule.

Whitespace that touches markup is dropped: the whitespace run just before a tag or a
tool call and the one just after it (so ``"<think>\\nhm\\n</think>\\n\\nHi"`` gives
reasoning ``"hm"`` and content ``"Hi"``).  A trailing whitespace run is therefore held
back until the next non-whitespace character shows that no markup follows; at the end
of generation it is kept.  The rule depends only on the text, never on chunking.

A rejected tool call comes back as raw text (see parsers/calls.py); it was never markup,
so the whitespace around it is kept as if no parser had looked at it.
"""

from __future__ import annotations

from collections.abc import Callable

from parsers.markup import WHITESPACE


class TextChannel:
    """One output channel (content or reasoning) of one stream."""

    def __init__(self, emit: Callable[[str], None], strip_leading: bool = False) -> None:
        self._emit = emit
        self._pending: list[str] = []  # trailing whitespace not yet known to be text
        self._dropped = ""  # whitespace dropped at the last boundary, back if raw text follows
        self._fresh = False  # nothing written since the last boundary
        self._raw_tail = False  # the last thing written was raw text
        self.strip_leading = strip_leading  # set after markup: drop leading whitespace
        self.at_segment_start = True  # nothing but whitespace written since markup

    def write(self, text: str) -> None:
        """Text the parser has decided is text of this channel."""
        if not text:
            return
        self._fresh = self._raw_tail = False
        if self.strip_leading:
            text = text.lstrip(WHITESPACE)
            if not text:
                return
            self.strip_leading = False
        body = text.rstrip(WHITESPACE)
        if body:
            self._pending.append(body)
            self._emit("".join(self._pending))
            self._pending.clear()
            self.at_segment_start = False
        if len(body) < len(text):
            self._pending.append(text[len(body) :])

    def write_raw(self, text: str) -> None:
        """Verbatim text of a rejected tool call: not markup, so it keeps its whitespace."""
        if not text:
            return
        if self._fresh:
            text = self._dropped + text
        self._pending.clear()
        self._fresh = self.strip_leading = False
        self.at_segment_start = False
        self._raw_tail = True
        self._emit(text)

    def boundary(self) -> None:
        """Markup was consumed here: drop whitespace on both sides of it."""
        if self._raw_tail or self._fresh:
            return  # what ended here was raw text, not markup; or nothing since the last
        self._dropped = "".join(self._pending)
        self._pending.clear()
        self._fresh = self.strip_leading = self.at_segment_start = True

    def flush(self) -> None:
        """End of generation: trailing whitespace is text after all."""
        if self._pending:
            self._emit("".join(self._pending))
            self._pending.clear()
