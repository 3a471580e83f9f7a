"""The default voice's kind: phoneme symbols in, one codec frame per two tokens out.

Vocabulary (``PhonemeVocab``): 4 specials (``<pad> <bos> <eos> <speech>``), the phoneme
and punctuation symbols (``tts.text``; ``<unk>`` for one never trained on), position
tokens ``Q_0 .. Q_{num_q-1}``, then the codec's codes ``C_0 ..``.

Prompt: ``<bos>``, then each symbol, a phoneme followed by its position ``Q_k``, then
``<speech>``. Output: frames ``[Q_k, C_code]`` -- the phoneme the frame speaks, then its
code -- and ``<eos>``. Naming the phoneme in every frame makes alignment a lookup (the
frame's ``Q_k`` matches the prompt's ``Q_k``, which sits right after phoneme ``k``) and
a duration a choice between ``Q_k`` and ``Q_{k+1}``, which a small model learns from a few
thousand sentences; the teacher's phoneme timing supervises both.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from mmserve.sampling_params import SamplingParams
from tts.codec import StreamingCodec
from tts.layout import PhonemeFrameLayout
from tts.text import Phonemized, phonemize, split_clauses
from tts.voice import Voice

SPECIALS = ("<pad>", "<bos>", "<eos>", "<speech>")
PAD, BOS, EOS, SPEECH = range(4)
UNK = "<unk>"


class PhonemeVocab:
    def __init__(self, symbols: list[str], num_q: int, codebook: int) -> None:
        self.symbols = list(symbols) if UNK in symbols else [UNK, *symbols]
        self.sym_id = {s: len(SPECIALS) + i for i, s in enumerate(self.symbols)}
        self.q_base = len(SPECIALS) + len(self.symbols)
        self.num_q, self.codebook = num_q, codebook
        self.code_base = self.q_base + num_q
        self.size = self.code_base + codebook

    def layout(self) -> PhonemeFrameLayout:
        return PhonemeFrameLayout(self.q_base, self.num_q, self.code_base, self.codebook)

    def prompt(self, ph: Phonemized) -> list[int]:
        assert ph.num_phonemes <= self.num_q, "too many phonemes for one prompt"
        ids, k = [BOS], 0
        for sym, is_ph in zip(ph.symbols, ph.is_phoneme, strict=True):
            ids.append(self.sym_id.get(sym, self.sym_id[UNK]))
            if is_ph:
                ids.append(self.q_base + k)
                k += 1
        return [*ids, SPEECH]

    def names(self) -> list[str]:
        return (
            [*SPECIALS, *self.symbols]
            + [f"<Q{k}>" for k in range(self.num_q)]
            + [f"<C{c}>" for c in range(self.codebook)]
        )

    def tokenizer_json(self) -> str:
        """A ``tokenizers`` JSON for the engine (see :func:`special_tokens_json`)."""
        return special_tokens_json(self.names(), UNK)


def special_tokens_json(names: list[str], unk_token: str) -> str:
    """A ``tokenizers`` JSON for a vocabulary of audio tokens: WordLevel, token ``i`` is
    ``names[i]``, and every token is special, so the engine's text output of audio is
    empty."""
    added = [
        {
            "id": i,
            "content": n,
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": True,
        }
        for i, n in enumerate(names)
    ]
    return json.dumps(
        {
            "version": "1.0",
            "truncation": None,
            "padding": None,
            "added_tokens": added,
            "normalizer": None,
            "pre_tokenizer": {"type": "WhitespaceSplit"},
            "post_processor": None,
            "decoder": None,
            "model": {
                "type": "WordLevel",
                "vocab": {n: i for i, n in enumerate(names)},
                "unk_token": unk_token,
            },
        }
    )


# the fewest phonemes of a prompt whose pointer the backbone keeps, set on the template
# corpus's voice (99 % of its 36,000 teacher sentences have 22 or more, 13 fewer than 20);
# the broad corpus's voice learned short prompts too (about 11 % of its sentences are under
# 20 phonemes) and keeps short replies' durations without the rule (docs/speech.md)
ANCHORED_PHONEMES = 20


class PhonemeVoice(Voice):
    max_piece_chars = 160
    layout: PhonemeFrameLayout

    def __init__(self, path: Path, meta: dict) -> None:
        self.model_dir = path
        self.name = meta.get("name", "default")
        self.vocab = PhonemeVocab(meta["symbols"], int(meta["num_q"]), int(meta["codebook"]))
        self.layout = self.vocab.layout()
        self.codec_dir = path / meta.get("codec", "codec")
        self.temperature = float(meta.get("temperature", 0.0))
        # a piece's frames are bounded by frames_per_phoneme * phonemes + frame_slack
        self.frames_per_phoneme = int(meta.get("max_frames_per_phoneme", 40))
        self.frame_slack = int(meta.get("frame_slack", 25))

    def load_codec(self, device: torch.device | str = "cpu") -> StreamingCodec:
        from tts.framecodec import FrameCodec

        return FrameCodec.load(self.codec_dir).to(device)

    def prompts(self, text: str, speaker: str | None = None) -> list[list[int]]:
        out: list[list[int]] = []
        # one sentence a piece: the backbone learned single sentences, and given two it
        # ends the utterance at the first one's end (``tts.text``)
        for piece in split_clauses(text, self.max_piece_chars, join_sentences=False):
            out += self._piece(piece)
        return out

    def _piece(self, text: str) -> list[list[int]]:
        ph = phonemize(text)
        if ph.num_phonemes == 0:
            return []
        if ph.num_phonemes <= self.vocab.num_q:
            return [self.vocab.prompt(ph)]
        words = text.split()
        if len(words) < 2:  # one enormous "word": speak its first part
            return self._piece(text[: len(text) // 2])
        half = len(words) // 2
        return self._piece(" ".join(words[:half])) + self._piece(" ".join(words[half:]))

    def sampling(self, prompt: list[int], seed: int | None = None) -> SamplingParams:
        phonemes = len([t for t in prompt if self.layout.is_q(t)])
        frames = self.frames_per_phoneme * phonemes + self.frame_slack
        lay = self.layout
        # a pointer past the prompt's last phoneme names nothing to speak: the backbone
        # has lost its place (it does on words a sentence repeats), so the piece ends there
        # instead of babbling on until <eos>. Only on prompts of the teacher corpus's
        # lengths: on shorter ones its pointer is not anchored at all (it may start at the
        # last phoneme), and ending there would leave a short reply silent
        overrun = (
            range(lay.q_base + phonemes, lay.q_base + lay.num_q)
            if phonemes >= ANCHORED_PHONEMES
            else range(0)
        )
        return SamplingParams(
            temperature=self.temperature,
            max_tokens=2 * frames + 1,
            stop_token_ids=[EOS, *overrun],
            seed=seed,
            detokenize=False,
        )
