"""The engine-side audio stage: each step's new tokens -> frames -> PCM, batched.

It runs on the engine's own thread (or process) right after ``engine.step()``, on the
engine's device, so the PCM, not the tokens, is what leaves the step loop. Per step: each
audio request's new tokens go through its frame parser and its completed frames are held
until a chunk is due (``tts.chunking``: the first frame at once, later ones grouped up to
``max_chunk_s`` of audio, so one codec call decodes several frames); a stream takes a codec
slot (``tts.slots``) with its first frame. When any stream's chunk is due, every stream
holding frames decodes too, those holding the same number in one batched call. A request
that finished decodes what it holds and flushes its codec tail; a cancelled one releases
its slot at once (``release``). The PCM lands on ``RequestOutput.audio`` as float32
samples at ``codec.sample_rate``; the samples do not depend on the grouping (the codec's
streaming contract).

On CUDA the codec runs on a stream of its own, so its kernels overlap the next engine step
(which async scheduling has already launched) instead of queueing behind it, and a call of
up to one chunk's frames replays a CUDA graph recorded at start-up (``tts.slots``).

This is the one piece issue 50's scheduler needs beside the engine: a stream's frames are
known here as they complete (``frames`` decoded and ``pending`` held per request), which
is where a playback clock and per-frame deadlines hook in.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

from tts.chunking import DEFAULT_MAX_CHUNK_S, ChunkPolicy, played_until
from tts.codec import StreamingCodec
from tts.layout import FrameLayout, FrameParser
from tts.slots import CodecSlots


@dataclass
class AudioRequest:
    """What makes an engine request an audio one: the stage decodes its tokens. ``seed``
    keys the codec's noise (SNAC) for this stream; ``paced``: the engine releases its
    tokens in chunks on a playback clock (an ``AudioSpec``), so the stage decodes what
    arrives at once instead of grouping frames itself."""

    seed: int = 0
    paced: bool = False


@dataclass
class _Stream:
    parser: FrameParser
    seed: int
    paced: bool
    slot: int | None = None
    frames: int = 0  # frames decoded so far
    pending: list[list[int]] = field(default_factory=list)  # complete frames held
    play_end: float | None = None  # when its client has played all it was sent


class AudioStage:
    def __init__(
        self,
        codec: StreamingCodec,
        layout: FrameLayout,
        capacity: int,
        max_chunk_s: float = DEFAULT_MAX_CHUNK_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``max_chunk_s``: the most audio a later chunk of a stream holds (0: every frame
        decodes as it completes); ``clock``: the stage's time (a test's may be simulated)."""
        assert layout.codes_per_frame == codec.codes_per_frame, "layout and codec disagree"
        self.codec, self.layout = codec, layout
        self.policy = ChunkPolicy.for_seconds(max_chunk_s, float(codec.frame_duration), clock)
        dev = codec.device
        self._cuda_stream = torch.cuda.Stream(dev) if dev.type == "cuda" else None
        with self._on_stream():  # the state lives on the stream that uses it
            # a call holds at most one chunk's frames unless a paced release sends more
            self.slots = CodecSlots(codec, capacity, self.policy.max_chunk_frames)
        self.streams: dict[str, _Stream] = {}

    @property
    def sample_rate(self) -> int:
        return self.codec.sample_rate

    @property
    def frame_duration(self) -> float:
        return float(self.codec.frame_duration)

    def open(self, request_id: str, audio: AudioRequest) -> None:
        self.streams[request_id] = _Stream(self.layout.parser(), audio.seed, audio.paced)

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
        now = self.policy.tick()
        with self._on_stream():
            pcm = self._decode(mine, now)
            for out in mine:
                st = self.streams[out.request_id]
                if out.finished:
                    tail = self._finish(out.request_id, st)
                    pcm[out.request_id] = _cat(pcm.get(out.request_id), tail)
                out.audio = pcm.get(out.request_id, np.zeros(0, np.float32))

    def _decode(self, outputs: list, now: float) -> dict[str, np.ndarray]:
        groups: dict[int, list[str]] = {}  # frames held -> the streams holding that many
        due = False
        for out in outputs:
            st = self.streams[out.request_id]
            st.pending += st.parser.feed(out.new_token_ids)
            if not st.pending:
                continue
            if st.slot is None:
                st.slot = self.slots.open(st.seed)
            n = len(st.pending)
            groups.setdefault(n, []).append(out.request_id)
            due = due or out.finished or st.paced
            due = due or self.policy.due(n, st.frames, st.play_end, now)
        pcm: dict[str, np.ndarray] = {}
        if due:  # everyone holding frames goes along: streams fall into step (tts.chunking)
            for n, rids in sorted(groups.items()):
                pcm.update(self._decode_group(rids, n, now))
        return pcm

    def _decode_group(self, rids: list[str], n: int, now: float) -> dict[str, np.ndarray]:
        """One batched codec call for streams holding ``n`` frames each."""
        # in slot order: every slot at once is the pool's own state, no gather/scatter
        rids.sort(key=lambda r: self.streams[r].slot)  # type: ignore[arg-type,return-value]
        sts = [self.streams[r] for r in rids]
        codes = torch.tensor([s.pending for s in sts], dtype=torch.long)  # (B, n, K)
        slots = [s.slot for s in sts if s.slot is not None]
        dev = self.codec.device
        pcm: dict[str, np.ndarray] = {}
        for rid, st, samples in zip(
            rids, sts, self.slots.step(slots, codes.to(dev, non_blocking=True)), strict=True
        ):
            pcm[rid] = samples
            st.frames += n
            st.pending = []
            if len(samples):
                st.play_end = played_until(st.play_end, now, len(samples) / self.sample_rate)
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
