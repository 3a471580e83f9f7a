"""Hermes / Qwen2.5 / Qwen3: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``.

Newlines around the JSON are optional.  Several objects inside one ``<tool_call>``
block are read as several calls.  A missing ``</tool_call>`` ends the call where the
JSON ends.
"""

from __future__ import annotations

from enum import Enum

from parsers.calls import CallContext
from parsers.formats.base import StateRegion, ToolFormat, ToolRegion
from parsers.json_call import JsonCallReader
from parsers.markup import Match, TagSet, match_literal

START, END = "<tool_call>", "</tool_call>"
_SKIP = TagSet((END, START))


class _S(Enum):
    LEAD = "_lead"  # before the JSON object
    OBJECT = "_object"
    TAIL = "_tail"  # after an object: '</tool_call>' or another object
    SKIP = "_skip"  # after a break: drop text up to the end tag


class HermesRegion(StateRegion):
    def __init__(self, ctx: CallContext, opener: str) -> None:
        super().__init__(ctx)
        self.call = ctx.new_call(opener)
        self.reader: JsonCallReader | None = None
        self.skip = _SKIP.finder()
        self.state = _S.LEAD

    def completion(self) -> str:
        return self.reader.completion() if self.reader is not None else ""

    def _fail(self) -> None:
        assert self.call is not None
        self.call.close(self.completion())
        self.state = _S.SKIP

    def _lead(self, buf: str, i: int, final: bool) -> int:
        i = self.eat_ws(buf, i)
        if i == len(buf):
            return i
        if buf[i] == "{":
            self._new_object()
            return i
        m = match_literal(buf, i, END, final)
        if m is Match.YES:  # an empty block: nothing to call
            i = self.eat(buf, i, i + len(END))
            self.finish()
        elif m is Match.NO:
            self._fail()
        return i

    def _new_object(self) -> None:
        if self.call is None or self.call.closed:
            self.call = self.ctx.new_call()
        self.reader = JsonCallReader(self.call)
        self.state = _S.OBJECT

    def _object(self, buf: str, i: int, final: bool) -> int:
        assert self.reader is not None and self.call is not None
        j = self.reader.step(buf, i, final)
        if self.reader.error:
            self._fail()
        elif self.reader.done:
            self.call.close()
            self.state = _S.TAIL
        return j

    def _tail(self, buf: str, i: int, final: bool) -> int:
        i = self.eat_ws(buf, i)
        if i == len(buf):
            return i
        if buf[i] == "{":
            self._new_object()
            return i
        m = match_literal(buf, i, END, final)
        if m is Match.YES:
            i = self.eat(buf, i, i + len(END))
            self.done = True
        elif m is Match.NO:
            self.done = True  # no end tag: what follows is text again
        return i

    def _skip(self, buf: str, i: int, final: bool) -> int:
        end, tag = self.skip.scan(buf, i, final)
        i = self.eat(buf, i, end)
        if tag == END:
            i = self.eat(buf, i, i + len(END))
            self.done = True
        elif tag == START or final:
            self.done = True
        return i


class HermesFormat(ToolFormat):
    name = "hermes"
    start_tags = (START,)
    stray_tags = (END,)

    def open_region(self, ctx: CallContext, opener: str) -> ToolRegion:
        return HermesRegion(ctx, opener)
