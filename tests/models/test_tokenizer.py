"""Our GGUF-built tokenizers and chat-template rendering against transformers' own.

References: ``AutoTokenizer.from_pretrained(dir, gguf_file=...)`` on the GGUF we converted
(transformers builds its tokenizer from the same metadata with its own converters), and its
``apply_chat_template`` for rendering.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from mmserve.errors import InvalidRequestError
from mmserve.models.tokenizer import Tokenizer

transformers = pytest.importorskip("transformers")

TEXTS = [
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog.",
    "",
    " ",
    "\n",
    "  leading spaces",
    "trailing spaces   ",
    "tabs\tand\nnewlines\n\n\nmany",
    "a    b     c",
    "Numbers: 1234567890, 3.14159, -42, 1e10, 2024-05-01 12:34:56, 0x1F",
    "Unicode: café naïve Straße Ελληνικά русский 中文字符 日本語のテキスト 한국어 עברית",
    "Emoji: 😀🎉👍🏽 👨‍👩‍👧‍👦 🇺🇸 ❤️",
    "zero\u200bwidth\u200d nbsp\u00a0here \ufeffbom",
    "def f(x):\n    return {'a': [1, 2, 3], \"b\": x ** 2}  # comment\n",
    "for (int i = 0; i < n; ++i) {\r\n\tsum += a[i];\r\n}",
    "   \n\t  \n",
    "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n",
    "<start_of_turn>user\nHi<end_of_turn>\n<bos>text<eos><pad>",
    "<unused0> [multimodal] <mask>",
    "I'm you're they'll we've she'd it's DON'T",
    "https://example.com/p?q=1&r=two#frag",
    "control\x01\x02\x7f chars",
    "αβγ∑∫√∞≠≤≥ ｆｕｌｌｗｉｄｔｈ",
    "....!!!???,,,;;;:::",
    "\n\n\n\n\n\n\n\n\n\n\n",
    "x" * 200 + " " + "ab" * 100,
]


def _hf_tokenizer(gguf_path: Path):
    directory, name = str(gguf_path.parent), gguf_path.name
    return transformers.AutoTokenizer.from_pretrained(directory, gguf_file=name)


@pytest.fixture(scope="module")
def smol(default_model_dir: Path, default_gguf: Path):
    return Tokenizer(default_model_dir), _hf_tokenizer(default_gguf)


@pytest.fixture(scope="module")
def gemma(gemma_model_dir: Path, gemma_gguf: Path):
    return Tokenizer(gemma_model_dir), _hf_tokenizer(gemma_gguf)


def _check_battery(ours: Tokenizer, ref) -> None:
    for text in TEXTS:
        for special in (False, True):
            assert ours.encode(text, special) == ref.encode(text, add_special_tokens=special), text
        ids = ours.encode(text)
        for skip in (False, True):
            assert ours.decode(ids, skip) == ref.decode(ids, skip_special_tokens=skip), text
        if "\u2581" not in text:  # sentencepiece vocabularies spell spaces as U+2581
            assert ours.decode(ids, skip_special_tokens=False) == text
    assert ours.vocab_size == len(ref)
    assert ours.convert_ids_to_tokens(range(50)) == ref.convert_ids_to_tokens(list(range(50)))


def test_smollm2_tokenizer_matches_transformers(smol):
    ours, ref = smol
    _check_battery(ours, ref)
    assert ours.encode("<|im_start|>assistant") == [1, 520, 9531]
    assert (ours.bos_token_id, ours.eos_token_id, ours.pad_token_id) == (1, 2, 2)
    assert ours.eos_token_ids == {0, 2}  # <|im_end|> and <|endoftext|>
    assert set(ref.all_special_ids) <= ours.all_special_ids
    assert ours.id_to_token(2) == "<|im_end|>" and ours.token_to_id("<|im_start|>") == 1


def test_gemma3_tokenizer_matches_transformers(gemma):
    ours, ref = gemma
    _check_battery(ours, ref)
    assert ours.encode("hi", add_special_tokens=True)[0] == ours.bos_token_id == 2
    assert ours.eos_token_ids == {1, 106}  # <eos> and <end_of_turn>
    assert ours.chat_template is None  # a base model: the GGUF carries no template
    with pytest.raises(InvalidRequestError, match="no chat template"):
        ours.apply_chat_template([{"role": "user", "content": "hi"}])


CONVERSATIONS = [
    [{"role": "user", "content": "Hello!"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}],
    [
        {"role": "user", "content": "Tell me a joke"},
        {"role": "assistant", "content": "Why did the chicken cross the road?"},
        {"role": "user", "content": "Why? 🐔 «ünïcödé»"},
    ],
]


@pytest.mark.parametrize("messages", CONVERSATIONS)
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_chat_template_matches_transformers(smol, messages, add_generation_prompt):
    ours, ref = smol
    want = ref.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=add_generation_prompt
    )
    assert ours.apply_chat_template(messages, add_generation_prompt=add_generation_prompt) == want


def test_text_parts_are_joined_for_string_templates(smol):
    ours, ref = smol
    parts = [
        {
            "role": "user",
            "content": [{"type": "text", "text": "Hi"}, {"type": "text", "text": "there"}],
        }
    ]
    flat = [{"role": "user", "content": "Hi\nthere"}]
    assert ours.apply_chat_template(parts) == ref.apply_chat_template(
        flat, tokenize=False, add_generation_prompt=True
    )
    with pytest.raises(InvalidRequestError, match="image_url"):
        ours.apply_chat_template([{"role": "user", "content": [{"type": "image_url"}]}])


# A tool-calling template exercising what HF's environment provides: namespace, loop controls,
# tojson (with kwargs, no HTML escaping), raise_exception, strftime_now, {% generation %}.
TOOLS_TEMPLATE = """
{%- set ns = namespace(system='You are helpful.') -%}
{%- if messages[0].role == 'system' %}{% set ns.system = messages[0].content %}{% endif -%}
<|im_start|>system
{{ ns.system }} Today is {{ strftime_now('%Y-%m-%d') }}.
{%- if tools %}

<tools>
{%- for tool in tools %}
{{ tool | tojson }}
{%- endfor %}
</tools>
{%- endif %}
{%- if enable_thinking is defined and not enable_thinking %} /no_think{% endif %}<|im_end|>
{% for message in messages %}
{%- if message.role == 'system' %}{% continue %}{% endif %}
{%- if message.role not in ['user', 'assistant', 'tool'] %}
{{- raise_exception('Unsupported role: ' + message.role) }}
{%- endif %}
<|im_start|>{{ message.role }}
{% if message.content is string %}{{ message.content }}
{%- else %}{% for part in message.content %}{{ part.text }}{% endfor %}{% endif %}
{%- if message.tool_calls %}{% generation %}
{%- for call in message.tool_calls %}
<tool_call>
{{ call.function | tojson(indent=2) }}
</tool_call>
{%- endfor %}{% endgeneration %}
{%- endif %}<|im_end|>
{% endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather <b>now</b> & later, in °C",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]

TOOL_CHAT = [
    {"role": "system", "content": "Use tools. Ünïcode ok."},
    {"role": "user", "content": "Weather in Zürich?"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {
                "type": "function",
                "function": {"name": "get_weather", "arguments": {"city": "Zürich"}},
            }
        ],
    },
    {"role": "tool", "content": "21°C"},
    {
        "role": "user",
        "content": [{"type": "text", "text": "And "}, {"type": "text", "text": "Bern?"}],
    },
]


@pytest.mark.parametrize("kwargs", [{}, {"enable_thinking": False}])
def test_tool_template_matches_transformers(smol, kwargs):
    ours, ref = smol
    want = ref.apply_chat_template(
        TOOL_CHAT,
        tools=TOOLS,
        chat_template=TOOLS_TEMPLATE,
        tokenize=False,
        add_generation_prompt=True,
        **kwargs,
    )
    got = ours.apply_chat_template(TOOL_CHAT, tools=TOOLS, chat_template=TOOLS_TEMPLATE, **kwargs)
    assert got == want
    assert "<b>now</b> & later, in °C" in got and "And Bern?" in got
    with pytest.raises(InvalidRequestError, match="Unsupported role: robot"):
        ours.apply_chat_template([{"role": "robot", "content": "hi"}], chat_template=TOOLS_TEMPLATE)


def _synthetic_meta(kind: str, pre: str | None = None) -> dict[str, Any]:
    """A tiny GGUF tokenizer (llama-sentencepiece or gpt2-byte-level) for the paths the two
    real models do not take."""
    if kind == "llama":
        pieces = [
            "▁",
            "e",
            "h",
            "l",
            "o",
            "w",
            "r",
            "d",
            "!",
            "▁h",
            "he",
            "ll",
            "llo",
            "▁he",
            "▁hello",
            "▁w",
            "or",
            "▁wor",
            "ld",
            "▁world",
            "▁▁",
            "lo",
            "t",
            "▁t",
            "es",
        ]
        tokens = ["<unk>", "<s>", "</s>", *(f"<0x{b:02X}>" for b in range(256)), *pieces]
        types = [2, 3, 3] + [6] * 256 + [1] * len(pieces)
        scores = [0.0] * 259 + [float(-i) for i in range(len(pieces))]
        extra: dict[str, Any] = {"tokenizer.ggml.scores": scores}
    else:
        from transformers.convert_slow_tokenizer import bytes_to_unicode

        merges = ["Ġ h", "e l", "el l", "ell o", "Ġh ello", "1 2", "12 3", "Ġ w", "o r", "Ġw or"]
        alphabet = sorted(set(bytes_to_unicode().values()))
        tokens = ["<|end|>", *alphabet, *(m.replace(" ", "") for m in merges)]
        types = [3] + [1] * (len(tokens) - 1)
        extra = {"tokenizer.ggml.merges": merges, "tokenizer.ggml.pre": pre}
    return {
        "general.architecture": "llama",
        "tokenizer.ggml.model": kind,
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.bos_token_id": 1 if kind == "llama" else None,
        "tokenizer.ggml.eos_token_id": 2 if kind == "llama" else 0,
        "tokenizer.ggml.unknown_token_id": 0 if kind == "llama" else None,
        **extra,
    }


@pytest.mark.parametrize(
    "kind,pre", [("llama", None), ("gpt2", "llama-bpe"), ("gpt2", "qwen2"), ("gpt2", "gpt2")]
)
def test_other_gguf_tokenizer_kinds_match_transformers(kind, pre):
    from transformers.integrations.gguf import convert_gguf_tokenizer

    from mmserve.models.tokenizer import build_gguf_backend

    meta = _synthetic_meta(kind, pre)
    ours = build_gguf_backend(meta)
    names = {
        "tokens": "tokens",
        "scores": "scores",
        "token_type": "token_type",
        "merges": "merges",
        "pre": "pre_tokenizer_type",
        "bos_token_id": "bos_token_id",
        "eos_token_id": "eos_token_id",
        "unknown_token_id": "unk_token_id",
    }
    tok_dict = {"tokenizer_type": kind} | {
        names[k]: meta[f"tokenizer.ggml.{k}"] for k in names if f"tokenizer.ggml.{k}" in meta
    }
    ref, _ = convert_gguf_tokenizer("llama", tok_dict)
    for text in [
        "hello world!",
        " hello  world",
        "hélló wörld 😀 123456",
        "test\nhello\n\n",
        "",
        "  ",
        "<s>hello</s><|end|>",
        "I'll  don't 12345 \t x",
    ]:
        want = ref.encode(text, add_special_tokens=False).ids
        assert ours.encode(text, add_special_tokens=False).ids == want, text
        assert ours.decode(want, skip_special_tokens=False) == ref.decode(
            want, skip_special_tokens=False
        )


@pytest.mark.parametrize(
    "source,expected",
    [
        ("{% for m in messages %}{{ m['content'] }}{% endfor %}", False),
        ("{% for t in tools %}{% if t.type == 'function' %}{% endif %}{% endfor %}", False),
        ("{% for part in message['content'] %}{% if part['type'] == 'image' %}", True),
        ("{% if message.content is string %}{{ message.content }}{% endif %}", True),
        ("{% if c.type == 'text' %}{{ c.text }}{% endif %}", True),
    ],
)
def test_part_list_detection(source, expected):
    from mmserve.models.chat_template import template_handles_parts

    assert template_handles_parts(source) is expected


def test_bad_message_shapes_are_user_errors(smol):
    ours, _ = smol
    with pytest.raises(InvalidRequestError):
        ours.apply_chat_template(["not a message"])  # type: ignore[list-item]
    with pytest.raises(InvalidRequestError):  # the template concatenates a str with None
        ours.apply_chat_template([{"role": "user", "content": None}])
