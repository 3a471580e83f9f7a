"""Reading JSON tool calls incrementally: ``{"name": ..., "arguments": {...}}``.

Shared by the JSON formats (hermes, llama3_json, mistral, deepseek).  The arguments
value is streamed to the client as it is scanned -- the model's own JSON text,
verbatim -- so long string values arrive in many fragments before the call closes.
Tags inside JSON strings are data: the scanner, not a tag search, decides where the
object ends.
"""

from __future__ import annotations

import json
from enum import Enum

from parsers.calls import Call
from parsers.json_stream import JsonScanner
from parsers.markup import skip_ws

ARG_KEYS = frozenset({"arguments", "parameters"})
BARE_FIRST_KEYS = frozenset({"name", "type", *ARG_KEYS})


class ArgsValue:
    """The arguments value of one call.

    An object or array streams as scanned.  Anything else is collected and converted at
    its end: ``null`` means no arguments (``{}``), a string holding JSON (some models
    double-encode) is unwrapped, any other value is passed on as its JSON text.
    """

    def __init__(self, call: Call) -> None:
        self.call = call
        self.scanner = JsonScanner()
        self._held = ""  # consumed but not yet safe (see JsonScanner.hold)
        self._stream: bool | None = None
        self._collected: list[str] = []

    @property
    def done(self) -> bool:
        return self.scanner.done

    @property
    def error(self) -> bool:
        return self.scanner.error

    def step(self, buf: str, i: int, final: bool) -> int:
        """Scan from ``buf[i]`` (the value's first character when called first)."""
        if self._stream is None:
            self._stream = buf[i] in "{["
        j = self.scanner.step(buf, i, final)
        text = self._held + buf[i:j]
        cut = len(text) - self.scanner.hold
        safe, self._held = text[:cut], text[cut:]
        if self._stream:
            self.call.args(safe)
        else:
            self._collected.append(safe)
            if self.scanner.done:
                self._convert("".join(self._collected))
        return j

    def _convert(self, raw: str) -> None:
        value = json.loads(raw)
        if value is None:
            return
        if isinstance(value, str):
            try:
                json.loads(value)
            except (ValueError, RecursionError):
                pass
            else:
                raw = value
        self.call.args(raw)

    def completion(self) -> str:
        return self.scanner.completion() if self._stream else ""


class _R(Enum):
    OPEN = 1
    KEY_START = 2
    KEY = 3
    COLON = 4
    VALUE_START = 5
    VALUE = 6
    NEXT = 7
    DONE = 8


class JsonCallReader:
    """Reads one call object and drives its :class:`Call`.

    ``bare``: the object appeared in plain text with no markup announcing a call, so it
    must look like one: its first key is one of ``BARE_FIRST_KEYS`` and it is accepted
    only once it has both a name and an arguments key.  ``{"answer": 42}`` and
    ``{"name": "Bob", "age": 3}`` stay content.
    """

    def __init__(self, call: Call, bare: bool = False) -> None:
        self.call = call
        self.bare = bare
        self._name: str | None = None  # bare: the name, until the arguments key shows up
        self._args_seen = False
        self.state = _R.OPEN
        self.error = False
        self._first = True
        self._key = ""
        self._sub: JsonScanner | None = None  # scanner of the current key or plain value
        self._parts: list[str] = []
        self._args: ArgsValue | None = None
        self._role = ""  # "name", "args" or "skip" for the current value
        self._have = {"name": False, "args": False}
        self._mark = 0

    @property
    def done(self) -> bool:
        return self.state is _R.DONE

    def step(self, buf: str, i: int, final: bool) -> int:
        self._mark = i
        n = len(buf)
        while i < n and not self.error and self.state is not _R.DONE:
            if self.state in (_R.KEY, _R.VALUE):
                i = self._sub_step(buf, i, final)
                continue
            i = skip_ws(buf, i)
            if i < n:
                i = self._punct(buf, i)
        self._flush(buf, i)
        return i

    def _flush(self, buf: str, i: int) -> None:
        """Hand the raw text consumed since the last flush to the call, in order."""
        self.call.raw(buf[self._mark : i])
        self._mark = i

    def _punct(self, buf: str, i: int) -> int:
        c, s = buf[i], self.state
        if s is _R.OPEN and c == "{":
            self.state = _R.KEY_START
        elif s is _R.KEY_START and c == '"':
            self._sub, self._parts, self.state = JsonScanner(), [], _R.KEY
            return i
        elif s is _R.KEY_START and c == "}" and self._first:
            self.state = _R.DONE
        elif s is _R.COLON and c == ":":
            self.state = _R.VALUE_START
        elif s is _R.VALUE_START:
            self._start_value(buf, i)
            return i
        elif s is _R.NEXT and c == ",":
            self.state = _R.KEY_START
        elif s is _R.NEXT and c == "}":
            self.state = _R.DONE
        else:
            self.error = True
            return i
        return i + 1

    def _start_value(self, buf: str, i: int) -> None:
        if self._first and self.bare and self._key not in BARE_FIRST_KEYS:
            self._flush(buf, i)
            self.call.reject()
        self._first = False
        key = self._key
        if key == "name" and not self._have["name"]:
            self._role = "name"
            if buf[i] != '"':
                self.error = True
                return
        elif key in ARG_KEYS and not self._have["args"]:
            self._role = "args"
            self._args = ArgsValue(self.call)
            self._args_seen = True
            if self._name is not None:
                self._flush(buf, i)
                self.call.set_name(self._name)
        else:
            self._role = "skip"
        self._sub, self._parts, self.state = JsonScanner(), [], _R.VALUE

    def _sub_step(self, buf: str, i: int, final: bool) -> int:
        if self.state is _R.VALUE and self._role == "args":
            assert self._args is not None
            j = self._args.step(buf, i, final)
            sub_done, self.error = self._args.done, self._args.error
        else:
            assert self._sub is not None
            j = self._sub.step(buf, i, final)
            if self._role != "skip" or self.state is _R.KEY:
                self._parts.append(buf[i:j])
            sub_done, self.error = self._sub.done, self._sub.error
        if sub_done:
            self._end_sub(buf, j)
        return j

    def _end_sub(self, buf: str, j: int) -> None:
        text = "".join(self._parts)
        if self.state is _R.KEY:
            self._key = json.loads(text)
            self.state = _R.COLON
            return
        self.state = _R.NEXT
        if self._role == "name":
            self._have["name"] = True
            name = json.loads(text).strip()
            if self.bare and not self._args_seen:
                self._name = name
                return
            self._flush(buf, j)
            self.call.set_name(name)
        elif self._role == "args":
            self._have["args"] = True

    def completion(self) -> str:
        """Closing text for the arguments if they were cut off while streaming."""
        if self.state is _R.VALUE and self._role == "args" and self._args is not None:
            return self._args.completion()
        return ""
