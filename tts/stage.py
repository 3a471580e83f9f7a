"""The engine-side audio stage: each step's new tokens -> frames -> PCM, batched.

It runs on the engine's own thread (or process) right after ``engine.step()``, on the
engine's device, so the PCM, not the tokens, is what leaves the step loop. Per step: each
audio request's new tokens go through its frame parser; every request with a complete
frame gets a codec slot (``tts.slots``) and all of them decode in one batched codec call
(the same number of new frames share a call: one frame each, normally); a request that
finished flushes its codec tail; a cancelled one releases its slot at once (``release``).
The PCM lands on ``RequestOutput.audio`` as float32 samples at ``codec.sample_rate``.

On CUDA the codec runs on a stream of its own, so its kernels overlap the next engine step
(which async scheduling has already launched) instead of queueing behind it.

This is the one piece issue 50's scheduler needs beside the engine: a stream's frames are
known here as they complete (``frames`` per request), which is where a playback clock
and per-frame deadlines hook in.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import numpy as np
import torch

from tts.codec import StreamingCodec
from tts.layout import FrameLayout, FrameParser
from tts.slots import CodecSlots


@dataclass
class AudioRequest:
    """What makes an engine request an audio one: the stage decodes its tokens. ``seed``
    keys the codec's noise (SNAC) for this stream."""

    seed: int = 0


@dataclass
class _Stream:
    parser: FrameParser
    seed: int
    slot: int | None = None
    frames: int = 0  # frames decoded so far
    pending: list[list[int]] = field(default_factory=list)


class AudioStage:
    def __init__(self, codec: StreamingCodec, layout: FrameLayout, capacity: int) -> None:
        assert layout.codes_per_frame == codec.codes_per_frame, "layout and codec disagree"
        self.codec, self.layout = codec, layout
        dev = codec.device
        self._cuda_stream = torch.cuda.Stream(dev) if dev.type == "cuda" else None
        with self._on_stream():  # the state lives on the stream that uses it
            self.slots = CodecSlots(codec, capacity)
        self.streams: dict[str, _Stream] = {}

    @property
    def sample_rate(self) -> int:
        return self.codec.sample_rate

    @property
    def frame_duration(self) -> float:
        return float(self.codec.frame_duration)

    def open(self, request_id: str, audio: AudioRequest) -> None:
        self.streams[request_id] = _Stream(self.layout.parser(), audio.seed)

    def release(self, request_id: str) -> None:
        """A cancelled stream: free its codec slot without decoding what is left."""
        st = self.streams.pop(request_id, None)
        if st is not None and st.slot is not None:
            self.slots.release(st.slot)

    def release_all(self) -> None:
        for rid in list(self.streams):
            self.release(rid)

    def process(self, outputs: list) -> None:
        """Decode the audio of this step's outputs (``RequestOutput``s) into ``.audio``."""
        mine = [o for o in outputs if o.request_id in self.streams]
        if not mine:
            return
        with self._on_stream():
            pcm = self._decode(mine)
            for out in mine:
                st = self.streams[out.request_id]
                if out.finished:
                    tail = self._finish(out.request_id, st)
                    pcm[out.request_id] = _cat(pcm.get(out.request_id), tail)
                out.audio = pcm.get(out.request_id, np.zeros(0, np.float32))

    def _decode(self, outputs: list) -> dict[str, np.ndarray]:
        groups: dict[int, list[str]] = {}
        for out in outputs:
            st = self.streams[out.request_id]
            st.pending += st.parser.feed(out.new_token_ids)
            if st.pending:
                if st.slot is None:
                    st.slot = self.slots.open(st.seed)
                groups.setdefault(len(st.pending), []).append(out.request_id)
        pcm: dict[str, np.ndarray] = {}
        dev = self.codec.device
        for n, rids in groups.items():
            # in slot order: every slot at once is the pool's own state, no gather/scatter
            rids.sort(key=lambda r: self.streams[r].slot)  # type: ignore[arg-type,return-value]
            sts = [self.streams[r] for r in rids]
            codes = torch.tensor([s.pending for s in sts], dtype=torch.long)  # (B, n, K)
            slots = [s.slot for s in sts if s.slot is not None]
            for rid, st, samples in zip(
                rids, sts, self.slots.step(slots, codes.to(dev, non_blocking=True)), strict=True
            ):
                pcm[rid] = samples
                st.frames += n
                st.pending = []
        return pcm

    def _finish(self, request_id: str, st: _Stream) -> np.ndarray:
        del self.streams[request_id]
        if st.slot is None:
            return np.zeros(0, np.float32)
        return self.slots.close([st.slot])[0]

    def _on_stream(self):
        # the codes come from the host: nothing on the engine's stream to wait for
        if self._cuda_stream is None:
            return contextlib.nullcontext()
        return torch.cuda.stream(self._cuda_stream)


def _cat(a: np.ndarray | None, b: np.ndarray) -> np.ndarray:
    return b if a is None else np.concatenate([a, b])
