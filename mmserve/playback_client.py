"""A simulated listener: a jitter buffer that plays the audio chunks of a stream as they
arrive (``mmserve bench voice`` and the server's audio metrics).

A stream's client starts playing ``buffer_s`` after its first audio arrives and plays
continuously; a chunk that arrives after the moment its first frame should play leaves
the client silent until it comes (an underrun), and playback resumes from there. This
is the client's own bookkeeping, written apart from the engine's playback clock, so the
benchmark measures the engine against it rather than against itself.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class StreamLog:
    """What one stream's client saw: chunks as (arrival time, seconds of audio)."""

    arrival: float
    chunks: list[tuple[float, float]] = field(default_factory=list)
    finish: str | None = None

    @property
    def refused(self) -> bool:
        return self.finish == "overloaded"

    @property
    def audio_s(self) -> float:
        return sum(s for _, s in self.chunks)


@dataclass(frozen=True)
class Playback:
    """A stream's playback as its client heard it."""

    ttfa_s: float  # arrival -> first audio
    worst_gap_s: float  # the longest silence after playback began
    silence_s: float  # all silences together
    rtf: float  # (last audio - arrival) / seconds of audio: generation's real-time factor


def play(log: StreamLog, buffer_s: float) -> Playback | None:
    """The client's playback of ``log`` (None: no audio arrived)."""
    if not log.chunks:
        return None
    first = log.chunks[0][0]
    cursor, worst, silence = first + buffer_s, 0.0, 0.0
    for t, seconds in log.chunks:
        if t > cursor:
            worst, silence = max(worst, t - cursor), silence + t - cursor
            cursor = t
        cursor += seconds
    audio = log.audio_s
    rtf = (log.chunks[-1][0] - log.arrival) / audio if audio > 0 else float("inf")
    return Playback(first - log.arrival, worst, silence, rtf)
