"""What the app factory does before the first request: the chat template is compiled."""

from __future__ import annotations

from types import SimpleNamespace

from mmserve.models.chat_template import compile_template
from mmserve.models.tokenizer import Tokenizer
from mmserve.server.app import _compile_chat_template


def test_the_chat_template_is_compiled_at_start_up(default_model_dir):
    tok = Tokenizer(default_model_dir)
    compile_template.cache_clear()
    _compile_chat_template(tok)
    assert compile_template.cache_info().currsize == 1  # the first request finds it compiled
    hits = compile_template.cache_info().hits
    tok.apply_chat_template([{"role": "user", "content": "Hello"}])
    assert compile_template.cache_info().hits == hits + 1


def test_a_model_without_a_template_or_a_failing_one_is_left_alone():
    _compile_chat_template(SimpleNamespace(chat_template=None))

    def fail(messages):
        raise ValueError("this template needs tools")

    _compile_chat_template(SimpleNamespace(chat_template="x", apply_chat_template=fail))
