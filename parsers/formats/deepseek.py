"""DeepSeek V3 / R1 and V3.1 tool calls.

V3::

    <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME
    ```json
    {...}
    ```<｜tool▁call▁end｜>...<｜tool▁calls▁end｜>

V3.1::

    <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{...}<｜tool▁call▁end｜>...

A region opened by a bare ``<｜tool▁call▁begin｜>`` (no ``calls▁begin``) is accepted.
The code fence of V3 is optional.  The block markers belong to no call; a rejected
call's raw text runs from its ``call▁begin`` to its ``call▁end``.
"""

from __future__ import annotations

import re
from enum import Enum

from parsers.calls import CallContext
from parsers.formats.base import NameReader, NameStatus, StateRegion, ToolFormat, ToolRegion
from parsers.json_call import ArgsValue
from parsers.markup import Match, TagSet, match_any

CALLS_BEGIN, CALLS_END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
CALL_BEGIN, CALL_END, SEP = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"
_SKIP = TagSet((CALL_END, CALLS_END, CALL_BEGIN))
_TYPE_CHARS = re.compile(r"[\w]*")


class _S(Enum):
    OUTER = "_outer"  # between calls
    TYPE = "_type"  # V3: "function" before the separator
    NAME = "_name"
    FENCE_OPEN = "_fence_open"
    ARGS_LEAD = "_args_lead"
    ARGS = "_args"
    FENCE_CLOSE = "_fence_close"
    END = "_end"
    SKIP = "_skip"


class DeepSeekRegion(StateRegion):
    def __init__(self, ctx: CallContext, opener: str, typed: bool) -> None:
        super().__init__(ctx)
        self.typed = typed
        self.args: ArgsValue | None = None
        self.names = NameReader(("\n",) if typed else (SEP,))
        self.types = NameReader((SEP,), _TYPE_CHARS)
        self.skip = _SKIP.finder()
        self.state = _S.OUTER
        if opener == CALL_BEGIN:
            self._begin_call(opener)

    def completion(self) -> str:
        return self.args.completion() if self.state is _S.ARGS and self.args else ""

    def _begin_call(self, opener: str) -> None:
        self.call = self.ctx.new_call(opener)
        self.names = NameReader(self.names.finder.tagset.tags)
        self.types = NameReader((SEP,), _TYPE_CHARS)
        self.args = None
        self.state = _S.TYPE if self.typed else _S.NAME

    def _fail(self) -> None:
        assert self.call is not None
        self.call.close(self.completion())
        self.state = _S.SKIP

    def _outer(self, buf: str, i: int, final: bool) -> int:
        i = self.eat_ws(buf, i)
        m, lit = match_any(buf, i, (CALL_BEGIN, CALLS_END), final)
        if m is Match.YES:
            i = self.eat(buf, i, i + len(lit))
            if lit == CALL_BEGIN:
                self._begin_call(lit)
            else:
                self.done = True
        elif m is Match.NO and (i < len(buf) or final):
            self.done = True
        return i

    def _type(self, buf: str, i: int, final: bool) -> int:
        j, status = self.types.step(buf, i, final)
        self.eat(buf, i, j)
        if status is NameStatus.BAD:
            self._fail()
        elif status is NameStatus.DONE:
            self.state = _S.NAME
        return j

    def _name(self, buf: str, i: int, final: bool) -> int:
        assert self.call is not None
        j, status = self.names.step(buf, i, final)
        self.eat(buf, i, j)
        if status is NameStatus.BAD or (status is NameStatus.DONE and not self.names.name):
            self._fail()
        elif status is NameStatus.DONE:
            self.call.set_name(self.names.name)
            self.state = _S.FENCE_OPEN if self.typed else _S.ARGS_LEAD
        return j

    def _fence(self, buf: str, i: int, final: bool, lits: tuple[str, ...], nxt: _S) -> int:
        i = self.eat_ws(buf, i)
        m, lit = match_any(buf, i, lits, final)
        if m is Match.YES:
            i = self.eat(buf, i, i + len(lit))
            self.state = nxt
        elif m is Match.NO and (i < len(buf) or final):
            self.state = nxt
        return i

    def _fence_open(self, buf: str, i: int, final: bool) -> int:
        return self._fence(buf, i, final, ("```json", "```"), _S.ARGS_LEAD)

    def _fence_close(self, buf: str, i: int, final: bool) -> int:
        return self._fence(buf, i, final, ("```",), _S.END)

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
        if self.args.error:
            self._fail()
        elif self.args.done:
            self.state = _S.FENCE_CLOSE if self.typed else _S.END
        return j

    def _end(self, buf: str, i: int, final: bool) -> int:
        assert self.call is not None
        i = self.eat_ws(buf, i)
        m, _ = match_any(buf, i, (CALL_END,), final)
        if m is Match.YES:
            i = self.eat(buf, i, i + len(CALL_END))
            self.call.close()
            self.call = None
            self.state = _S.OUTER
        elif m is Match.NO and (i < len(buf) or final):
            self._fail()
        return i

    def _skip(self, buf: str, i: int, final: bool) -> int:
        end, tag = self.skip.scan(buf, i, final)
        i = self.eat(buf, i, end)
        if tag == CALL_END:
            i = self.eat(buf, i, i + len(tag))
        if tag is not None:
            self.call = None
            self.state = _S.OUTER  # OUTER consumes calls_end / call_begin itself
        elif final:
            self.done = True
        return i


class DeepSeekV3Format(ToolFormat):
    name = "deepseek_v3"
    start_tags = (CALLS_BEGIN, CALL_BEGIN)
    stray_tags = (CALLS_END, CALL_END, SEP)
    typed = True

    def open_region(self, ctx: CallContext, opener: str) -> ToolRegion:
        return DeepSeekRegion(ctx, opener, self.typed)


class DeepSeekV31Format(DeepSeekV3Format):
    name = "deepseek_v31"
    typed = False
