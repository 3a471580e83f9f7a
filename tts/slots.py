"""A fixed pool of codec stream states, so many streams decode in one batched call.

The engine side of speech keeps one ``CodecSlots`` per codec: a stream takes a slot when
its first frame arrives, any subset of slots is decoded together each engine step (the
rows gathered from the pool, run, and written back), and a slot is flushed when its
stream ends or released at once when it is cancelled. Slots are rows of one
``CodecState`` allocated once (``capacity`` rows); nothing grows per frame.

Recorded steps: a codec with ``step_rows`` (the device half of a step over every slot,
writing only the kept rows' state in place) runs a call of up to ``recorded_frames``
frames as one fixed-shape pass over the whole pool: the call's codes and a keep mask are
written into static tensors and the pass replays a CUDA graph recorded at start-up (one
per frame count), instead of the few dozen kernel launches of an eager step, whose host
cost is what a small codec's call is made of. The pool's state tensors then never move
(every write to them is in place). Off CUDA the pass is off by default (it would only add
idle rows' work); the tests run it eagerly there against the gather/scatter path.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from tts.codec import PCMBlock, StreamingCodec


class SlotsFullError(RuntimeError):
    """Every slot is taken (more streams than the pool was sized for)."""


@dataclass
class _Pass:
    """One frame count's whole-pool pass: its static codes in, its PCM out."""

    codes: torch.Tensor  # (capacity, n, K)
    pcm: torch.Tensor | None = None  # (capacity, n * frame_samples), the graph's output
    graph: torch.cuda.CUDAGraph | None = None


class CodecSlots:
    def __init__(
        self,
        codec: StreamingCodec,
        capacity: int,
        recorded_frames: int = 0,
        whole_pool: bool | None = None,
    ) -> None:
        """``recorded_frames``: calls of 1 to this many frames take the whole-pool pass
        (0: none; only for codecs with ``step_rows``); ``whole_pool``: whether they do
        (default: on CUDA, where the pass is recorded as a graph; elsewhere it would only
        compute idle slots, so the tests turn it on to hold it against the other path)."""
        self.codec = codec
        self.capacity = capacity
        self.state = codec.init_state(capacity)
        self._free = list(range(capacity - 1, -1, -1))
        self._passes: dict[int, _Pass] = {}
        # (codes, keep, state) -> PCM of every row; only codecs that define it
        self._step_rows: Callable[..., torch.Tensor] | None = getattr(codec, "step_rows", None)
        dev = codec.device
        if whole_pool is None:
            whole_pool = dev.type == "cuda"
        if recorded_frames and whole_pool and self._step_rows is not None:
            self._keep = torch.zeros(capacity, dtype=torch.bool, device=dev)
            for n in range(1, recorded_frames + 1):
                shape = (capacity, n, codec.codes_per_frame)
                self._passes[n] = _Pass(torch.zeros(shape, dtype=torch.long, device=dev))
            if dev.type == "cuda":
                self._record()

    def _record(self) -> None:
        """One graph a frame count, in one memory pool (the calls never overlap), each
        replayed once. The keep mask is all False here, so no slot's state changes."""
        step_rows = self._step_rows
        assert step_rows is not None
        pool = torch.cuda.graph_pool_handle()
        side = torch.cuda.Stream(self.codec.device)
        side.wait_stream(torch.cuda.current_stream())
        with torch.inference_mode():
            for p in self._passes.values():
                with torch.cuda.stream(side):  # cuDNN / cuFFT plans before recording
                    step_rows(p.codes, self._keep, self.state)
                torch.cuda.current_stream().wait_stream(side)
                p.graph = torch.cuda.CUDAGraph()
                # thread-local: another engine's thread may launch work meanwhile
                with torch.cuda.graph(p.graph, pool=pool, capture_error_mode="thread_local"):
                    p.pcm = step_rows(p.codes, self._keep, self.state)
                p.graph.replay()  # its first replay's upload here, not on a stream's first audio
        torch.cuda.current_stream().wait_stream(side)

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
        n = codes.shape[1]
        p = self._passes.get(n)
        if p is not None:
            return self._pass(p, slots, codes)
        whole = slots == list(range(self.capacity)) and not self._passes  # buffers may move
        sub = self.state if whole else self.state.select(slots)
        block = self.codec.step(codes, sub)
        if not whole:
            self.state.put(slots, sub)
        return block.rows()

    def _pass(self, p: _Pass, slots: list[int], codes: torch.Tensor) -> list[np.ndarray]:
        self.codec.check_codes(codes)
        step_rows = self._step_rows
        assert step_rows is not None
        idx = torch.tensor(slots, dtype=torch.long).to(self._keep.device, non_blocking=True)
        with torch.inference_mode():
            p.codes.index_copy_(0, idx, codes.to(p.codes.device))
            self._keep.zero_()
            self._keep.index_fill_(0, idx, True)
            if p.graph is not None:
                p.graph.replay()
                pcm = p.pcm
            else:
                pcm = step_rows(p.codes, self._keep, self.state)
            assert pcm is not None
            rows = pcm.index_select(0, idx)
        codec = self.codec
        lo_hi = self.state.advance(codes.shape[1], codec.frame_samples, codec.delay_samples, slots)
        return PCMBlock(rows, *lo_hi).rows()

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
