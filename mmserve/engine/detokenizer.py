"""Incremental detokenization: token ids in, new text out, never a broken character.

Technique (vLLM's prefix/read offsets on a sliding decode window): the window holds
a little already-emitted context ``ids[prefix:read]`` followed by the pending tokens
``ids[read:]``. Each step decodes the window and its context part; the difference is
the pending tokens' text *in context* (so decoders that treat the first token of a
decode specially, e.g. a leading-space strip, still give the right text). While the
window's text ends in U+FFFD the pending tokens are an incomplete UTF-8 character
and are held back. After emitting, the window slides: ``prefix, read = read, end``.

Invariant: the concatenation of all ``add`` outputs plus ``flush`` equals
``backend.decode(output_ids, skip_special_tokens=...)`` for ordinary outputs with
tokenizers whose decode is context-free concatenation (byte-level BPE, Gemma's
byte-fallback). With a decoder that strips the first token's leading space
(Llama-2-style Metaspace) the first token keeps its space, as it reads after the
prompt. Cost per token is bounded: the window never exceeds two emissions, and
an emission is forced after ``MAX_HELD_TOKENS`` pending tokens: at the latest clean
token boundary if there is one, else all of it, the broken bytes as U+FFFD (real text
holds back at most 2-3 tokens; a longer unfinished tail means the bytes are broken).
"""

from __future__ import annotations

from tokenizers import Tokenizer

REPLACEMENT_CHAR = "\ufffd"
PROMPT_CONTEXT_TOKENS = 5  # prompt tokens decoded as context before the first output token
MAX_HELD_TOKENS = 8  # pending tokens after which an unfinished tail is forced out


class IncrementalDetokenizer:
    """Per-request streaming state. ``add`` new output ids each step; ``flush`` once at
    the end. ``special_ids`` (default: the backend's special added tokens) are dropped
    before decoding when ``skip_special_tokens``, exactly as ``backend.decode`` does."""

    def __init__(
        self,
        tokenizer_backend: Tokenizer,
        prompt_ids: list[int],
        skip_special_tokens: bool = True,
        special_ids: set[int] | None = None,
    ) -> None:
        self._backend = tokenizer_backend
        self._skip = skip_special_tokens
        if special_ids is None:
            added = tokenizer_backend.get_added_tokens_decoder()
            special_ids = {i for i, tok in added.items() if tok.special}
        self._special = special_ids if skip_special_tokens else set()
        context = [t for t in prompt_ids if t not in self._special][-PROMPT_CONTEXT_TOKENS:]
        self._prefix_text = self._decode(context)
        if self._prefix_text.endswith(REPLACEMENT_CHAR):
            # the prompt ends inside a character: its bytes must not merge into the output
            context, self._prefix_text = [], ""
        self._window: list[int] = context  # ids[prefix:] of the whole stream
        self._read = len(context)  # window index of the first pending token
        self._text = ""

    @property
    def text(self) -> str:
        """All text emitted so far."""
        return self._text

    def add(self, token_ids: list[int]) -> str:
        """Append output tokens; return the text that became final (maybe "")."""
        self._window.extend(t for t in token_ids if t not in self._special)
        if len(self._window) == self._read:
            return ""
        full = self._decode(self._window)
        if len(full) > len(self._prefix_text) and not full.endswith(REPLACEMENT_CHAR):
            return self._emit(full, len(self._window))
        if len(self._window) - self._read > MAX_HELD_TOKENS:
            return self._emit(*self._forced_cut(full))
        return ""

    def flush(self) -> str:
        """Emit whatever is held (a truly broken tail comes out as U+FFFD)."""
        if len(self._window) == self._read:
            return ""
        return self._emit(self._decode(self._window), len(self._window))

    def _forced_cut(self, full: str) -> tuple[str, int]:
        """The latest token boundary whose text is clean and a prefix of ``full`` (a long
        run of multi-byte merges), else everything (the bytes are truly broken)."""
        for cut in range(len(self._window) - 1, self._read, -1):
            text = self._decode(self._window[:cut])
            if len(text) > len(self._prefix_text) and not text.endswith(REPLACEMENT_CHAR):
                if full.startswith(text):
                    return text, cut
        return full, len(self._window)

    def _emit(self, decoded: str, upto: int) -> str:
        """``decoded`` is the window's text up to window index ``upto``; emit its new
        part and slide the window so the just-emitted tokens become the context."""
        new_text = decoded[len(self._prefix_text) :]
        self._window = self._window[self._read :]
        upto -= self._read
        self._read = upto
        self._prefix_text = self._decode(self._window[:upto])
        self._text += new_text
        return new_text

    def _decode(self, ids: list[int]) -> str:
        return self._backend.decode(ids, skip_special_tokens=self._skip)
