"""The model's tokenizer: a thin wrapper over ``tokenizers.Tokenizer`` plus its chat template.

``Tokenizer(model_dir)`` reads ``tokenizer.json``, ``tokenizer_config.json`` and (optionally)
``generation_config.json`` / ``chat_template.jinja`` / ``chat_template.json`` -- the HF layout,
which is also what ``gguf_convert`` writes. ``build_gguf_backend`` (below) builds the tokenizer
a GGUF's metadata describes, reproducing transformers' GGUF tokenizer converters without
importing transformers.
``encode`` adds no special tokens by default, because chat templates write ``bos`` themselves.
The stop set ``eos_token_ids`` is the union of the tokenizer's eos token and the generation
config's ``eos_token_id`` (int or list). ``backend`` is the raw tokenizer, for detokenizers.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import tokenizers
from tokenizers import AddedToken, Regex, decoders, normalizers, pre_tokenizers, processors
from tokenizers.models import BPE

from mmserve.errors import InvalidRequestError
from mmserve.models.chat_template import render_chat_template

_SPECIAL_NAMES = ("bos_token", "eos_token", "unk_token", "pad_token")


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    with open(path, encoding="utf-8") as fh:
        data = json.load(fh)
    return data if isinstance(data, dict) else {}


def _token_text(value: Any) -> str | None:
    # HF configs write special tokens either as strings or as AddedToken dicts
    if isinstance(value, Mapping):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _pick_template(value: Any) -> str | None:
    # legacy HF format: a list of named templates; the "default" one is the chat template
    if isinstance(value, list):
        named = {t.get("name"): t.get("template") for t in value if isinstance(t, Mapping)}
        value = named.get("default")
    return value if isinstance(value, str) else None


class Tokenizer:
    """Text <-> token ids for one model directory, and its chat template."""

    def __init__(self, model_dir: str | Path) -> None:
        model_dir = Path(model_dir)
        path = model_dir / "tokenizer.json"
        if not path.is_file():
            raise FileNotFoundError(f"{model_dir} has no tokenizer.json; is it a model directory?")
        self.backend: tokenizers.Tokenizer = tokenizers.Tokenizer.from_file(str(path))
        self.config = _read_json(model_dir / "tokenizer_config.json")
        generation = _read_json(model_dir / "generation_config.json")
        jinja_file = model_dir / "chat_template.jinja"
        # a chat_template.jinja file wins, as in HF; then a processor's chat_template.json
        # (VLM checkpoints saved by transformers 4), as its apply_chat_template reads it
        processor_template = _read_json(model_dir / "chat_template.json").get("chat_template")
        self.chat_template: str | None = (
            jinja_file.read_text(encoding="utf-8")
            if jinja_file.is_file()
            else _pick_template(processor_template or self.config.get("chat_template"))
        )
        self.special_tokens: dict[str, str] = {
            name: text for name in _SPECIAL_NAMES if (text := _token_text(self.config.get(name)))
        }
        self.bos_token_id: int | None = self._id_of(self.special_tokens.get("bos_token"))
        if self.bos_token_id is None and isinstance(generation.get("bos_token_id"), int):
            self.bos_token_id = generation["bos_token_id"]
        self.eos_token_ids: set[int] = self._stop_ids(generation.get("eos_token_id"))
        self.pad_token_id: int | None = self._id_of(self.special_tokens.get("pad_token"))
        self.all_special_ids: set[int] = {
            i for i, tok in self.backend.get_added_tokens_decoder().items() if tok.special
        }

    def _id_of(self, text: str | None) -> int | None:
        return None if text is None else self.backend.token_to_id(text)

    def _stop_ids(self, generation_eos: Any) -> set[int]:
        ids = {self._id_of(self.special_tokens.get("eos_token"))}
        if isinstance(generation_eos, int):
            ids.add(generation_eos)
        elif isinstance(generation_eos, list):
            ids.update(i for i in generation_eos if isinstance(i, int))
        return {i for i in ids if i is not None}

    @property
    def vocab_size(self) -> int:
        """Number of ids the tokenizer can produce (base vocabulary plus added tokens)."""
        return int(self.backend.get_vocab_size(with_added_tokens=True))

    @property
    def eos_token_id(self) -> int | None:
        """The tokenizer's own eos token (one id); ``eos_token_ids`` is the full stop set."""
        return self._id_of(self.special_tokens.get("eos_token"))

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """Token ids of ``text``; ``add_special_tokens`` applies the post-processor (e.g. bos)."""
        return list(self.backend.encode(text, add_special_tokens=add_special_tokens).ids)

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = True) -> str:
        return str(self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens))

    def id_to_token(self, i: int) -> str | None:
        return self.backend.id_to_token(i)

    def token_to_id(self, token: str) -> int | None:
        return self.backend.token_to_id(token)

    def convert_ids_to_tokens(self, ids: Iterable[int]) -> list[str | None]:
        return [self.backend.id_to_token(i) for i in ids]

    def apply_chat_template(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        add_generation_prompt: bool = True,
        chat_template: str | None = None,
        **kwargs: Any,
    ) -> str:
        """The prompt text for ``messages``; tokenize it with ``encode(..., False)``.
        ``chat_template`` overrides the model's own template, as in HF."""
        template = chat_template or self.chat_template
        if template is None:
            raise InvalidRequestError(
                "This model has no chat template (it is likely a base model); "
                "use the completions API with a plain prompt instead."
            )
        return render_chat_template(
            template,
            messages,
            tools=tools,
            add_generation_prompt=add_generation_prompt,
            special_tokens=self.special_tokens,
            **kwargs,
        )


# ---- building the tokenizer a GGUF describes ---------------------------------------------

_CONTROL, _USER_DEFINED = 3, 4  # llama.cpp token types
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# llama.cpp pre-tokenizer names whose regex is GPT-2's with each digit split off first
_DIGIT_SPLIT_PRE = {"smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva"}
_REGEX_PRE = {"llama3": _LLAMA3_SPLIT, "llama-bpe": _LLAMA3_SPLIT, "qwen2": _QWEN2_SPLIT}


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's printable spelling of each byte (the byte-level BPE alphabet)."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1)]
    keep += range(ord("®"), ord("ÿ") + 1)
    table, extra = {b: chr(b) for b in keep}, 0
    for b in range(256):
        if b not in table:
            table[b], extra = chr(256 + extra), extra + 1
    return table


def _byte_level_pre(pre: str | None) -> pre_tokenizers.PreTokenizer:
    if pre in _DIGIT_SPLIT_PRE:
        return pre_tokenizers.Sequence(
            [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(False, True)]
        )
    if pre in _REGEX_PRE:
        split = pre_tokenizers.Split(Regex(_REGEX_PRE[pre]), behavior="isolated")
        return pre_tokenizers.Sequence([split, pre_tokenizers.ByteLevel(False, use_regex=False)])
    return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)


def _byte_level_bpe(meta: dict[str, Any]) -> tokenizers.Tokenizer:
    spelling = _bytes_to_unicode()
    alphabet = set(spelling.values())
    vocab = {
        t if set(t) <= alphabet else "".join(spelling[b] for b in t.encode("utf-8")): i
        for i, t in enumerate(meta["tokenizer.ggml.tokens"])
    }
    merges = [tuple(m.split(" ", 1)) for m in meta["tokenizer.ggml.merges"]]
    tok = tokenizers.Tokenizer(BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
    tok.pre_tokenizer = _byte_level_pre(meta.get("tokenizer.ggml.pre"))
    tok.decoder = decoders.ByteLevel()
    return tok


def generate_merges(vocab: dict[str, int], scores: dict[str, float]) -> list[tuple[str, str]]:
    """BPE merges implied by a sentencepiece vocabulary: every split of a token into two
    vocabulary pieces, best-scored token first, longer left piece first (as transformers)."""
    merges: list[tuple[str, str, float]] = []
    for token, score in scores.items():
        local = [
            (token[:i], token[i:], score)
            for i in range(1, len(token))
            if token[:i] in vocab and token[i:] in vocab
        ]
        merges.extend(sorted(local, key=lambda m: (vocab[m[0]], vocab[m[1]])))
    merges.sort(key=lambda m: (m[2], len(m[0]), len(m[1])), reverse=True)
    return [(left, right) for left, right, _ in merges]


def _sentencepiece_bpe(meta: dict[str, Any]) -> tokenizers.Tokenizer:
    tokens = list(meta["tokenizer.ggml.tokens"])
    gemma = str(meta["general.architecture"]).startswith("gemma")
    if gemma:
        # Gemma files spell whitespace-run tokens with real spaces; the model sees them as U+2581.
        # Its scores do not follow merge order, the token order in the file does.
        tokens = ["\u2581" * len(t) if " " in t and not t.strip() else t for t in tokens]
        scores = {t: float(-i) for i, t in enumerate(tokens)}
    else:
        scores = dict(zip(tokens, map(float, meta["tokenizer.ggml.scores"]), strict=True))
    vocab = {t: i for i, t in enumerate(tokens)}
    unk_id = meta.get("tokenizer.ggml.unknown_token_id")
    unk = tokens[unk_id] if unk_id is not None else "<unk>"
    model = BPE(
        vocab=vocab,
        merges=generate_merges(vocab, scores),
        unk_token=unk,
        fuse_unk=True,
        byte_fallback=True,
    )
    tok = tokenizers.Tokenizer(model)
    steps = [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()]
    if gemma:
        tok.normalizer = normalizers.Replace(" ", "\u2581")
        tok.pre_tokenizer = pre_tokenizers.Split(" ", behavior="merged_with_previous")
    else:
        prefix = bool(meta.get("tokenizer.ggml.add_space_prefix", True))
        tok.pre_tokenizer = pre_tokenizers.Metaspace(
            replacement="\u2581", prepend_scheme="first" if prefix else "never", split=False
        )
        steps += [decoders.Strip(content=" ", left=1)] if prefix else []
    tok.decoder = decoders.Sequence(steps)
    return tok


def special_token_ids(meta: dict[str, Any]) -> dict[str, int | None]:
    """GGUF ids of the bos / eos / unk / pad tokens (None where the file names none)."""
    return {
        name: meta.get(f"tokenizer.ggml.{key}")
        for name, key in (
            ("bos", "bos_token_id"),
            ("eos", "eos_token_id"),
            ("unk", "unknown_token_id"),
            ("pad", "padding_token_id"),
        )
    }


def _add_gguf_tokens(tok: tokenizers.Tokenizer, meta: dict[str, Any]) -> None:
    """Control tokens (and bos/eos/unk/pad) become special added tokens, user-defined ones
    plain added tokens, so neither is ever split. In a byte-level vocabulary a control token
    spelled outside the byte alphabet is a llama.cpp mislabel and is skipped, as in HF."""
    tokens = meta["tokenizer.ggml.tokens"]
    types = meta.get("tokenizer.ggml.token_type") or [1] * len(tokens)
    alphabet = set(_bytes_to_unicode().values()) if meta["tokenizer.ggml.model"] == "gpt2" else None
    named = {i for i in special_token_ids(meta).values() if i is not None}
    special = [
        AddedToken(t, normalized=False, special=True)
        for i, (t, kind) in enumerate(zip(tokens, types, strict=True))
        if (kind == _CONTROL and (alphabet is None or set(t) <= alphabet)) or i in named
    ]
    tok.add_special_tokens(special)
    vocab = tok.get_vocab()
    plain = [
        AddedToken(t, normalized=False, special=False)
        for t, kind in zip(tokens, types, strict=True)
        if kind == _USER_DEFINED and t in vocab
    ]
    tok.add_tokens(plain)


def _post_processor(meta: dict[str, Any], add_bos: bool, add_eos: bool) -> processors.PostProcessor:
    """Prepend bos / append eos when asked for special tokens, if the GGUF says llama.cpp does."""
    tokens, ids = meta["tokenizer.ggml.tokens"], special_token_ids(meta)
    wanted = (("bos", add_bos), ("eos", add_eos))
    used = {n: i for n, on in wanted if on and (i := ids[n]) is not None}
    bos = [tokens[used["bos"]]] if "bos" in used else []
    eos = [tokens[used["eos"]]] if "eos" in used else []
    return processors.TemplateProcessing(
        single=[*bos, "$A", *eos],
        pair=[*bos, "$A", *eos, *(f"{t}:1" for t in bos), "$B:1", *(f"{t}:1" for t in eos)],
        special_tokens=[(tokens[i], i) for i in used.values()],
    )


def gguf_adds_bos_eos(meta: dict[str, Any]) -> tuple[bool, bool]:
    """Whether llama.cpp adds bos / eos when tokenizing with this GGUF (its defaults if unset)."""
    sentencepiece = meta.get("tokenizer.ggml.model") == "llama"
    add_bos = bool(meta.get("tokenizer.ggml.add_bos_token", sentencepiece))
    return add_bos, bool(meta.get("tokenizer.ggml.add_eos_token", False))


def build_gguf_backend(meta: dict[str, Any]) -> tokenizers.Tokenizer:
    """The ``tokenizers.Tokenizer`` a GGUF's metadata describes (what tokenizer.json holds)."""
    kind = meta.get("tokenizer.ggml.model")
    if kind not in ("gpt2", "llama"):
        raise InvalidRequestError(
            f"GGUF tokenizer type {kind!r} is not supported; supported: 'gpt2' (byte-level BPE) "
            "and 'llama' (sentencepiece BPE)."
        )
    tok = _byte_level_bpe(meta) if kind == "gpt2" else _sentencepiece_bpe(meta)
    _add_gguf_tokens(tok, meta)
    tok.post_processor = _post_processor(meta, *gguf_adds_bos_eos(meta))
    return tok
