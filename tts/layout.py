"""Frame layouts: how a codec-LM's output tokens spell codec frames.

The engine knows nothing of audio: it emits token ids. A layout reads them back as frames
of codes in the codec's own frame order, incrementally, one stream at a time
(``layout.parser()`` gives a fresh per-stream parser), and writes frames as tokens (for
training and tests). Tokens that are not audio (markers, the stop token) carry no frame.

- ``OrpheusLayout``: 7 tokens a SNAC frame, token ``base + slot * 4096 + code`` for the
  frame's ``slot``-th code, slots in the order [l0, l1a, l2a, l2b, l1b, l2c, l2d]
  (canopylabs' ``orpheus_tts`` decoder: ``custom_token_N`` is id ``128256 + N``, its code
  ``N - 10 - (index % 7) * 4096``). A token outside the range its slot expects is
  dropped without advancing the slot (the reference also drops code 0, which shifts its
  slots; here code 0 is a code like any other).
- ``PhonemeFrameLayout``: the default voice's 2 tokens a frame, ``[Q_k, C_code]``: which
  phoneme the frame speaks (``Q_k``, an index into the prompt), then the frame's one code.
"""

from __future__ import annotations

from abc import ABC, abstractmethod


class FrameParser(ABC):
    """One stream's incremental token -> frame reader."""

    @abstractmethod
    def feed(self, token_ids: list[int]) -> list[list[int]]:
        """New tokens -> the frames they complete (codes in the codec's frame order)."""


class FrameLayout(ABC):
    tokens_per_frame: int
    codes_per_frame: int

    @abstractmethod
    def parser(self) -> FrameParser: ...

    @abstractmethod
    def frame_tokens(self, frames: list[list[int]]) -> list[int]:
        """Frames (codec order) -> the tokens that spell them."""


# Orpheus: SNAC frame order [l0, l1a, l1b, l2a, l2b, l2c, l2d] <- token slots
ORPHEUS_SLOT_OF_CODE = (0, 1, 4, 2, 3, 5, 6)  # SNAC frame index i is spoken at this slot


class OrpheusLayout(FrameLayout):
    tokens_per_frame = 7
    codes_per_frame = 7

    def __init__(self, base: int = 128266, codebook: int = 4096) -> None:
        self.base, self.codebook = base, codebook

    def parser(self) -> FrameParser:
        return _OrpheusParser(self)

    def frame_tokens(self, frames: list[list[int]]) -> list[int]:
        out = []
        for frame in frames:
            slots = [0] * 7
            for i, code in enumerate(frame):
                slots[ORPHEUS_SLOT_OF_CODE[i]] = code
            out += [self.base + s * self.codebook + c for s, c in enumerate(slots)]
        return out


class _OrpheusParser(FrameParser):
    def __init__(self, layout: OrpheusLayout) -> None:
        self.layout = layout
        self.slots: list[int] = []

    def feed(self, token_ids: list[int]) -> list[list[int]]:
        lay, done = self.layout, []
        for t in token_ids:
            code = t - lay.base - len(self.slots) * lay.codebook
            if not 0 <= code < lay.codebook:
                continue
            self.slots.append(code)
            if len(self.slots) == 7:
                done.append([self.slots[s] for s in ORPHEUS_SLOT_OF_CODE])
                self.slots = []
        return done


class PhonemeFrameLayout(FrameLayout):
    tokens_per_frame = 2
    codes_per_frame = 1

    def __init__(self, q_base: int, num_q: int, code_base: int, codebook: int) -> None:
        self.q_base, self.num_q = q_base, num_q
        self.code_base, self.codebook = code_base, codebook

    def parser(self) -> FrameParser:
        return _PhonemeFrameParser(self)

    def frame_tokens(self, frames: list[list[int]], phonemes: list[int] | None = None) -> list[int]:
        """``phonemes``: each frame's phoneme index (``Q_k``); default 0."""
        ks = phonemes if phonemes is not None else [0] * len(frames)
        out: list[int] = []
        for k, frame in zip(ks, frames, strict=True):
            out += [self.q_base + k, self.code_base + frame[0]]
        return out

    def is_q(self, token: int) -> bool:
        return self.q_base <= token < self.q_base + self.num_q


class _PhonemeFrameParser(FrameParser):
    def __init__(self, layout: PhonemeFrameLayout) -> None:
        self.layout = layout

    def feed(self, token_ids: list[int]) -> list[list[int]]:
        lay = self.layout
        return [
            [t - lay.code_base]
            for t in token_ids
            if lay.code_base <= t < lay.code_base + lay.codebook
        ]
