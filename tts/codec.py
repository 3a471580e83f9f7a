"""The streaming codec contract: code frames in, PCM out, as the frames arrive.

A codec turns frames of ``codes_per_frame`` integer codes into ``frame_samples`` samples
each at ``sample_rate``. It decodes in two ways that must agree:

- ``decode(codes)``: a whole utterance at once, ``(B, T, K) -> (B, T * frame_samples)``;
- streaming: ``state = codec.init_state(batch)``, then ``codec.step(codes, state)`` for
  each group of new frames and ``codec.flush(state)`` once the utterance is over. Each
  returns a :class:`PCMBlock` whose valid samples, concatenated in order, equal the
  whole-utterance decode (within the codec's stated float tolerance).

The weights live in the module; everything that belongs to one stream (conv history,
overlap-add tails, frame counters, noise seeds) lives in a :class:`CodecState` with the
batch first, so one set of weights serves any number of streams and rows can be gathered,
scattered and reset independently (``CodecSlots``). A codec whose layers look ahead (SNAC's
"same"-padded convolutions) emits each sample once no later frame can change it:
``lookahead_frames`` says how many frames that takes. ``with codec.streaming(batch) as st``
is the moshi-style shorthand for one stream group.
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn


@dataclass
class CodecState:
    """Per-stream decoder state, batch first. ``buffers`` are the codec's own tensors
    (history, tails); ``frames`` counts the frames each row has been fed and ``end`` is a
    row's frame count once it is flushed (-1 while open), both on the host; ``seeds``
    seed each row's deterministic noise (codecs without noise ignore them)."""

    buffers: list[torch.Tensor]
    frames: np.ndarray  # (B,) int64
    end: np.ndarray  # (B,) int64, -1: open
    seeds: np.ndarray  # (B,) int64

    @property
    def batch(self) -> int:
        return len(self.frames)

    def select(self, rows: list[int]) -> CodecState:
        """A new state holding copies of ``rows`` (in that order)."""
        idx = torch.tensor(rows, dtype=torch.long, device=self._device())
        return CodecState(
            [b.index_select(0, idx) for b in self.buffers],
            self.frames[rows].copy(),
            self.end[rows].copy(),
            self.seeds[rows].copy(),
        )

    # The buffers are written in place under inference mode: a codec's ``step`` (itself in
    # inference mode) may have replaced them with inference tensors, which refuse in-place
    # writes outside it; normal tensors take them there too.
    def put(self, rows: list[int], sub: CodecState) -> None:
        """Write ``sub``'s rows back into ``rows`` of this state."""
        idx = torch.tensor(rows, dtype=torch.long, device=self._device())
        with torch.inference_mode():
            for mine, theirs in zip(self.buffers, sub.buffers, strict=True):
                mine.index_copy_(0, idx, theirs)
        self.frames[rows], self.end[rows], self.seeds[rows] = sub.frames, sub.end, sub.seeds

    def advance(
        self, n: int, frame_samples: int, delay: int = 0, rows: list[int] | None = None
    ) -> tuple[list[int], list[int]]:
        """Count ``n`` more frames fed to ``rows`` (every row: None) -> each one's real
        columns [lo, hi) of the block those frames decoded into (``valid_range``)."""
        sel = slice(None) if rows is None else rows
        before = self.frames[sel].copy()
        self.frames[sel] += n
        return valid_range(before, n, frame_samples, delay, self.end[sel])

    def reset(self, rows: list[int], seeds: list[int] | None = None) -> None:
        """Start ``rows`` afresh (a new stream in an old slot)."""
        with torch.inference_mode():
            for b in self.buffers:
                b[rows] = 0
        self.frames[rows], self.end[rows] = 0, -1
        self.seeds[rows] = seeds if seeds is not None else 0

    def _device(self) -> torch.device:
        return self.buffers[0].device if self.buffers else torch.device("cpu")


@dataclass
class PCMBlock:
    """Samples from one ``step``/``flush``: row ``r``'s valid samples are
    ``pcm[r, lo[r]:hi[r]]`` (the rest is warm-up before a stream's first sample or
    padding after its last)."""

    pcm: torch.Tensor  # (B, L) float
    lo: list[int] = field(default_factory=list)
    hi: list[int] = field(default_factory=list)

    def rows(self) -> list[np.ndarray]:
        """Each row's valid samples as float32 numpy (one device-to-host copy)."""
        host = self.pcm.detach().float().cpu().numpy()
        return [host[r, lo:hi] for r, (lo, hi) in enumerate(zip(self.lo, self.hi, strict=True))]


class StreamingCodec(nn.Module, ABC):
    """Frames of integer codes -> PCM; see the module docstring for the contract."""

    sample_rate: int
    frame_samples: int  # samples per frame (the hop)
    codes_per_frame: int
    codebook_size: int  # each code is in [0, codebook_size)
    tolerance: float = 1e-4  # |streaming - whole| bound this codec promises (float32)

    @property
    def frame_duration(self) -> float:
        """Seconds of audio per frame."""
        return self.frame_samples / self.sample_rate

    @property
    def lookahead_frames(self) -> int:
        """Frames that must follow frame ``t`` before all of its samples are final."""
        return -(-self.delay_samples // self.frame_samples)

    @property
    def delay_samples(self) -> int:
        """How many samples streaming output lags the frames fed (0: causal)."""
        return 0

    @abstractmethod
    def decode(self, codes: torch.Tensor, seeds: list[int] | None = None) -> torch.Tensor:
        """(B, T, K) codes -> (B, T * frame_samples) PCM in [-1, 1]."""

    @abstractmethod
    def init_state(self, batch: int, seeds: list[int] | None = None) -> CodecState:
        """A fresh state for ``batch`` streams on the codec's device."""

    @abstractmethod
    def step(self, codes: torch.Tensor, state: CodecState) -> PCMBlock:
        """Feed (B, n, K) new frames (n >= 1, the same n for every row) -> the samples
        that became final."""

    @abstractmethod
    def flush(self, state: CodecState) -> PCMBlock:
        """End every row's utterance -> its remaining samples; the state is spent."""

    @contextlib.contextmanager
    def streaming(self, batch: int = 1, seeds: list[int] | None = None) -> Iterator[CodecState]:
        """``with codec.streaming(batch) as state:`` one group of streams; refuses nesting
        (a second group needs its own ``init_state``)."""
        if getattr(self, "_streaming", False):
            raise RuntimeError("this codec is already streaming; use init_state for more")
        self._streaming = True
        try:
            yield self.init_state(batch, seeds)
        finally:
            self._streaming = False

    @property
    def device(self) -> torch.device:
        p = next(self.parameters(), None)
        return p.device if p is not None else torch.device("cpu")

    def check_codes(self, codes: torch.Tensor) -> None:
        assert codes.dim() == 3 and codes.shape[-1] == self.codes_per_frame, (
            f"codes must be (B, n, {self.codes_per_frame}), got {tuple(codes.shape)}"
        )


def valid_range(
    frames_before: np.ndarray, n_frames: int, frame_samples: int, delay: int, end: np.ndarray
) -> tuple[list[int], list[int]]:
    """For a block of ``n_frames * frame_samples`` samples emitted after each row had been
    fed ``frames_before`` frames, with output lagging input by ``delay`` samples: the
    columns [lo, hi) of each row that are real samples (time >= 0, before its end)."""
    lo, hi = [], []
    width = n_frames * frame_samples
    for fb, e in zip(frames_before.tolist(), end.tolist(), strict=True):
        t0 = fb * frame_samples - delay  # output time of column 0
        top = width if e < 0 else max(0, min(width, e * frame_samples - t0))
        lo.append(min(top, max(0, -t0)))
        hi.append(top)
    return lo, hi
