"""When the audio stage decodes a stream's frames: the first at once, later ones grouped.

A codec call costs mostly a fixed overhead (kernel launches on a GPU, per-op dispatch on
a CPU) and little per frame, so decoding one frame a call per step spends most of the
stage's time on overhead. The stage therefore holds a stream's completed frames and
decodes them ``K`` at a time, with these rules for a stream the engine does not pace:

- its first chunk is one frame, decoded in the step that completes it (time to first
  audio is unchanged by grouping);
- a later chunk is due once the frames held reach ``target(sent)`` =
  ``min(max_chunk_frames, max(1, sent))``, ``sent`` being the frames decoded so far: chunks
  of 1, 1, 2, 4, 8, ... frames up to the cap, so a chunk is never longer than the audio
  already sent;
- it is due at once, whatever it holds, while its client (the model below) holds less
  than ``2 * interval`` of unplayed audio, ``interval`` being the time between the
  stage's last two calls: waiting one more step could let the client run dry;
- a finishing stream decodes what it holds, then flushes.

When one stream is due, every stream holding frames decodes with it (one batched call per
distinct number of frames held; a codec call takes one ``n`` for all its rows). Streams that
arrived at different times thereby fall into step after one such call, so the codec calls
a step needs do not grow with the number of streams; a stream only ever decodes earlier
than its own rule asks, which the argument below allows.

Why grouping never makes a stream stutter. The client model: playback starts when the
first chunk leaves the stage and plays on while it has audio. Grouping delays a frame by
at most ``K - 1`` frames of generation behind the step that made it. Let ``f`` be a
frame's duration and ``r`` the stream's cost per frame over ``f`` (backbone steps and
codec calls; its RTF), frame ``i`` complete at ``g_0 + i * r * f``. The chunk starting at
frame ``m >= 1`` holds at most ``m`` frames, so it leaves by ``g_0 + (2m - 1) * r * f``,
and the client plays its first frame no sooner than ``g_0 + m * f``: it is in time for
every ``m`` whenever ``r <= 1/2`` (the GPU's RTF is 0.1-0.2). Between ``1/2`` and ``1``,
and under step-time jitter, the buffer rule releases the frames held while the client
still holds two stage intervals of audio. A client that is already dry (the stream's
generation alone is slower than real time) gets no early release: its silence is then
the generation's, and fewer codec calls only shorten it.

Frames held this way wait only for steps that give the stream an output: a stream that
sits out steps (preempted) releases them at its next output.

Requests paced by the engine (an ``AudioSpec``: the deadline policy releases their tokens
in chunks on its own playback clock) are decoded as they arrive: the engine already
chose their chunks.
"""

from __future__ import annotations

import time
from collections.abc import Callable

DEFAULT_MAX_CHUNK_S = 0.32  # later chunks hold up to this much audio (16 default-voice frames)


class ChunkPolicy:
    """The grouping rules above for one audio stage; times in seconds on ``clock``."""

    def __init__(
        self,
        max_chunk_frames: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        assert max_chunk_frames >= 1, max_chunk_frames
        self.max_chunk_frames, self.clock = max_chunk_frames, clock
        self.interval = 0.0  # between the stage's last two calls
        self._last: float | None = None

    @classmethod
    def for_seconds(
        cls, max_chunk_s: float, frame_s: float, clock: Callable[[], float] = time.monotonic
    ) -> ChunkPolicy:
        """Chunks of up to ``max_chunk_s`` of audio (at least one frame of ``frame_s``)."""
        return cls(max(1, round(max_chunk_s / frame_s)), clock)

    def tick(self) -> float:
        """The stage's call starts: the time now (also measures ``interval``)."""
        now = self.clock()
        if self._last is not None:
            self.interval = now - self._last
        self._last = now
        return now

    def target(self, sent: int) -> int:
        """Frames a chunk waits for after ``sent`` frames were decoded."""
        return min(self.max_chunk_frames, max(1, sent))

    def due(self, held: int, sent: int, play_end: float | None, now: float) -> bool:
        """Whether a stream holding ``held`` frames decodes them now; ``play_end``: when its
        client has played all it was sent (None: nothing sent yet)."""
        if held == 0:
            return False
        if play_end is None or held >= self.target(sent):
            return True
        return 0.0 < play_end - now < 2.0 * self.interval


def played_until(play_end: float | None, now: float, seconds: float) -> float:
    """The client's new ``play_end`` once ``seconds`` of audio leave at ``now`` (a dry
    client restarts from ``now``)."""
    return max(play_end if play_end is not None else now, now) + seconds
