"""Audio streams served against their playback deadlines: the scheduler's audio policy.

The scheduler asks this policy, each step, in what order to take running and waiting
requests, which running ones skip the step, and whether a waiting one may start; the
engine asks it whether an audio request's new tokens leave now (a chunk is complete) and
tells it what each step cost. Requests without an ``AudioSpec`` (text) are left in their
order; they get whatever budget and sequence slots audio leaves.

Mode ``deadline``:

- *Earliest deadline first.* Running audio requests are ordered by laxity: the deadline
  of the chunk they are making (``AudioStream.deadline``) less the steps its remaining
  tokens take. At most ``window`` of them run in a step; text follows.
- *Text in the time left.* Text requests run after audio; while an audio stream is close
  to its deadline, a text prompt's chunk is cut to the tokens the step can take without
  making it late (its laxity over the fitted cost of a prompt token; at least
  ``MIN_TEXT_TOKENS``, so text always moves).
- *Lead cap.* A stream whose laxity exceeds ``lead_s`` (its client holds more audio
  than it needs) skips the step: steps stay small, so chunks that are due, and first
  chunks, come sooner.
- *Admission control.* A new stream starts only if no stream is admitted (there is
  nobody to protect, however slow the machine), or if, with it, every admitted stream can
  still play in real time: the smallest ``m <= window`` rows whose step (plus the text
  rows running) carries the streams' total demand, ``m / t(m + text) >= demand /
  headroom``, also gives each stream one token often enough (``1 / t >= max rate /
  headroom``); ``t`` is :class:`StepCost`'s fit. Otherwise it waits, earliest first-audio
  target first, and is refused (finish reason ``overloaded``) once that target is
  ``queue_s`` behind it. Playing streams are never starved for a newcomer; text waiting
  behind a stream that must wait is not held by it (``Scheduler._next_admitted``).

Mode ``fifo`` (the baseline the benchmark compares against): arrival order, every running
request in every step, everyone admitted that slots and memory allow.

Both modes release an audio request's tokens in chunks (``AudioStream.chunk_frames``:
the first small, later ones larger) and keep the clock, so time to first audio and
underruns are comparable. The requests of one stream run one at a time, in the order
they came (a stream's next clause may be queued before the last one ends).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING

from mmserve.engine.playback import AudioSpec, AudioStream
from mmserve.engine.step_cost import StepCost

if TYPE_CHECKING:
    from mmserve.engine.request import Request

SCHEDULING_MODES = ("deadline", "fifo")
MIN_TEXT_TOKENS = 16  # a text prompt's chunk is never cut below this
_EPS = 1e-6  # seconds: a stream skips a step only if it is clearly ahead (no float ties)


class AudioPolicy:
    def __init__(
        self,
        mode: str = "deadline",
        window: int = 256,
        lead_s: float = 1.0,
        queue_s: float = 1.0,
        headroom: float = 0.85,
        admit_per_step: int = 8,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if mode not in SCHEDULING_MODES:
            raise ValueError(f"audio scheduling must be one of {SCHEDULING_MODES}, got {mode!r}")
        self.mode, self.window, self.lead_s, self.queue_s = mode, window, lead_s, queue_s
        self.headroom, self.admit_per_step = headroom, admit_per_step
        self.clock = clock
        self.cost = StepCost()
        self.streams: dict[str, AudioStream] = {}
        self.admitted: set[str] = set()  # streams whose demand is reserved
        self.refused_total = 0
        self._skip: set[str] = set()  # request ids skipping this step
        self._step_rows = 1
        self._admits_left = 0
        self._text_rows = 0
        self._text_tokens = float("inf")  # prompt tokens text may still take this step
        self._begin: float | None = None
        self._prev_end: float | None = None

    @property
    def deadline(self) -> bool:
        return self.mode == "deadline"

    # -- requests ----------------------------------------------------------------------
    def attach(self, req: Request) -> None:
        """A new request: join (or start) its stream."""
        spec: AudioSpec = req.audio  # type: ignore[assignment]
        st = self.streams.get(spec.stream_id)
        if st is None:
            st = self.streams[spec.stream_id] = AudioStream(spec, self.clock())
        st.live[req.request_id] = None
        req.playback = st

    def detach(self, req: Request, aborted: bool = False) -> None:
        """A request finished or was aborted; a stream with nothing live and nothing
        left to play is dropped (and its reserved demand with it), as is one whose last
        request ended or whose requests were all aborted (its listener stopped)."""
        st = req.playback
        if st is None:
            return
        st.live.pop(req.request_id, None)
        if not st.live and req.audio is not None and (req.audio.last or aborted):
            self.streams.pop(req.audio.stream_id, None)
            self.admitted.discard(req.audio.stream_id)
        self._sweep(self.clock())

    def _sweep(self, now: float) -> None:
        for sid, st in list(self.streams.items()):
            if not st.live and st.done_playing(now):
                del self.streams[sid]
                self.admitted.discard(sid)

    def _turn(self, req: Request) -> bool:
        """Whether it is ``req``'s turn in its stream (earlier requests of it are done)."""
        st = req.playback
        return st is None or next(iter(st.live)) == req.request_id

    # -- the step ----------------------------------------------------------------------
    def begin_step(self, running: list[Request], waiting: deque[Request]) -> list[Request]:
        """Order ``running`` and ``waiting`` in place for this step and choose who skips it;
        -> the waiting requests refused now (removed from ``waiting``)."""
        now = self.clock()
        if self._begin is None:
            self._begin = now
        self._skip = set()
        self._text_tokens = float("inf")
        if not self.streams:
            return []
        self._sweep(now)
        refused = [r for r in waiting if self._refuse(r, now)]
        for r in refused:
            waiting.remove(r)
        self.refused_total += len({r.audio.stream_id for r in refused})  # type: ignore[union-attr]
        if not self.deadline:
            _sort(waiting, lambda r: not self._turn(r))
            return refused
        t_step = self.cost.predict(self._step_rows) if self.cost.ready else 0.0
        lax = {r.request_id: self._laxity(r, now, t_step) for r in running}
        running.sort(key=lambda r: lax[r.request_id])
        audio = [r for r in running if r.audio is not None]
        for i, r in enumerate(audio):
            if i >= self.window or lax[r.request_id] - self.lead_s > now + _EPS:
                self._skip.add(r.request_id)
        self._text_rows = len(running) - len(audio)
        _sort(waiting, lambda r: self._waiting_key(r, now, t_step))
        self._admits_left = self.admit_per_step
        due = [lax[r.request_id] for r in audio if r.request_id not in self._skip]
        due += [
            self._laxity(r, now, t_step) for r in waiting if r.audio is not None and self._turn(r)
        ]
        self._text_tokens = self._text_room(min(due, default=float("inf")) - now)
        return refused

    def _text_room(self, slack: float) -> float:
        """Prompt tokens of text a step may hold when the most urgent audio has ``slack``
        seconds to spare."""
        per_token = self.cost.coef()[2] if self.cost.ready else 0.0
        if slack == float("inf") or per_token <= 0:
            return float("inf")
        return max(MIN_TEXT_TOKENS, slack / per_token)

    def chunk(self, req: Request, n: int) -> int:
        """``n`` tokens of ``req``'s pending prompt, cut to the text room left this step
        (audio requests and decodes are never cut)."""
        if n <= 1 or self._text_tokens == float("inf") or req.audio is not None:
            return n
        take = int(min(n, self._text_tokens))
        self._text_tokens -= take
        return take

    def _laxity(self, req: Request, now: float, t_step: float) -> float:
        """When ``req`` must run at the latest to finish its chunk by the deadline (text:
        after every audio request, in its current order)."""
        st = req.playback
        if st is None:
            return float("inf")
        sp = st.spec
        held = len(req.output_ids) - req.sent_tokens
        need = max(1, st.chunk_frames(now) * sp.tokens_per_frame - held)
        return st.deadline() - need * t_step

    def _waiting_key(self, req: Request, now: float, t_step: float) -> tuple[int, float]:
        if req.audio is None:
            return (2, 0.0)
        if not self._turn(req):
            return (3, 0.0)
        known = req.audio.stream_id in self.admitted
        return (0 if known else 1, self._laxity(req, now, t_step))

    def _refuse(self, req: Request, now: float) -> bool:
        st = req.playback
        if not self.deadline or st is None or st.spec.stream_id in self.admitted:
            return False
        return now >= st.deadline() + self.queue_s  # ``next_wake`` wakes at it

    def skips(self, req: Request) -> bool:
        return req.request_id in self._skip

    def admits(self, req: Request) -> bool:
        """May waiting ``req`` start now? (Called in ``waiting``'s order; a False for audio
        ends the step's audio admissions, one for text ends all of them, so requests that
        must wait are sorted last.)"""
        if not self.streams or req.audio is None:  # (no streams: no audio request at all)
            return self._text_tokens >= 1
        if not self._turn(req):
            return False
        sid = req.audio.stream_id
        if not self.deadline or sid in self.admitted:
            self.admitted.add(sid)
            return True
        if self.admitted and (self._admits_left <= 0 or not self._fits(req.audio)):
            return False  # (with no stream playing there is nobody to protect: admit)
        self._admits_left -= 1
        self.admitted.add(sid)
        return True

    def _fits(self, new: AudioSpec) -> bool:
        """Whether the admitted streams plus ``new`` can all play in real time."""
        if not self.cost.ready:
            return True
        specs = [self.streams[s].spec for s in self.admitted if s in self.streams] + [new]
        demand = sum(s.tokens_per_s for s in specs) / self.headroom
        fastest = max(s.tokens_per_s for s in specs) / self.headroom
        for m in range(1, self.window + 1):
            t = self.cost.predict(m + self._text_rows)
            if m >= t * demand:
                return t * fastest <= 1.0
        return False

    def end_step(self, rows: int, tokens: int, busy: bool) -> None:
        """The engine ran a step of ``rows`` sequences and ``tokens`` tokens; ``busy``:
        it still has work. The time recorded is the whole period since the last step
        ended while the engine was busy (whatever else its thread did in between: a
        shared loop's other engine, delivering outputs), else since this step began."""
        now = self.clock()
        start = self._prev_end if self._prev_end is not None else self._begin
        if start is not None:
            self.cost.record(rows, tokens, now - start)
        self._step_rows = max(1, rows)
        self._begin, self._prev_end = None, (now if busy else None)

    def idle(self) -> None:
        """The engine had nothing to run: the next step's time starts afresh."""
        self._begin = self._prev_end = None

    def forget_costs(self) -> None:
        """Drop the step-cost fit: the steps so far (warm-up) each paid a one-off compile,
        so they say nothing of a serving step's cost. Kept, its steps of many rows (the
        only ones until a load brings as many) would fix the fit's per-row slope at a
        compile's cost, and admission would refuse streams the machine can play."""
        self.cost = StepCost()
        self.idle()

    # -- output ------------------------------------------------------------------------
    def releases(self, req: Request) -> bool:
        """Whether ``req``'s new tokens leave this step (a chunk is complete, or the
        request ended); records the send on its stream's clock."""
        st = req.playback
        if st is None:
            return True
        now = self.clock()
        tpf = st.spec.tokens_per_frame
        held = len(req.output_ids) - req.sent_tokens
        if req.finished:
            st.send(-(-held // tpf), now)
            return True
        frames = held // tpf
        if frames < st.chunk_frames(now):
            return False
        st.send(frames, now)
        return True

    def steady(self) -> bool:
        """Whether the next step may simply run this step's rows again (launch-ahead):
        nobody skipped this one."""
        return not self._skip

    def next_wake(
        self, now: float, running: list[Request], waiting: deque[Request]
    ) -> float | None:
        """When something skipped or queued may need to run (None: nothing is waiting on
        the clock)."""
        if not self.deadline:
            return None
        t_step = self.cost.predict(self._step_rows) if self.cost.ready else 0.0
        times = [
            self._laxity(r, now, t_step) - self.lead_s
            for r in running
            if r.request_id in self._skip
        ]
        times += [
            r.playback.deadline() + self.queue_s
            for r in waiting
            if r.playback is not None and r.playback.spec.stream_id not in self.admitted
        ]
        return min(times) if times else None

    def stats(self) -> dict:
        return {
            "audio_streams_active": len(self.streams),
            "audio_streams_refused_total": self.refused_total,
        }


def _sort(items: deque[Request], key: Callable[[Request], object]) -> None:
    """Sort a deque in place (stably)."""
    ordered = sorted(items, key=key)  # type: ignore[arg-type]
    items.clear()
    items.extend(ordered)
