"""Chat template rendering, the way HF transformers renders it.

A chat template is untrusted Jinja code shipped with the model, so it runs in an immutable
sandbox. The environment matches ``transformers``' ``apply_chat_template``: ``trim_blocks`` and
``lstrip_blocks``, the ``loopcontrols`` extension, a ``{% generation %}`` block that renders its
body, ``raise_exception(msg)``, ``strftime_now(fmt)`` and a ``tojson`` filter that, unlike
Jinja's, does not HTML-escape and keeps non-ASCII characters.

Message ``content`` given as a list of parts (``{"type": "text", "text": ...}``) is passed
through to templates that iterate over parts, and joined into one string (parts separated by a
newline, as vLLM does) for templates that only concatenate strings.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Mapping, Sequence
from datetime import datetime
from functools import lru_cache
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

from mmserve.errors import InvalidRequestError

# A template that loops over content, tests its type, or compares a part's type with
# 'text'/'image' handles part lists itself.
_HANDLES_PARTS = re.compile(
    r"for\s+\w+\s+in\s+[\w.\[\]'\"]*content"
    r"|content['\"]?\]?\s+is\s+(not\s+)?(string|iterable|sequence|mapping)"
    r"|(\[\s*['\"]type['\"]\s*\]|\.type)\s*==\s*['\"](text|image)"
)


class _GenerationBlock(jinja2.ext.Extension):
    """``{% generation %}...{% endgeneration %}`` (HF's assistant-mask marker): render the body."""

    tags = {"generation"}

    def parse(self, parser: Any) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

    def _render(self, caller: Any) -> str:
        return str(caller())


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(
    x: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    return json.dumps(
        x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


@lru_cache(maxsize=16)
def compile_template(source: str) -> jinja2.Template:
    """Compile once per distinct template text; syntax errors surface as TemplateSyntaxError."""
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[_GenerationBlock, jinja2.ext.loopcontrols],
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env.from_string(source)


def template_handles_parts(source: str) -> bool:
    """Whether the template itself iterates over list-valued ``content``."""
    return _HANDLES_PARTS.search(source) is not None


def _join_text_parts(parts: Sequence[Any]) -> str:
    texts = []
    for part in parts:
        kind = part.get("type") if isinstance(part, Mapping) else None
        if kind != "text" or not isinstance(part.get("text"), str):
            raise InvalidRequestError(
                f"Message content part of type {kind!r} is not supported by this model's chat "
                "template; only {'type': 'text', 'text': ...} parts are."
            )
        texts.append(part["text"])
    return "\n".join(texts)


def normalize_messages(messages: Sequence[Mapping[str, Any]], source: str) -> list[dict[str, Any]]:
    """Deep copies of ``messages``; part lists joined to text unless the template reads parts."""
    keep_parts = template_handles_parts(source)
    out = []
    for message in messages:
        if not isinstance(message, Mapping):
            raise InvalidRequestError(f"Each chat message must be an object, got {message!r}.")
        msg = copy.deepcopy(dict(message))
        content = msg.get("content")
        if isinstance(content, list) and not keep_parts:
            msg["content"] = _join_text_parts(content)
        out.append(msg)
    return out


def render_chat_template(
    source: str,
    messages: Sequence[Mapping[str, Any]],
    *,
    tools: list[dict[str, Any]] | None = None,
    add_generation_prompt: bool = True,
    special_tokens: Mapping[str, str] | None = None,
    **kwargs: Any,
) -> str:
    """Render ``messages`` (OpenAI-style dicts) with the chat template ``source``.

    ``special_tokens`` (``bos_token``, ``eos_token``, ...) are template variables, as in HF;
    extra ``kwargs`` (e.g. ``enable_thinking``) are passed through. A template's
    ``raise_exception`` becomes an ``InvalidRequestError`` carrying its message.
    """
    variables = {**(special_tokens or {}), **kwargs}
    try:
        return compile_template(source).render(
            messages=normalize_messages(messages, source),
            tools=tools,
            documents=None,
            add_generation_prompt=add_generation_prompt,
            **variables,
        )
    except jinja2.exceptions.TemplateSyntaxError:
        raise
    except (jinja2.exceptions.TemplateError, TypeError) as err:
        # raise_exception(), undefined fields, or wrong value types in the messages
        raise InvalidRequestError(f"Chat template rejected the conversation: {err}") from err
