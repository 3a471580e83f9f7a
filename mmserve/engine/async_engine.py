"""The engine on a background thread, with one asyncio stream per request.

The asyncio side never touches the model or the scheduler: it validates a
request, checks the queue bound, and posts commands to an inbox; the engine
thread drains the inbox between steps, runs the step, and hands each output to
its request's asyncio queue with ``call_soon_threadsafe``. A consumer that stops
iterating (client disconnect, task cancelled) aborts its request, whose blocks
are freed before the next step.

An optional output stage (``OutputStage``; speech's ``tts.stage.AudioStage``) runs on the
engine thread after each step, on the engine's device: it turns the step's tokens into
what the request streams (PCM), so that, not the tokens, leaves the loop. A request
carries a payload for it (``generate(..., stage_request=...)``); an aborted request's
stage state is released with its blocks.

Engines can share one loop (``AsyncEngine(voice, ..., share_loop_with=text)``): the LLM
and the voice that speaks its answers then step in turn on one thread, one process, one
GPU, the guest (the voice, whose audio has deadlines) first in every round, and a loop
that has nothing to run sleeps until the earliest audio deadline or the next request. The
voice's step cost then counts the whole round, the LLM's step included, so its admission
control sees the rate at which it really gets steps.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any, Protocol

from mmserve.config import EngineConfig
from mmserve.engine.engine import LLMEngine
from mmserve.engine.factory import create_engine, model_name
from mmserve.engine.outputs import EngineStats, RequestOutput, coalesce
from mmserve.engine.playback import AudioSpec
from mmserve.engine.request import EmbeddingSpan
from mmserve.errors import EngineDeadError, QueueFullError
from mmserve.procname import name_this_thread
from mmserve.sampling_params import SamplingParams

log = logging.getLogger(__name__)


class OutputStage(Protocol):
    """Per-request post-processing on the engine thread (see the module docstring)."""

    def open(self, request_id: str, payload: Any) -> None: ...

    def process(self, outputs: list[RequestOutput]) -> None: ...

    def release(self, request_id: str) -> None: ...


class AsyncEngine:
    def __init__(
        self,
        engine: LLMEngine,
        name: str,
        stage: OutputStage | None = None,
        share_loop_with: AsyncEngine | None = None,
    ) -> None:
        self.engine, self.model_name, self.stage = engine, name, stage
        self.tokenizer = engine.tokenizer
        self.max_model_len = engine.max_model_len
        self.max_waiting = engine.config.max_waiting
        # the CPU half of the served vision connector (None: text only)
        self.image_processor = engine.connector.processor if engine.connector else None
        self._inbox: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
        self._pending_adds = 0  # adds posted but not yet seen by the engine thread
        self._count_lock = threading.Lock()
        self._streams: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Queue]] = {}
        self._stopping = False
        self._cancel_requested = False  # end every request in flight at the next round
        self.cancelled_at_shutdown = 0  # requests ended by cancel_in_flight or the stop
        self._dead: BaseException | None = None  # why the loop ended, if it did unasked
        self._step_since: float | None = None  # monotonic start of the step running now
        self._guests: list[AsyncEngine] = []  # engines stepped by this one's loop
        self._host = share_loop_with
        self._wake: threading.Event
        self._thread: threading.Thread
        if share_loop_with is not None:  # step on the host's thread, woken by its event
            self._wake, self._thread = share_loop_with._wake, share_loop_with._thread
            share_loop_with._guests.append(self)
            return
        self._wake = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="mmserve-engine", daemon=True)
        self._thread.start()

    @classmethod
    def from_config(cls, config: EngineConfig) -> AsyncEngine:
        return cls(create_engine(config), model_name(config))

    # -- asyncio side ----------------------------------------------------------------
    async def generate(
        self,
        prompt_token_ids: list[int],
        params: SamplingParams,
        request_id: str | None = None,
        spans: list[EmbeddingSpan] | None = None,
        stage_request: Any = None,
        audio: AudioSpec | None = None,
    ) -> AsyncIterator[RequestOutput]:
        """Stream ``RequestOutput`` deltas; ``audio`` makes it an audio stream's request
        (served by its playback deadline, released in chunks)."""
        rid = request_id or f"req-{uuid.uuid4().hex}"
        if not self.alive():
            raise EngineDeadError(f"the engine has stopped ({self._dead!r}); restart the server")
        if stage_request is not None and self.stage is None:
            raise ValueError("this engine has no output stage for a stage request")
        self.engine._validate(list(prompt_token_ids), params, rid, spans or [])
        waiting = len(self.engine.scheduler.waiting) + self._pending_adds
        if waiting >= self.engine.config.max_waiting:
            raise QueueFullError(f"the waiting queue is full ({waiting} requests); retry later")
        stream: asyncio.Queue = asyncio.Queue()
        self._streams[rid] = (asyncio.get_running_loop(), stream)
        with self._count_lock:
            self._pending_adds += 1
        self._post("add", (list(prompt_token_ids), params, rid, spans, stage_request, audio))
        done = False
        held: BaseException | None = None  # met while coalescing: raised after the delta
        try:
            while True:
                item = held or await stream.get()
                if isinstance(item, BaseException):
                    done = True
                    raise item
                if self.stage is None:  # a stage's deltas carry per-step audio
                    item, held = _coalesced(item, stream)
                done = item.finished
                yield item
                if done:
                    return
        finally:
            self._streams.pop(rid, None)
            if not done:
                self._post("abort", rid)

    async def abort(self, request_id: str) -> None:
        self._post("abort", request_id)

    def stats(self) -> EngineStats:
        return self.engine.stats()

    async def refresh(self) -> None:
        """Nothing to fetch: ``stats()`` reads the engine itself (a ``RemoteEngine``, whose
        engine is in another process, fetches its counters here)."""

    def alive(self) -> bool:
        host = self._host or self
        return self._dead is None and host._dead is None and self._thread.is_alive()

    def step_seconds(self) -> float:
        """How long the step running now has run (0.0 between steps): a step that never
        ends means a stuck engine (``/health`` says so past ``engine_stall_timeout_s``)."""
        since = self._step_since
        return 0.0 if since is None else time.monotonic() - since

    def cancel_in_flight(self) -> None:
        """End every request in flight (a graceful shutdown's grace has run out): each
        stream's last item is an ``EngineDeadError`` saying the server is shutting down,
        and the requests' blocks are freed before the next step. Thread-safe."""
        (self._host or self)._cancel_requested = True  # for every engine on the loop
        self._wake.set()

    async def shutdown(self) -> None:
        await asyncio.to_thread(self.shutdown_sync)

    def shutdown_sync(self) -> None:
        """Stop the loop. Requests still in flight then are cancelled as by
        ``cancel_in_flight`` (their count is ``cancelled_at_shutdown``), so every block
        is back in the pool once this returns."""
        self._stopping = True
        if self._host is not None:  # a guest leaves the host's loop (between its rounds)
            self._host._guests = [g for g in self._host._guests if g is not self]
            return
        self._wake.set()
        self._thread.join(timeout=30)

    def _post(self, kind: str, payload: Any) -> None:
        self._inbox.put((kind, payload))
        self._wake.set()

    # -- engine thread ---------------------------------------------------------------
    def _loop(self) -> None:
        """Run steps until shut down; if the loop itself dies, every stream gets the error
        (a request never hangs on a dead engine)."""
        name_this_thread("mmserve-engine")
        try:
            self._steps()
        except BaseException as exc:
            self._dead = exc
            log.exception("the engine loop died")
            for member in (*self._guests, self):
                for rid in list(member._streams):
                    member._deliver(rid, EngineDeadError(f"the engine has stopped: {exc!r}"))

    def _steps(self) -> None:
        while not self._stopping:
            members = (*self._guests, self)  # guests (a voice: deadlines) first
            for m in members:
                m._drain_inbox()
            if self._cancel_requested:
                self._cancel_requested = False
                for m in members:
                    m.cancelled_at_shutdown += m._cancel_all()
            busy = [m for m in members if m.engine.has_unfinished()]
            if not busy:
                self._wake.wait(timeout=1.0)
                self._wake.clear()
                continue
            # audio streams all ahead of their playback: nothing to run until a deadline
            idle = min(m._step_once() for m in busy)
            if idle > 0:
                self._wake.wait(timeout=min(idle, 0.1))
                self._wake.clear()
        for m in (*self._guests, self):  # aborts already posted first, then the rest
            m._drain_inbox()
            m.cancelled_at_shutdown += m._cancel_all()

    def _cancel_all(self) -> int:
        """Abort every request in the engine, ending its stream with the shutdown error
        -> how many there were."""
        ids = list(self.engine.requests)
        for rid in ids:
            self.engine.abort(rid)
            if self.stage is not None:
                self.stage.release(rid)
            try:
                self._deliver(
                    rid,
                    EngineDeadError(
                        "the server is shutting down; retry the request once it is back"
                    ),
                )
            except RuntimeError:  # its event loop has closed: nobody is left to tell
                pass
        return len(ids)

    def _step_once(self) -> float:
        """One step of this engine, its outputs delivered -> seconds it may now rest."""
        self._step_since = time.monotonic()
        try:
            outputs = self.engine.step()
        except Exception as exc:  # a bug must not kill the server: fail in-flight requests
            log.exception("engine step failed")
            self._fail_all(exc)
            return 0.0
        finally:
            self._step_since = None
        if self.stage is not None:
            try:
                self.stage.process(outputs)
            except Exception as exc:
                log.exception("output stage failed")
                self._fail_all(exc)
                return 0.0
        self._deliver_step(outputs)
        return self.engine.idle_for()

    def _drain_inbox(self) -> None:
        while True:
            try:
                kind, payload = self._inbox.get_nowait()
            except queue.Empty:
                return
            if kind == "add":
                with self._count_lock:
                    self._pending_adds -= 1
                prompt, params, rid, spans, staged, audio = payload
                if rid not in self._streams:
                    continue  # the consumer went away before we saw the request
                try:
                    self.engine.add_request(prompt, params, rid, spans, audio)
                    if staged is not None:
                        self.stage.open(rid, staged)  # type: ignore[union-attr]
                except Exception as exc:
                    self.engine.abort(rid)
                    self._deliver(rid, exc)
            else:
                self.engine.abort(payload)
                if self.stage is not None:
                    self.stage.release(payload)

    def _fail_all(self, exc: Exception) -> None:
        for rid in list(self.engine.requests):
            self.engine.abort(rid)
            if self.stage is not None:
                self.stage.release(rid)
            self._deliver(rid, RuntimeError(f"engine step failed: {exc}"))

    def _deliver_step(self, outputs: list[RequestOutput]) -> None:
        """A step's outputs, with one wake-up per event loop rather than one per output:
        each ``call_soon_threadsafe`` writes the loop's self-pipe and schedules a callback,
        a cost that otherwise grows with the batch on both threads."""
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[asyncio.Queue, RequestOutput]]] = {}
        for out in outputs:
            target = self._streams.get(out.request_id)
            if target is not None:
                by_loop.setdefault(target[0], []).append((target[1], out))
        for loop, items in by_loop.items():
            loop.call_soon_threadsafe(_put_all, items)

    def _deliver(self, rid: str, item: RequestOutput | BaseException) -> None:
        target = self._streams.get(rid)
        if target is not None:
            loop, stream = target
            loop.call_soon_threadsafe(stream.put_nowait, item)


def _put_all(items: list[tuple[asyncio.Queue, RequestOutput]]) -> None:
    for stream, out in items:
        stream.put_nowait(out)


def _coalesced(
    item: RequestOutput, stream: asyncio.Queue
) -> tuple[RequestOutput, BaseException | None]:
    """``item`` merged with the deltas already queued behind it (a consumer that fell
    behind gets them as one); an error met on the way comes back to be raised next."""
    parts, held = [item], None
    while not parts[-1].finished and not stream.empty():
        nxt = stream.get_nowait()
        if isinstance(nxt, BaseException):
            held = nxt
            break
        parts.append(nxt)
    return coalesce(parts), held
