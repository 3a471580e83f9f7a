"""Checks on what a client sends, made before any costly work (tokenizing, the engine).

Every check raises ``ParamError`` (HTTP 400 / a Realtime ``error`` event) whose message
names the parameter and the server limit (``ServerConfig`` field) it broke, so the
client knows what to change:

- ``check_json``: one pass over a parsed request body or WebSocket event, without
  recursion: nesting deeper than ``max_json_depth``, strings holding lone UTF-16
  surrogates (``"\\ud800"`` is valid JSON but no text: tokenizers reject it), and
  integers outside a signed 64-bit range (they reach C code as ``long long``).
- ``check_prompt_bytes``: the UTF-8 size of prompt text against ``max_prompt_bytes``,
  before the tokenizer sees it (tokenizing megabytes holds a core for seconds).
- ``check_stop``: count and length of stop strings.
- ``check_fan_out``: a request needing more engine requests than the waiting queue can
  ever hold is a 400 (retrying cannot help), not a 429.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from fastapi import Request

from mmserve.config import ServerConfig
from mmserve.server.errors import ParamError

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
_SURROGATE = re.compile("[\ud800-\udfff]")


def _path(parts: tuple[Any, ...]) -> str | None:
    return ".".join(str(p) for p in parts) or None


def check_json(value: Any, max_depth: int) -> None:
    """Raise ``ParamError`` naming the first bad place in a parsed JSON value."""
    stack: list[tuple[Any, tuple[Any, ...]]] = [(value, ())]
    while stack:
        v, where = stack.pop()
        if isinstance(v, str):
            if _SURROGATE.search(v):
                raise ParamError(
                    f"{_path(where) or 'the body'} holds a lone UTF-16 surrogate "
                    "(such as \\ud800), which is not text; send valid Unicode",
                    param=_path(where),
                    code="invalid_unicode",
                )
        elif isinstance(v, bool) or v is None or isinstance(v, float):
            continue
        elif isinstance(v, int):
            if not INT64_MIN <= v <= INT64_MAX:
                raise ParamError(
                    f"{_path(where) or 'a number'} = {v} is out of range: integers must fit "
                    "in 64 bits (signed)",
                    param=_path(where),
                    code="integer_out_of_range",
                )
        else:
            if len(where) >= max_depth:
                raise ParamError(
                    f"the JSON is nested deeper than the server's limit of {max_depth} levels "
                    f"(max_json_depth) at {_path(where)}",
                    param=_path(where),
                    code="json_too_deep",
                )
            if isinstance(v, dict):
                for k, item in v.items():
                    if isinstance(k, str) and _SURROGATE.search(k):
                        raise ParamError(
                            f"a key in {_path(where) or 'the body'} holds a lone UTF-16 "
                            "surrogate; send valid Unicode",
                            param=_path(where),
                            code="invalid_unicode",
                        )
                    stack.append((item, (*where, k)))
            elif isinstance(v, list):
                stack.extend((item, (*where, i)) for i, item in enumerate(v))


async def guard_json_body(request: Request) -> None:
    """FastAPI dependency: ``check_json`` on the parsed body before the route's model sees it
    (runs before body validation, so a nesting or Unicode problem is named first)."""
    config: ServerConfig = request.app.state.mm.config
    try:
        body = await request.json()
    except Exception:  # noqa: BLE001 - malformed JSON: the body's own validation answers
        return
    check_json(body, config.max_json_depth)


def utf8_len(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))


def check_prompt_bytes(texts: Iterable[str], limit: int, param: str) -> None:
    """The prompt's text, all parts together, must be at most ``limit`` UTF-8 bytes."""
    total = 0
    for t in texts:
        total += utf8_len(t)
        if total > limit:
            raise ParamError(
                f"the prompt is larger than the server's limit of {limit} bytes of text "
                f"(max_prompt_bytes); shorten {param}",
                param=param,
                code="prompt_too_large",
            )


def check_stop(stop: str | list[str] | None, config: ServerConfig) -> None:
    stops = [stop] if isinstance(stop, str) else (stop or [])
    if len(stops) > config.max_stop_strings:
        raise ParamError(
            f"stop has {len(stops)} strings; the server allows at most "
            f"{config.max_stop_strings} (max_stop_strings)",
            param="stop",
        )
    for i, s in enumerate(stops):
        if len(s) > config.max_stop_str_chars:
            raise ParamError(
                f"stop string {i} has {len(s)} characters; the server allows at most "
                f"{config.max_stop_str_chars} (max_stop_str_chars)",
                param="stop",
            )


def check_fan_out(num_requests: int, max_waiting: int | None) -> None:
    """``prompts x n`` engine requests must fit the waiting queue at all."""
    if max_waiting is not None and num_requests > max_waiting:
        raise ParamError(
            f"this request needs {num_requests} engine requests (prompts x n), more than the "
            f"waiting queue holds ({max_waiting}, max_waiting), so it can never be admitted; "
            "send fewer prompts or a smaller n",
            param="n",
            code="request_too_large",
        )
