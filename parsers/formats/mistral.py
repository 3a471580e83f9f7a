"""Mistral: ``[TOOL_CALLS] [{"name": ..., "arguments": {...}}, ...]`` (tokenizer < v11)
and ``[TOOL_CALLS]name[ARGS]{...}`` (v11+, repeated per call; ``[CALL_ID]id`` before
``[ARGS]`` is accepted and ignored).

There is no end marker: a call ends with its JSON value, and a break ends the region
(what follows is text again).  The list's brackets and commas belong to no call, so a
rejected element's raw text is just its object.
"""

from __future__ import annotations

import re
from enum import Enum

from parsers.calls import CallContext
from parsers.formats.base import NameReader, NameStatus, StateRegion, ToolFormat, ToolRegion
from parsers.json_call import ArgsValue, JsonCallReader

TOOL_CALLS, ARGS, CALL_ID = "[TOOL_CALLS]", "[ARGS]", "[CALL_ID]"
_ID_CHARS = re.compile(r"[\w\-]*")


class _S(Enum):
    LEAD = "_lead"  # '[' (list form) or a name
    ITEM = "_item"  # list: before an element
    OBJECT = "_object"
    ITEM_NEXT = "_item_next"  # list: ',' or ']'
    NAME = "_name"
    CALL_ID = "_call_id"
    ARGS_LEAD = "_args_lead"
    ARGS = "_args"


class MistralRegion(StateRegion):
    def __init__(self, ctx: CallContext, opener: str) -> None:
        super().__init__(ctx)
        self.opener = opener
        self.reader: JsonCallReader | None = None
        self.args: ArgsValue | None = None
        self.names = NameReader((ARGS, CALL_ID))
        self.ids = NameReader((ARGS,), _ID_CHARS)
        self.state = _S.LEAD

    def completion(self) -> str:
        if self.state is _S.OBJECT and self.reader is not None:
            return self.reader.completion()
        if self.state is _S.ARGS and self.args is not None:
            return self.args.completion()
        return ""

    def _lead(self, buf: str, i: int, final: bool) -> int:
        i = self.eat_ws(buf, i)
        if i == len(buf):
            return i
        if buf[i] == "[":
            self.state = _S.ITEM
            return i + 1
        self.call = self.ctx.new_call(self.opener)
        self.state = _S.NAME
        return i

    def _item(self, buf: str, i: int, final: bool) -> int:
        i = self.eat_ws(buf, i)
        if i == len(buf):
            return i
        if buf[i] == "{":
            self.call = self.ctx.new_call()
            self.reader = JsonCallReader(self.call)
            self.state = _S.OBJECT
            return i
        self.done = True  # ']' of an empty list, or not a list of calls after all
        return i + 1 if buf[i] == "]" else i

    def _object(self, buf: str, i: int, final: bool) -> int:
        assert self.reader is not None and self.call is not None
        j = self.reader.step(buf, i, final)
        if self.reader.error:
            self.finish()
        elif self.reader.done:
            self.call.close()
            self.call = None
            self.state = _S.ITEM_NEXT
        return j

    def _item_next(self, buf: str, i: int, final: bool) -> int:
        i = self.eat_ws(buf, i)
        if i == len(buf):
            return i
        if buf[i] == ",":
            self.state = _S.ITEM
            return i + 1
        self.done = True
        return i + 1 if buf[i] == "]" else i

    def _name(self, buf: str, i: int, final: bool) -> int:
        assert self.call is not None
        j, status = self.names.step(buf, i, final)
        self.eat(buf, i, j)
        if status is NameStatus.BAD or (status is NameStatus.DONE and not self.names.name):
            self.finish()
        elif status is NameStatus.DONE:
            self.call.set_name(self.names.name)
            self.state = _S.CALL_ID if self.names.end == CALL_ID else _S.ARGS_LEAD
        return j

    def _call_id(self, buf: str, i: int, final: bool) -> int:
        j, status = self.ids.step(buf, i, final)
        self.eat(buf, i, j)
        if status is NameStatus.BAD:
            self.finish()
        elif status is NameStatus.DONE:
            self.state = _S.ARGS_LEAD
        return j

    def _args_lead(self, buf: str, i: int, final: bool) -> int:
        assert self.call is not None
        i = self.eat_ws(buf, i)
        if i < len(buf):
            self.args = ArgsValue(self.call)
            self.state = _S.ARGS
        return i

    def _args(self, buf: str, i: int, final: bool) -> int:
        assert self.args is not None
        j = self.eat(buf, i, self.args.step(buf, i, final))
        if self.args.error or self.args.done:
            self.finish()
        return j


class MistralFormat(ToolFormat):
    name = "mistral"
    start_tags = (TOOL_CALLS,)
    stray_tags = (ARGS, CALL_ID)

    def open_region(self, ctx: CallContext, opener: str) -> ToolRegion:
        return MistralRegion(ctx, opener)
