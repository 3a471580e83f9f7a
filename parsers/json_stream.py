"""Incremental JSON scanner: one JSON value, fed in pieces, each character looked at once.

The scanner validates as it goes and keeps the invariant that makes streaming arguments
safe: the text it calls *safe* (everything consumed except ``hold`` trailing characters)
is always a prefix of some valid JSON document, and :meth:`JsonScanner.completion` gives
the shortest suffix that closes it.  So a tool call whose JSON breaks, or is cut off by
``max_tokens``, can still be closed into valid JSON after its prefix was streamed.

Held back (``hold``): an escape sequence still being read (a lone ``\\`` cannot be
closed), and a ``,`` plus the whitespace after it (``{"a": 1,`` has no valid closing
without inventing a key).  Raw control characters inside strings are errors, as in the
JSON spec.
"""

from __future__ import annotations

import re
from enum import IntEnum

_WS = " \t\r\n"
_PLAIN = re.compile(r'[^"\\\x00-\x1f]+')
_HEX = frozenset("0123456789abcdefABCDEF")
_ESCAPES = frozenset('"\\/bfnrtu')
_DIGITS = frozenset("0123456789")
_WORDS = {"t": "true", "f": "false", "n": "null"}
_CLOSER = {"{": "}", "[": "]"}


class St(IntEnum):
    VALUE = 0  # a value must start here (top level, after ':' or after ',' in an array)
    FIRST_KEY = 1  # just after '{': a key or '}'
    KEY = 2  # after ',' in an object: a key must start
    FIRST_ITEM = 3  # just after '[': a value or ']'
    STRING = 4
    COLON = 5
    AFTER = 6  # after a value inside a container: ',' or the closer
    LITERAL = 7
    NUMBER = 8
    DONE = 9


class Num(IntEnum):
    SIGN = 0
    ZERO = 1
    INT = 2
    DOT = 3
    FRAC = 4
    EXP = 5
    EXP_SIGN = 6
    EXP_INT = 7


_NUM_COMPLETE = frozenset({Num.ZERO, Num.INT, Num.FRAC, Num.EXP_INT})


def _num_next(state: Num, c: str) -> Num | None:
    """Number grammar as a transition table; None when ``c`` cannot continue it."""
    digit = c in _DIGITS
    if state is Num.SIGN:
        return Num.ZERO if c == "0" else Num.INT if digit else None
    if state in (Num.ZERO, Num.INT, Num.FRAC):
        if digit and state is not Num.ZERO:
            return state
        if c == "." and state is not Num.FRAC:
            return Num.DOT
        return Num.EXP if c in "eE" else None
    if state is Num.DOT:
        return Num.FRAC if digit else None
    if state is Num.EXP:
        return Num.EXP_SIGN if c in "+-" else Num.EXP_INT if digit else None
    return Num.EXP_INT if digit else None  # EXP_SIGN, EXP_INT


class JsonScanner:
    """Scans exactly one JSON value.  ``step`` consumes what it can and stops at the
    value's end (``done``), at an invalid character (``error``, not consumed) or at the
    end of the buffer."""

    def __init__(self) -> None:
        self.state = St.VALUE
        self.stack: list[str] = []
        self.in_key = False
        self.esc = 0  # 0: none, 1: just after a backslash, 2..5: hex digits still wanted + 1
        self.word = ""
        self.word_i = 0
        self.num = Num.INT
        self.hold = 0
        self.error = False
        self.started = False

    @property
    def done(self) -> bool:
        return self.state is St.DONE

    def step(self, buf: str, i: int, final: bool) -> int:
        """Consume from ``buf[i:]``; return the index of the first unconsumed character."""
        n = len(buf)
        while i < n and not self.error and self.state is not St.DONE:
            s = self.state
            if s is St.STRING:
                i = self._string(buf, i)
            elif s is St.LITERAL:
                if buf[i] != self.word[self.word_i]:
                    self.error = True
                    break
                i += 1
                self.word_i += 1
                if self.word_i == len(self.word):
                    self._end_value()
            elif s is St.NUMBER:
                nxt = _num_next(self.num, buf[i])
                if nxt is not None:
                    self.num = nxt
                    i += 1
                elif self.num in _NUM_COMPLETE:
                    self._end_value()  # the character is looked at again in the new state
                else:
                    self.error = True
            elif buf[i] in _WS:
                i += 1
                if self.hold:
                    self.hold += 1
            elif self._structural(buf[i]):
                i += 1
            else:
                self.error = True
        if final and self.state is St.NUMBER and not self.stack and self.num in _NUM_COMPLETE:
            self.state = St.DONE  # a bare top-level number ends with the text
        return i

    def _string(self, buf: str, i: int) -> int:
        if self.esc == 0:
            m = _PLAIN.match(buf, i)
            if m:
                return m.end()
            c = buf[i]
            if c == '"':
                if self.in_key:
                    self.in_key = False
                    self.state = St.COLON
                else:
                    self._end_value()
            elif c == "\\":
                self.esc = 1
                self.hold = 1
            else:
                self.error = True  # raw control character
                return i
            return i + 1
        c = buf[i]
        if self.esc == 1:
            if c not in _ESCAPES:
                self.error = True
                return i
            self.esc = 5 if c == "u" else 0
        elif c in _HEX:
            self.esc = self.esc - 1 if self.esc > 2 else 0
        else:
            self.error = True
            return i
        self.hold = self.hold + 1 if self.esc else 0
        return i + 1

    def _structural(self, c: str) -> bool:
        s = self.state
        if s is St.VALUE or s is St.FIRST_ITEM:
            if s is St.FIRST_ITEM and c == "]":
                self._close()
                return True
            return self._start_value(c)
        if s is St.FIRST_KEY or s is St.KEY:
            if s is St.FIRST_KEY and c == "}":
                self._close()
                return True
            if c != '"':
                return False
            self.hold = 0
            self.state = St.STRING
            self.in_key = True
            return True
        if s is St.COLON:
            if c == ":":
                self.state = St.VALUE
                return True
            return False
        top = self.stack[-1]  # St.AFTER
        if c == ",":
            self.hold = 1
            self.state = St.KEY if top == "{" else St.VALUE
            return True
        if c == _CLOSER[top]:
            self._close()
            return True
        return False

    def _start_value(self, c: str) -> bool:
        if c in "{[":
            self.stack.append(c)
            self.state = St.FIRST_KEY if c == "{" else St.FIRST_ITEM
        elif c == '"':
            self.state = St.STRING
        elif c in _WORDS:
            self.word, self.word_i, self.state = _WORDS[c], 1, St.LITERAL
        elif c == "-" or c in _DIGITS:
            self.num = Num.SIGN if c == "-" else Num.ZERO if c == "0" else Num.INT
            self.state = St.NUMBER
        else:
            return False
        self.hold = 0
        self.started = True
        return True

    def _close(self) -> None:
        self.stack.pop()
        self._end_value()

    def _end_value(self) -> None:
        self.state = St.AFTER if self.stack else St.DONE

    def completion(self) -> str:
        """Shortest text that turns the safe prefix into a complete JSON value."""
        s = self.state
        if s is St.DONE or not self.started:
            return ""
        if self.hold and s in (St.KEY, St.VALUE):
            s = St.AFTER  # the held ',' is not part of the safe prefix
        parts: list[str] = []
        if s is St.STRING:
            parts.append('": null' if self.in_key else '"')
        elif s is St.COLON:
            parts.append(": null")
        elif s is St.VALUE:
            parts.append("null")
        elif s is St.LITERAL:
            parts.append(self.word[self.word_i :])
        elif s is St.NUMBER and self.num not in _NUM_COMPLETE:
            parts.append("0")
        parts.extend(_CLOSER[c] for c in reversed(self.stack))
        return "".join(parts)
