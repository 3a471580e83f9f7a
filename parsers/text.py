"""Text channels: where content and reasoning text go, with the whitespace rule.

Whitespace that touches markup is dropped at the ends of a channel's text: the whitespace
run just before a tag or a tool call and the one just after it (so
``"<think>\\nhm\\n</think>\\n\\nHi"`` gives reasoning ``"hm"`` and content ``"Hi"``).
Between two pieces of one channel's text that a tool call separated, that whitespace is
the separator and is kept, a newline where there was none (``"Checking.\\n<tool_call>...
</tool_call>\\nDone."`` gives content ``"Checking.\\n\\nDone."``), so text after a call is
never glued to text before it.  A trailing whitespace run is therefore held back until
the next non-whitespace character shows whether markup follows; at the end of
generation it is kept.  The rule depends only on the text, never on chunking.

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
        self._emitted = False  # some text of this channel went out
        self._gap = ""  # whitespace dropped around markup since the last text went out
        self._due = False  # markup came after text: the next text is preceded by the gap
        self._before = ("", False)  # (gap, due) as they were before the last boundary

    def write(self, text: str) -> None:
        """Text the parser has decided is text of this channel."""
        if not text:
            return
        self._fresh = self._raw_tail = False
        if self.strip_leading:
            stripped = text.lstrip(WHITESPACE)
            self._gap += text[: len(text) - len(stripped)]
            text = stripped
            if not text:
                return
            self.strip_leading = False
        body = text.rstrip(WHITESPACE)
        if body:
            self._pending.append(body)
            self._send(self._separator() + "".join(self._pending))
            self._pending.clear()
            self.at_segment_start = False
        if len(body) < len(text):
            self._pending.append(text[len(body) :])

    def write_raw(self, text: str) -> None:
        """Verbatim text of a rejected tool call: not markup, so it keeps its whitespace."""
        if not text:
            return
        if self._fresh:  # the markup it stood for was never markup: undo its boundary
            self._gap, self._due = self._before
            text = self._dropped + text
        self._pending.clear()
        self._fresh = self.strip_leading = False
        self.at_segment_start = False
        self._raw_tail = True
        self._send(self._separator() + text)

    def boundary(self, call: bool = False) -> None:
        """Markup was consumed here: drop whitespace on both sides of it (``call``: a tool
        call's, which keeps it as the separator if text follows on both sides)."""
        if self._raw_tail or self._fresh:
            return  # what ended here was raw text, not markup; or nothing since the last
        self._dropped = "".join(self._pending)
        self._before = (self._gap, self._due)
        if call:
            self._gap += self._dropped
            self._due = self._due or self._emitted
        self._pending.clear()
        self._fresh = self.strip_leading = self.at_segment_start = True

    def flush(self) -> None:
        """End of generation: trailing whitespace is text after all."""
        if self._pending:
            self._send("".join(self._pending))
            self._pending.clear()

    def _separator(self) -> str:
        """What goes before the next text: the gap markup left after earlier text."""
        sep = (self._gap or "\n") if self._due else ""
        self._gap, self._due = "", False
        return sep

    def _send(self, text: str) -> None:
        self._emitted = True
        self._emit(text)
