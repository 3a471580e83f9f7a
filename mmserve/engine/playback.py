"""An audio stream's playback clock: when each frame must have left for its client.

An audio request names its stream and the stream's audio shape in an :class:`AudioSpec`
(plain data, so it can cross a process boundary). The requests of one stream (the
clauses of one spoken answer, one after another) share one :class:`AudioStream`: the
clock the scheduler serves them against.

The client model (a jitter buffer): the stream's first chunk leaves at ``T0``; the client
starts playing ``buffer_s`` later and then plays ``frame_s`` of audio per frame, so frame
``k`` plays at ``T0 + buffer_s + k * frame_s + stall``. A chunk that leaves after the play
time of its first frame is an underrun: the client falls silent until it arrives, and
``stall`` (its playback delay) grows by the lateness, so later deadlines move with it.
Before its first chunk a stream's deadline is ``arrival + first_audio_s``, its target for
time to first audio.

Times are in seconds on the engine's clock (``time.monotonic`` unless a test drives a
simulated one).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class AudioSpec:
    """What the engine needs to serve a request's tokens as audio frames on time.

    - ``stream_id``: requests with the same id are one stream, spoken in order;
    - ``frame_s``: seconds of audio in one frame; ``tokens_per_frame``: backbone tokens
      that spell one frame (Orpheus 7, the default voice 2, Gepard 1);
    - ``buffer_s``: the client's jitter buffer: it starts playing this long after the
      first audio arrives; ``first_audio_s``: the target for time to first audio;
    - ``first_chunk_frames``: frames in a stream's first chunk (small: fast first audio);
      later chunks grow with the audio the client holds, up to ``max_chunk_frames``;
    - ``last``: no request of this stream follows this one (its reserved share of the
      engine is released as soon as it ends); a stream spoken clause by clause sets it
      on its final clause only, if it knows, else the share lasts while the audio plays.
    """

    stream_id: str
    frame_s: float
    tokens_per_frame: int
    buffer_s: float = 0.2
    first_audio_s: float = 0.15
    first_chunk_frames: int = 1
    max_chunk_frames: int = 8
    last: bool = True

    def __post_init__(self) -> None:
        if not self.stream_id:
            raise ValueError("an audio stream needs a non-empty stream_id")
        if not self.frame_s > 0:
            raise ValueError(f"frame_s must be > 0, got {self.frame_s}")
        if self.tokens_per_frame < 1:
            raise ValueError(f"tokens_per_frame must be >= 1, got {self.tokens_per_frame}")
        if self.buffer_s < 0 or not self.first_audio_s > 0:
            raise ValueError(
                "buffer_s must be >= 0 and first_audio_s > 0, got "
                f"{self.buffer_s} and {self.first_audio_s}"
            )
        if not 1 <= self.first_chunk_frames <= self.max_chunk_frames:
            raise ValueError(
                "need 1 <= first_chunk_frames <= max_chunk_frames, got "
                f"{self.first_chunk_frames} and {self.max_chunk_frames}"
            )

    @property
    def tokens_per_s(self) -> float:
        """Backbone tokens a second of audio takes: the stream's real-time demand."""
        return self.tokens_per_frame / self.frame_s


@dataclass
class AudioStream:
    """One stream's clock as the server sees its client (module docstring)."""

    spec: AudioSpec
    arrival: float
    first_audio_at: float | None = None  # when its first chunk left (None: not yet)
    frames_sent: int = 0
    chunks_sent: int = 0
    stall_s: float = 0.0  # the client's playback delay from underruns so far
    worst_gap_s: float = 0.0  # the longest silence an underrun caused
    live: dict[str, None] = field(default_factory=dict)  # its requests in the engine, in order

    def play_time(self, frame: int) -> float:
        """When the client plays ``frame`` (only once the first audio has left)."""
        assert self.first_audio_at is not None
        sp = self.spec
        return self.first_audio_at + sp.buffer_s + frame * sp.frame_s + self.stall_s

    def deadline(self) -> float:
        """When the next frame to send must leave: its play time, or before any audio,
        the first-audio target."""
        if self.first_audio_at is None:
            return self.arrival + self.spec.first_audio_s
        return self.play_time(self.frames_sent)

    def buffered_s(self, now: float) -> float:
        """Audio the client holds and has not played yet (0 before the first chunk)."""
        if self.first_audio_at is None:
            return 0.0
        start = self.first_audio_at + self.spec.buffer_s + self.stall_s
        return self.play_time(self.frames_sent) - max(now, start)

    def chunk_frames(self, now: float) -> int:
        """Frames the next chunk holds: the first chunk small; then half the audio the
        client holds (a chunk takes no longer to make than half its cushion), bounded."""
        sp = self.spec
        if self.first_audio_at is None:
            return sp.first_chunk_frames
        half = int(self.buffered_s(now) / 2 / sp.frame_s)
        return max(sp.first_chunk_frames, min(sp.max_chunk_frames, half))

    def send(self, frames: int, now: float) -> None:
        """``frames`` frames leave at ``now``; an underrun moves the playback clock."""
        if frames <= 0:
            return
        if self.first_audio_at is None:
            self.first_audio_at = now
        else:
            late = now - self.play_time(self.frames_sent)
            if late > 0:
                self.stall_s += late
                self.worst_gap_s = max(self.worst_gap_s, late)
        self.frames_sent += frames
        self.chunks_sent += 1

    def done_playing(self, now: float) -> bool:
        """Whether the client has played everything sent (it needs nothing more now)."""
        return self.first_audio_at is None or now >= self.play_time(self.frames_sent)
