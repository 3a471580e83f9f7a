"""The tool-format interface: one :class:`ToolFormat` per model family.

A format names the tags that open a tool-call *region* in text, the stray tags to drop
from text, and builds a :class:`ToolRegion` -- a per-stream state machine that reads one
region (one or several calls) and reports each call through :class:`parsers.calls.Call`.

Contract for ``ToolRegion.step(buf, i, final)``:

* consume from ``buf[i:]`` and return the new position; return ``i`` unchanged when the
  text so far cannot decide the next move (it is called again with more text);
* never decide on where the buffer happens to end: only ``final`` (end of generation)
  may turn "could still be a tag" into "is text";
* set ``done`` when the region is over; text after the returned position is not part
  of the region and goes back to the content parser.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from enum import Enum
from typing import ClassVar

from parsers.calls import Call, CallContext
from parsers.markup import TagSet, skip_ws

NAME_CHARS = re.compile(r"[\w.\-]*")
MAX_NAME = 256


class ToolRegion(ABC):
    """Reads one tool-call region of one stream (see the module docstring)."""

    def __init__(self, ctx: CallContext) -> None:
        self.ctx = ctx
        self.done = False
        self.call: Call | None = None  # the call that raw text is attributed to

    @abstractmethod
    def step(self, buf: str, i: int, final: bool) -> int: ...

    def finish(self) -> None:
        """End of generation inside the region: close the open call (policy applies)."""
        if self.call is not None:
            self.call.close(self.completion())
        self.done = True

    def completion(self) -> str:
        """Text that closes the open call's arguments if they were cut off."""
        return ""


class StateRegion(ToolRegion):
    """A region written as a state machine.  Each state's value is the name of its
    handler method ``(buf, i, final) -> new i`` (names, not bound methods, so that a
    region holds no reference cycle and is freed as soon as it ends); stepping stops
    when a handler makes no move."""

    state: Enum

    def step(self, buf: str, i: int, final: bool) -> int:
        while not self.done:
            state = self.state
            j = getattr(self, state.value)(buf, i, final)
            if j == i and self.state is state and not self.done:
                break
            i = j
        return i

    def eat(self, buf: str, i: int, j: int) -> int:
        """Consume ``buf[i:j]`` as part of the current call's raw text."""
        if j > i and self.call is not None:
            self.call.raw(buf[i:j])
        return j

    def eat_ws(self, buf: str, i: int) -> int:
        return self.eat(buf, i, skip_ws(buf, i))


class ToolFormat(ABC):
    """A model family's tool-call markup."""

    name: ClassVar[str]
    start_tags: ClassVar[tuple[str, ...]]  # open a region wherever they appear in text
    stray_tags: ClassVar[tuple[str, ...]] = ()  # dropped when met outside a region
    bare_json: ClassVar[bool] = False  # a '{' at the start of a text segment opens a region

    @abstractmethod
    def open_region(self, ctx: CallContext, opener: str) -> ToolRegion:
        """A region that starts just after ``opener`` ("" for bare JSON)."""


class NameStatus(Enum):
    MORE = 1
    DONE = 2
    BAD = 3


class NameReader:
    """Reads a function or parameter name up to one of ``ends``.

    Fails at the first character a name cannot hold, so garbage is rejected where it
    starts rather than after a long wait for a delimiter that never comes.
    """

    def __init__(self, ends: tuple[str, ...], chars: re.Pattern[str] = NAME_CHARS) -> None:
        self.finder = TagSet(ends).finder()
        self.chars = chars
        self.parts: list[str] = []
        self.length = 0
        self.end = ""  # the delimiter found

    @property
    def name(self) -> str:
        return "".join(self.parts).strip()

    def step(self, buf: str, i: int, final: bool) -> tuple[int, NameStatus]:
        """Returns (new i, status); on DONE the delimiter is consumed too."""
        end, tag = self.finder.scan(buf, i, final)
        m = self.chars.match(buf, i, end)
        j = m.end() if m else i
        self.parts.append(buf[i:j])
        self.length += j - i
        if j < end or self.length > MAX_NAME:
            return j, NameStatus.BAD
        if tag is None:
            return j, NameStatus.BAD if final else NameStatus.MORE
        self.end = tag
        return j + len(tag), NameStatus.DONE
