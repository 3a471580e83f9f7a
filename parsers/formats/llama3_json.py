"""Llama 3.x JSON tool calls: ``[<|python_tag|>]{"name": ..., "parameters": {...}}``.

Several calls are separated by ``;``.  Without ``<|python_tag|>`` a call is bare JSON,
recognised only where a text segment starts (start of output, or right after markup
such as ``</think>``) and only when it looks like a call (see ``JsonCallReader``'s
``bare``), so that an ordinary JSON answer like ``{"answer": 42}`` stays content.  ``arguments``
is accepted as a synonym of ``parameters``.  There is no end marker: a call ends with
its JSON object.
"""

from __future__ import annotations

from enum import Enum

from parsers.calls import CallContext
from parsers.formats.base import StateRegion, ToolFormat, ToolRegion
from parsers.json_call import JsonCallReader

PYTHON_TAG = "<|python_tag|>"


class _S(Enum):
    LEAD = "_lead"  # before an object
    OBJECT = "_object"
    TAIL = "_tail"  # after an object: ';' or the end of the region


class Llama3Region(StateRegion):
    def __init__(self, ctx: CallContext, opener: str) -> None:
        super().__init__(ctx)
        self.bare = opener == ""
        self.call = ctx.new_call(opener)
        self.reader: JsonCallReader | None = None
        self.state = _S.LEAD

    def completion(self) -> str:
        return self.reader.completion() if self.reader is not None else ""

    def _lead(self, buf: str, i: int, final: bool) -> int:
        i = self.eat_ws(buf, i)
        if i == len(buf):
            return i
        if buf[i] != "{":
            self.finish()  # after python_tag / ';' something that is not a call: text
            return i
        if self.call is None or self.call.closed:
            self.call = self.ctx.new_call()
        self.reader = JsonCallReader(self.call, self.bare)
        self.state = _S.OBJECT
        return i

    def _object(self, buf: str, i: int, final: bool) -> int:
        assert self.reader is not None and self.call is not None
        j = self.reader.step(buf, i, final)
        if self.reader.error:
            self.finish()  # no end marker to skip to: the rest is text again
        elif self.reader.done:
            self.call.close()
            self.state = _S.TAIL
        return j

    def _tail(self, buf: str, i: int, final: bool) -> int:
        i = self.eat_ws(buf, i)
        if i == len(buf):
            return i
        if buf[i] == ";":
            self.call = None  # the separator belongs to no call
            self.state = _S.LEAD
            return i + 1
        self.done = True
        return i


class Llama3JsonFormat(ToolFormat):
    name = "llama3_json"
    start_tags = (PYTHON_TAG,)
    bare_json = True

    def open_region(self, ctx: CallContext, opener: str) -> ToolRegion:
        return Llama3Region(ctx, opener)
