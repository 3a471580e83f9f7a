"""The life of one tool call, and the policy that decides what the client sees of it.

Policy (the same for ``feed``/``finish`` and ``parse``, since ``parse`` is a stream):

* A call is *accepted* the moment its name is complete and known (any non-empty name
  when the request has no tools).  Only then does it get an index and an id and is its
  first fragment sent; nothing about it is streamed before.
* A call that is *rejected* -- unknown name, or malformed / cut off before its name was
  complete -- gets no index: its raw text, verbatim, is sent as content.  While a call
  is pending its raw text is held back for exactly this reason.
* An accepted call whose text later breaks (bad JSON, cut off by ``max_tokens``) keeps
  its index; its arguments are closed into valid JSON at the point of the break (the
  shortest completion of what was streamed) and its remaining text, up to its end
  marker, is dropped.  Arguments that never started are ``{}``.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import Enum

from parsers.deltas import DeltaBuilder
from parsers.tools import IdGenerator, ToolSet


class CallContext:
    """Per-stream services the format regions use: name checks, indices, ids, output."""

    def __init__(
        self,
        out: DeltaBuilder,
        tools: ToolSet,
        ids: IdGenerator,
        content_raw: Callable[[str], None],
    ) -> None:
        self.out = out
        self.tools = tools
        self.ids = ids
        self.content_raw = content_raw
        self.next_index = 0

    def new_call(self, opener: str = "") -> Call:
        """A pending call whose raw text starts with ``opener`` (its start tag, if any)."""
        return Call(self, opener)

    def open_call(self, name: str) -> int:
        index = self.next_index
        self.next_index += 1
        self.out.call_open(index, self.ids.next(), name)
        return index


class CallState(Enum):
    PENDING = 1  # name not known yet: raw text held back
    ACCEPTED = 2  # has an index; arguments stream
    REJECTED = 3  # raw text goes to content


class Call:
    """One tool call.  Formats report every character they consume for it to
    :meth:`raw`, the arguments JSON text to :meth:`args`, and the name once complete."""

    def __init__(self, ctx: CallContext, opener: str = "") -> None:
        self.ctx = ctx
        self.state = CallState.PENDING
        self.name = ""
        self.index = -1
        self.closed = False
        self._raw: list[str] = [opener] if opener else []
        self._early_args: list[str] = []  # arguments seen before the name (held back)
        self._sent_args = False

    def raw(self, text: str) -> None:
        if not text:
            return
        if self.state is CallState.PENDING:
            self._raw.append(text)
        elif self.state is CallState.REJECTED:
            self.ctx.content_raw(text)

    def set_name(self, name: str) -> bool:
        """Accept or reject the call by its name; returns whether it was accepted."""
        if self.state is not CallState.PENDING:
            return self.state is CallState.ACCEPTED
        if not self.ctx.tools.accepts(name):
            self.reject()
            return False
        self.state = CallState.ACCEPTED
        self.name = name
        self.index = self.ctx.open_call(name)
        self._raw.clear()
        early, self._early_args = self._early_args, []
        for text in early:
            self.args(text)
        return True

    def reject(self) -> None:
        if self.state is CallState.PENDING:
            self.state = CallState.REJECTED
            raw, self._raw = "".join(self._raw), []
            self.ctx.content_raw(raw)

    def args(self, text: str) -> None:
        if not text:
            return
        if self.state is CallState.PENDING:
            self._early_args.append(text)
        elif self.state is CallState.ACCEPTED and not self.closed:
            self._sent_args = True
            self.ctx.out.call_args(self.index, text)

    def close(self, completion: str = "") -> None:
        """The call is over (complete, broken or cut off).  Idempotent."""
        if self.closed:
            return
        if self.state is CallState.PENDING:
            self.reject()
        elif self.state is CallState.ACCEPTED:
            self.args(completion if self._sent_args else "{}")
        self.closed = True
