"""Streaming time-stretch (WSOLA) for the speech API's ``speed``: tempo changes, pitch stays.

Output frames of ``2 * hop`` samples are overlap-added every ``hop`` samples; the ``k``-th
is read from the input near ``k * hop * speed``, shifted by up to ``tolerance`` samples to
the position whose waveform best continues the previous frame (cross-correlation), so
periods line up and no phasing is heard. Input arrives in chunks; a frame is made as soon
as the input it may read is in, and ``flush`` pads the end with zeros.
"""

from __future__ import annotations

import numpy as np


class Stretcher:
    def __init__(self, speed: float, hop: int = 240, tolerance: int = 120) -> None:
        assert speed > 0
        self.speed, self.hop, self.tol = speed, hop, tolerance
        self.win = np.hanning(2 * hop + 1)[:-1].astype(np.float32)  # sums to 1 at hop
        self.buf = np.zeros(0, np.float32)
        self.base = 0  # input index of buf[0]
        self.k = 0  # next output frame
        self.tail = np.zeros(hop, np.float32)  # second half of the last frame
        # input right after the last frame read (its natural sequel)
        self.prev_next: np.ndarray | None = None

    def feed(self, x: np.ndarray) -> np.ndarray:
        if self.speed == 1.0:
            return x
        self.buf = np.concatenate([self.buf, x.astype(np.float32)])
        return self._run(final=False)

    def flush(self) -> np.ndarray:
        if self.speed == 1.0:
            return np.zeros(0, np.float32)
        self.buf = np.concatenate([self.buf, np.zeros(2 * self.hop + 2 * self.tol, np.float32)])
        out = self._run(final=True)
        return np.concatenate([out, self.tail])

    def _run(self, final: bool) -> np.ndarray:
        out = []
        n = 2 * self.hop
        end = self.base + len(self.buf)
        while True:
            centre = int(round(self.k * self.hop * self.speed))
            lo = max(0, centre - self.tol)
            if lo + n + 2 * self.tol > end or (final and centre >= end - n - 2 * self.tol):
                break
            start = self._best(lo, centre)
            frame = self.buf[start - self.base : start - self.base + n] * self.win
            out.append(self.tail + frame[: self.hop])
            self.tail = frame[self.hop :].copy()
            self.prev_next = self.buf[
                start - self.base + self.hop : start - self.base + self.hop + n
            ].copy()
            self.k += 1
        keep = max(0, int(self.k * self.hop * self.speed) - self.tol - self.base)
        self.buf, self.base = self.buf[keep:], self.base + keep
        return np.concatenate(out) if out else np.zeros(0, np.float32)

    def _best(self, lo: int, centre: int) -> int:
        if self.prev_next is None or len(self.prev_next) < 2 * self.hop:
            return max(0, centre)
        seg = self.buf[lo - self.base : lo - self.base + 2 * self.hop + 2 * self.tol]
        ref = self.prev_next[: self.hop]
        corr = np.correlate(seg[: self.hop + 2 * self.tol], ref, mode="valid")
        return lo + int(np.argmax(corr))
