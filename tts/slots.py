"""A fixed pool of codec stream states, so many streams decode in one batched call.

The engine side of speech keeps one ``CodecSlots`` per codec: a stream takes a slot when
its first frame arrives, any subset of slots is decoded together each engine step (the
rows gathered from the pool, run, and written back), and a slot is flushed when its
stream ends or released at once when it is cancelled. Slots are rows of one
``CodecState`` allocated once (``capacity`` rows); nothing grows per frame.
"""

from __future__ import annotations

import numpy as np
import torch

from tts.codec import StreamingCodec


class SlotsFullError(RuntimeError):
    """Every slot is taken (more streams than the pool was sized for)."""


class CodecSlots:
    def __init__(self, codec: StreamingCodec, capacity: int) -> None:
        self.codec = codec
        self.capacity = capacity
        self.state = codec.init_state(capacity)
        self._free = list(range(capacity - 1, -1, -1))

    @property
    def num_free(self) -> int:
        return len(self._free)

    def open(self, seed: int = 0) -> int:
        """A fresh slot for a new stream whose noise (if any) is keyed by ``seed``."""
        if not self._free:
            raise SlotsFullError(f"all {self.capacity} codec slots are in use")
        slot = self._free.pop()
        self.state.reset([slot], [seed])
        return slot

    def step(self, slots: list[int], codes: torch.Tensor) -> list[np.ndarray]:
        """Decode (len(slots), n, K) new frames, one row a slot -> each slot's new PCM."""
        if not slots:
            return []
        whole = slots == list(range(self.capacity))
        sub = self.state if whole else self.state.select(slots)
        block = self.codec.step(codes, sub)
        if not whole:
            self.state.put(slots, sub)
        return block.rows()

    def close(self, slots: list[int]) -> list[np.ndarray]:
        """End the streams in ``slots`` -> each one's last samples; the slots are free."""
        if not slots:
            return []
        tails = self.codec.flush(self.state.select(slots)).rows()
        for s in slots:
            self.release(s)
        return tails

    def release(self, slot: int) -> None:
        """Free ``slot`` without decoding what is left (a cancelled stream)."""
        assert slot not in self._free, f"slot {slot} is already free"
        self._free.append(slot)
