"""Qwen3-Coder XML-style calls::

    <tool_call>
    <function=NAME>
    <parameter=P>
    value
    </parameter>
    </function>
    </tool_call>

Values are raw text; one leading and one trailing newline are not part of the value.
String parameters (by the tool's schema; also parameters without a schema) stream as
JSON-escaped fragments while they arrive; other types are converted at their end (see
:mod:`parsers.formats.param_values`).  Tolerated: a bare ``<function=`` without
``<tool_call>``, a missing ``</parameter>`` (the next tag ends the value), several
functions in one ``<tool_call>`` block.  Values are not JSON, so the only tags they can
not contain are those that end them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from enum import Enum
from typing import Any

from parsers.calls import CallContext
from parsers.formats.base import NameReader, NameStatus, StateRegion, ToolFormat, ToolRegion
from parsers.formats.param_values import is_string, to_json
from parsers.markup import Match, TagSet, match_any

TOOL_CALL, TOOL_CALL_END = "<tool_call>", "</tool_call>"
FUNCTION, FUNCTION_END = "<function=", "</function>"
PARAM, PARAM_END = "<parameter=", "</parameter>"
_BODY = TagSet((PARAM, FUNCTION_END, TOOL_CALL_END))
_VALUE_END = TagSet((PARAM_END, PARAM, FUNCTION_END, TOOL_CALL_END))
_SKIP = TagSet((FUNCTION_END, TOOL_CALL_END, TOOL_CALL, FUNCTION))


class _S(Enum):
    WRAP_LEAD = "_wrap_lead"  # after <tool_call>: <function=
    FUNC_NAME = "_func_name"
    BODY = "_body"  # inside a function, between parameters
    PARAM_NAME = "_param_name"
    VALUE_START = "_value_start"  # drop one leading newline
    VALUE = "_value"
    AFTER_FUNC = "_after_func"  # </tool_call> or another <function=
    SKIP = "_skip"


class Qwen3CoderRegion(StateRegion):
    def __init__(self, ctx: CallContext, opener: str) -> None:
        super().__init__(ctx)
        self.call = ctx.new_call(opener)
        self.names = NameReader((">",))
        self.body, self.value_end, self.skip = _BODY.finder(), _VALUE_END.finder(), _SKIP.finder()
        self.function = ""
        self.nparams = 0
        self.schema: Mapping[str, Any] | None = None
        self.in_value = False
        self.value_is_str = False
        self.value_parts: list[str] = []  # a non-string value, converted at its end
        self.held_newline = False  # a string value's trailing '\n', unless more follows
        self.state = _S.WRAP_LEAD if opener == TOOL_CALL else _S.FUNC_NAME

    def finish(self) -> None:
        self._close_function()
        self.done = True

    def _close_function(self) -> None:
        self._end_value()
        if self.call is not None:
            self.call.close("}" if self.nparams else "")

    def _fail(self) -> None:
        self._close_function()
        self.state = _S.SKIP

    def _wrap_lead(self, buf: str, i: int, final: bool) -> int:
        i = self.eat_ws(buf, i)
        m, lit = match_any(buf, i, (FUNCTION, TOOL_CALL_END), final)
        if m is Match.YES:
            i = self.eat(buf, i, i + len(lit))
            if lit == FUNCTION:
                self.state = _S.FUNC_NAME
            else:
                self.finish()  # an empty block
        elif m is Match.NO and (i < len(buf) or final):
            self._fail()
        return i

    def _func_name(self, buf: str, i: int, final: bool) -> int:
        assert self.call is not None
        j, status = self.names.step(buf, i, final)
        self.eat(buf, i, j)
        if status is NameStatus.BAD or (status is NameStatus.DONE and not self.names.name):
            self._fail()
        elif status is NameStatus.DONE:
            self.call.set_name(self.names.name)
            self.function = self.names.name
            self.state = _S.BODY
        return j

    def _body(self, buf: str, i: int, final: bool) -> int:
        end, tag = self.body.scan(buf, i, final)
        i = self.eat(buf, i, end)  # stray text between parameters is dropped
        if tag is None:
            return i
        i = self.eat(buf, i, i + len(tag))
        if tag == PARAM:
            self.names = NameReader((">",))
            self.state = _S.PARAM_NAME
        else:
            self._close_function()
            self.state = _S.AFTER_FUNC
            self.done = tag == TOOL_CALL_END
        return i

    def _param_name(self, buf: str, i: int, final: bool) -> int:
        j, status = self.names.step(buf, i, final)
        self.eat(buf, i, j)
        if status is NameStatus.BAD or (status is NameStatus.DONE and not self.names.name):
            self._fail()
        elif status is NameStatus.DONE:
            self._begin_value(self.names.name)
            self.state = _S.VALUE_START
        return j

    def _begin_value(self, name: str) -> None:
        assert self.call is not None
        self.schema = self.ctx.tools.param_schema(self.function, name)
        self.value_is_str = is_string(self.schema)
        key = json.dumps(name, ensure_ascii=False)
        quote = '"' if self.value_is_str else ""
        self.call.args(("{" if self.nparams == 0 else ", ") + key + ": " + quote)
        self.nparams += 1
        self.in_value, self.value_parts, self.held_newline = True, [], False

    def _value_start(self, buf: str, i: int, final: bool) -> int:
        if i < len(buf) or final:
            if i < len(buf) and buf[i] == "\n":
                i = self.eat(buf, i, i + 1)
            self.state = _S.VALUE
        return i

    def _value(self, buf: str, i: int, final: bool) -> int:
        end, tag = self.value_end.scan(buf, i, final)
        text = ("\n" if self.held_newline else "") + buf[i:end]
        i = self.eat(buf, i, end)
        ends = tag is not None or final
        self.held_newline = not ends and text.endswith("\n")
        if text.endswith("\n") and (ends or self.held_newline):
            text = text[:-1]  # the newline before a closing tag is not part of the value
        self._value_text(text)
        if ends:
            self._end_value()
            if tag == PARAM_END:
                i = self.eat(buf, i, i + len(tag))
            self.state = _S.BODY
        return i

    def _value_text(self, text: str) -> None:
        if not text:
            return
        if not self.value_is_str:
            self.value_parts.append(text)
        elif self.call is not None:
            self.call.args(json.dumps(text, ensure_ascii=False)[1:-1])

    def _end_value(self) -> None:
        if not self.in_value or self.call is None:
            return
        self.in_value = False
        if self.value_is_str:
            self.call.args('"')
        else:
            self.call.args(to_json("".join(self.value_parts), self.schema))

    def _after_func(self, buf: str, i: int, final: bool) -> int:
        i = self.eat_ws(buf, i)
        m, lit = match_any(buf, i, (TOOL_CALL_END, FUNCTION), final)
        if m is Match.YES:
            i = self.eat(buf, i, i + len(lit))
            if lit == FUNCTION:
                self.call = self.ctx.new_call(lit)
                self.names = NameReader((">",))
                self.nparams = 0
                self.state = _S.FUNC_NAME
            else:
                self.done = True
        elif m is Match.NO and (i < len(buf) or final):
            self.done = True
        return i

    def _skip(self, buf: str, i: int, final: bool) -> int:
        end, tag = self.skip.scan(buf, i, final)
        i = self.eat(buf, i, end)
        if tag in (FUNCTION_END, TOOL_CALL_END):
            i = self.eat(buf, i, i + len(tag))
            self.state = _S.AFTER_FUNC
            self.done = tag == TOOL_CALL_END
        elif tag is not None:
            self.state = _S.AFTER_FUNC  # the next call starts here
        elif final:
            self.done = True
        return i


class Qwen3CoderFormat(ToolFormat):
    name = "qwen3_coder"
    start_tags = (TOOL_CALL, FUNCTION)
    stray_tags = (TOOL_CALL_END, FUNCTION_END, PARAM_END)

    def open_region(self, ctx: CallContext, opener: str) -> ToolRegion:
        return Qwen3CoderRegion(ctx, opener)
