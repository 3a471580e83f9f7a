"""StreamParser: raw model text in, OpenAI ``delta`` dicts out, whatever the chunking.

One parser per generated stream.  Its state is explicit (:class:`StreamState`): the
mode (content, reasoning, or inside a tool-call region), the unconsumed buffer and the
open region.  Each ``feed`` appends the chunk and steps the state machine until it can
not move without more text; what it holds back is only what could still become markup
(a partial tag, an undecided JSON escape or comma, trailing whitespace before a
possible tag).  Consumed text is cut off the buffer once per ``feed``, so the cost of a
chunk does not grow with what came before it.

Every decision depends on the text alone, never on where a chunk ended, so any
chunking of the same text reconstructs the same reasoning, content and calls.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

from parsers.calls import CallContext
from parsers.deltas import Delta, DeltaBuilder
from parsers.formats import ToolRegion, get_tool_format
from parsers.markup import TagSet, skip_ws
from parsers.reasoning import get_reasoning_format
from parsers.text import TextChannel
from parsers.tools import IdGenerator, ToolSet


class Mode(Enum):
    CONTENT = 1
    REASONING = 2
    TOOL = 3  # inside a tool-call region


class Action(Enum):
    THINK_OPEN = 1
    THINK_CLOSE = 2
    TOOL = 3
    DROP = 4  # stray markup: removed, nothing else happens


@dataclass
class StreamState:
    mode: Mode
    buf: str = ""
    pos: int = 0  # buf[:pos] is consumed
    region: ToolRegion | None = None
    finished: bool = False


class StreamParser:
    """Incremental reasoning + tool-call parser for one generation.

    ``tool_format``: hermes, qwen3_coder, llama3_json, mistral, deepseek_v3, deepseek_v31
    or None.  ``reasoning_format``: qwen3, deepseek_r1 or None.  ``tools``: the request's
    OpenAI tool dicts (names are checked against them; schemas type qwen3_coder values).
    ``think_open``: the prompt already opened ``<think>`` (None: the reasoning format's
    default).  ``seed``: makes call ids reproducible.

    Unknown names and malformed calls follow the policy in :mod:`parsers.calls`.
    """

    def __init__(
        self,
        tool_format: str | None = None,
        reasoning_format: str | None = None,
        tools: Sequence[Mapping[str, Any]] | None = None,
        think_open: bool | None = None,
        seed: int | None = None,
    ) -> None:
        self._tool = get_tool_format(tool_format)
        reasoning = get_reasoning_format(reasoning_format)
        self._out = DeltaBuilder()
        in_reasoning = reasoning is not None and (
            reasoning.starts_open if think_open is None else think_open
        )
        self._content = TextChannel(self._out.content)
        self._reasoning = TextChannel(self._out.reasoning, strip_leading=True)
        ids = IdGenerator(seed)
        self._calls = CallContext(self._out, ToolSet(tools), ids, self._content.write_raw)
        content_tags: dict[str, Action] = {}
        reasoning_tags: dict[str, Action] = {}
        if reasoning is not None:
            content_tags |= {reasoning.open_tag: Action.THINK_OPEN}
            content_tags |= {reasoning.close_tag: Action.DROP}
            reasoning_tags |= {reasoning.close_tag: Action.THINK_CLOSE}
            reasoning_tags |= {reasoning.open_tag: Action.DROP}
        if self._tool is not None:
            for tags in (content_tags, reasoning_tags):
                tags |= dict.fromkeys(self._tool.stray_tags, Action.DROP)
                tags |= dict.fromkeys(self._tool.start_tags, Action.TOOL)
        self._actions = {Mode.CONTENT: content_tags, Mode.REASONING: reasoning_tags}
        self._finders = {
            mode: TagSet(tuple(tags)).finder() for mode, tags in self._actions.items() if tags
        }
        self.state = StreamState(Mode.REASONING if in_reasoning else Mode.CONTENT)

    def feed(self, text: str) -> list[Delta]:
        """Parse the next chunk of generated text; return the deltas it completes."""
        st = self.state
        if st.finished:
            raise RuntimeError("feed() after finish(): use a new StreamParser per generation")
        st.buf = st.buf[st.pos :] + text
        st.pos = 0
        while self._step(False):
            pass
        return self._out.take()

    def finish(self) -> list[Delta]:
        """End of generation (also when cut off by max_tokens): flush everything held."""
        st = self.state
        if st.finished:
            return []
        while self._step(True):
            pass
        assert st.pos == len(st.buf), "finish() must consume the whole buffer"
        self._content.flush()
        self._reasoning.flush()
        st.finished = True
        return self._out.take()

    def _channel(self, mode: Mode) -> TextChannel:
        return self._reasoning if mode is Mode.REASONING else self._content

    def _boundary(self, call: bool = False) -> None:
        self._content.boundary(call)
        self._reasoning.boundary(call)

    def _step(self, final: bool) -> bool:
        """One move of the state machine; False when it needs more text."""
        if self.state.mode is Mode.TOOL:
            return self._step_region(final)
        return self._step_text(final)

    def _step_text(self, final: bool) -> bool:
        st = self.state
        buf, start = st.buf, st.pos
        channel = self._channel(st.mode)
        i = start
        if st.mode is Mode.CONTENT and self._tool is not None and self._tool.bare_json:
            if channel.at_segment_start:
                i = skip_ws(buf, i)
                channel.write(buf[start:i])
                st.pos = i
                if i < len(buf) and buf[i] == "{":
                    self._open_region("")
                    return True
        finder = self._finders.get(st.mode)
        if finder is None:
            end, tag = len(buf), None
        else:
            end, tag = finder.scan(buf, i, final)
        channel.write(buf[i:end])
        st.pos = end
        if tag is None:
            return end != start
        st.pos = end + len(tag)
        self._apply(self._actions[st.mode][tag], tag)
        return True

    def _apply(self, action: Action, tag: str) -> None:
        if action is Action.DROP:
            return
        self._boundary(call=action is Action.TOOL)
        if action is Action.THINK_OPEN:
            self.state.mode = Mode.REASONING
        elif action is Action.THINK_CLOSE:
            self.state.mode = Mode.CONTENT
        else:
            self._open_region(tag)

    def _open_region(self, opener: str) -> None:
        assert self._tool is not None
        self._boundary(call=True)
        self.state.region = self._tool.open_region(self._calls, opener)
        self.state.mode = Mode.TOOL

    def _step_region(self, final: bool) -> bool:
        st = self.state
        region = st.region
        assert region is not None
        j = region.step(st.buf, st.pos, final)
        moved = j != st.pos
        st.pos = j
        if final and not moved and not region.done:
            region.finish()
        if not region.done:
            return moved
        st.region = None
        st.mode = Mode.CONTENT  # a tool call inside reasoning ends the reasoning
        self._boundary(call=True)
        return True
