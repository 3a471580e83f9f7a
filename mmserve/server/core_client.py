"""The engine in another process: the ``EngineClient`` an API server uses in the split.

``CoreClient`` is one event loop's connection to the engine core (``mmserve.engine.core``):
a DEALER socket for requests and outputs, read by one task that hands each output to its
request's asyncio queue, and a control socket probed by a watcher task. ``Core`` is the
handle on one core process that every member engine and every event loop shares; it makes
a ``CoreClient`` per event loop on first use (the core routes each output to the socket
that sent its request), so one core can serve several apps in one process as
``AsyncEngine`` can. ``RemoteEngine`` is one member engine of the core (the LLM, or the
voice stepped by the same loop) with ``AsyncEngine``'s surface, so the routes cannot tell
the two apart:

- ``generate`` streams ``RequestOutput`` deltas (a consumer that fell behind gets the
  deltas queued for it merged into one, as in-process); admission errors (invalid prompt, full
  queue) come back as the first item, raised from the stream as in-process; closing the
  stream early aborts the request, and the core frees its blocks before its next step.
- ``alive()`` is False once the core process is gone (its pid, checked every probe) or its
  loop has ended; every stream in flight then ends with ``EngineDeadError``, none hangs.
- ``step_seconds()`` is the core's own figure; a core that stops answering probes counts
  its silence as one long step, so ``/health`` turns 503 past the stall timeout.
- ``stats()`` on a serving loop is the latest probe's (``await refresh()`` takes a fresh
  one: ``/metrics``); off any event loop (a script, a test) it asks the core at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import logging
import os
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import zmq
import zmq.asyncio

from mmserve.engine import wire
from mmserve.engine.detokenizer import IncrementalDetokenizer
from mmserve.engine.outputs import EngineStats, RequestOutput, coalesce
from mmserve.engine.playback import AudioSpec
from mmserve.engine.request import EmbeddingSpan
from mmserve.errors import EngineDeadError
from mmserve.sampling_params import SamplingParams

log = logging.getLogger("mmserve")

PROBE_INTERVAL_S = 0.5
ALIVE_CHECK_S = 0.05  # the most often a request looks the core's process up (``alive``)
_CLIENT_NUMBERS = itertools.count()
SILENT_AFTER_S = 2.0  # no probe answer for this long: the silence counts as a running step


def _shutting_down() -> EngineDeadError:
    return EngineDeadError("the server is shutting down; retry the request once it is back")


@dataclass
class _Stream:
    queue: asyncio.Queue = field(default_factory=asyncio.Queue)
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    local: LocalText | None = None  # its text is made here, not in the core


class LocalText:
    """The text of a request the core does not detokenize (one without stop strings: its
    text can end nothing, so the core needs none of it), made by the API server from the
    deltas' token ids by the engine's own rule (``TokenAppender``): each output token in
    order through the same ``IncrementalDetokenizer``, except a finishing stop or EOS
    token, and the held tail on a stop or length finish. The same tokens through the
    same detokenizer: the same text, delta for delta, as the engine makes in-process."""

    def __init__(self, detok: IncrementalDetokenizer) -> None:
        self.detok = detok

    def delta(self, out: RequestOutput) -> str:
        ids = out.new_token_ids
        if out.finished and out.finish_reason == "stop":
            ids = ids[:-1]  # a stop or EOS token is never detokenized
        text = "".join([self.detok.add([t]) for t in ids])
        if out.finished and out.finish_reason in ("stop", "length"):
            text += self.detok.flush()
        return text


@dataclass(frozen=True)
class RemoteStage:
    """What an API server knows of the voice's audio stage in the core."""

    sample_rate: int
    frame_duration: float


def _empty_stats() -> EngineStats:
    return EngineStats(0, 0, 0, 0, 0, 0, 0, 0, 0, 0)


def _coalesced(
    item: RequestOutput, queue: asyncio.Queue
) -> tuple[RequestOutput, BaseException | None]:
    """``item`` merged with the deltas queued behind it, as ``AsyncEngine`` does (a
    consumer that fell behind gets one event); an error met on the way is raised next."""
    parts, held = [item], None
    while not parts[-1].finished and not queue.empty():
        nxt = queue.get_nowait()
        if isinstance(nxt, BaseException):
            held = nxt
            break
        parts.append(nxt)
    return coalesce(parts), held


class Core:
    """One engine-core process as seen from an API-server process (module docstring).

    ``on_close`` runs once when the handle is closed (a spawned core is stopped there)."""

    def __init__(
        self, address: Any, info: wire.CoreInfo, on_close: Callable[[], None] | None = None
    ) -> None:
        self.address, self.info = address, info
        self._clients: dict[asyncio.AbstractEventLoop, CoreClient] = {}
        self._dead: str | None = None
        self._alive_at = -ALIVE_CHECK_S  # monotonic time of the last process look-up
        self.on_close = on_close
        self.process: Any = None  # the core's process object, where this process started it
        self._probe_lock = threading.Lock()
        self._probe_sock: zmq.Socket | None = None
        self._probe_seq = 0

    def client(self) -> CoreClient:
        """The running event loop's connection (made on first use)."""
        loop = asyncio.get_running_loop()
        found = self._clients.get(loop)
        if found is None:
            found = self._clients[loop] = CoreClient(self, loop)
        return found

    def current(self) -> CoreClient | None:
        """The running loop's connection, if this thread runs a loop that made one."""
        try:
            return self._clients.get(asyncio.get_running_loop())
        except RuntimeError:
            return None

    def die(self, reason: str) -> None:
        """The core is gone: every loop's streams in flight end with ``EngineDeadError``."""
        if self._dead is not None:
            return
        self._dead = reason
        log.error("engine core: %s; in-flight requests end with an error", reason)
        for client in list(self._clients.values()):
            client.fail_all(EngineDeadError(f"the engine has stopped: {reason}"))

    def alive(self) -> bool:
        """Whether the core runs; its process is looked up at most every
        ``ALIVE_CHECK_S`` (a request that slips in meanwhile is failed by ``die``, with
        every other stream in flight, when the next look or the watcher finds it gone)."""
        now = time.monotonic()
        if self._dead is None and now - self._alive_at >= ALIVE_CHECK_S:
            self._alive_at = now
            if not wire.pid_alive(self.info.pid):
                self.die(f"the engine core process {self.info.pid} exited")
        return self._dead is None

    def probe_now(self, timeout_s: float = 5.0) -> wire.Health | None:
        """A probe answered now, asked from a thread that runs no event loop."""
        with self._probe_lock:
            if self._probe_sock is None:
                self._probe_sock = zmq.Context.instance().socket(zmq.DEALER)
                self._probe_sock.setsockopt(zmq.LINGER, 0)
                self._probe_sock.connect(self.address.control)
            sock, dec = self._probe_sock, wire.decoder(wire.Health)
            self._probe_seq += 1
            sock.send(wire.encoder().encode(wire.Probe(self._probe_seq)))
            deadline = time.monotonic() + timeout_s
            while (left := deadline - time.monotonic()) > 0 and sock.poll(int(left * 1000)):
                health = dec.decode(sock.recv())
                if health.seq == self._probe_seq:
                    return health
            return None

    def close(self) -> None:
        for client in list(self._clients.values()):
            client.close()
        self._clients.clear()
        if self._probe_sock is not None:
            self._probe_sock.close(linger=0)
            self._probe_sock = None
        on_close, self.on_close = self.on_close, None
        if on_close is not None:
            on_close()


class CoreClient:
    """One event loop's sockets to the core, and the streams of its requests."""

    def __init__(self, core: Core, loop: asyncio.AbstractEventLoop) -> None:
        self.core, self.loop = core, loop
        self._streams: dict[tuple[int, str], _Stream] = {}
        self._enc = wire.encoder()
        self.health: wire.Health | None = None
        self.health_at = time.monotonic()
        self._kick = asyncio.Event()
        self._fresh: list[asyncio.Future] = []
        self._ctx = zmq.asyncio.Context()
        self._sock = self._socket(
            core.address.requests, wire.owner_id(os.getpid(), next(_CLIENT_NUMBERS))
        )
        self._tasks = [
            asyncio.ensure_future(self._read(self._sock)),
            asyncio.ensure_future(self._watch(self._socket(core.address.control))),
        ]

    def _socket(self, where: str, identity: bytes | None = None) -> zmq.asyncio.Socket:
        sock = self._ctx.socket(zmq.DEALER)
        if identity is not None:
            sock.setsockopt(zmq.IDENTITY, identity)
        for opt, value in ((zmq.LINGER, 0), (zmq.SNDHWM, 0), (zmq.RCVHWM, 0)):
            sock.setsockopt(opt, value)
        sock.connect(where)
        return sock

    def close(self) -> None:
        for task in self._tasks:
            with contextlib.suppress(RuntimeError):  # its loop has already closed
                task.cancel()
        self._ctx.destroy(linger=0)

    # -- requests ----------------------------------------------------------------------
    async def generate(
        self,
        member: int,
        prompt_token_ids: list[int],
        params: SamplingParams,
        request_id: str | None,
        spans: list[EmbeddingSpan] | None,
        stage_seed: int | None,
        audio: AudioSpec | None,
        detok: IncrementalDetokenizer | None = None,
    ) -> AsyncIterator[RequestOutput]:
        """``detok``: make the request's text here (``LocalText``); the core is asked
        for its token ids alone."""
        rid = request_id or f"req-{uuid.uuid4().hex}"
        if not self.core.alive():
            raise EngineDeadError(f"the engine has stopped ({self.core._dead}); restart the server")
        key = (member, rid)
        merge = not self.core.info.members[member].sample_rate  # audio deltas stay per step
        stream = self._streams[key] = _Stream()
        if detok is not None:
            stream.local = LocalText(detok)
            params = dataclasses.replace(params, detokenize=False)
        self.send(
            wire.Add(
                member, rid, list(prompt_token_ids), params, wire.to_wire(spans), stage_seed, audio
            )
        )
        done = False
        held: BaseException | None = None  # met while coalescing: raised after the delta
        try:
            while True:
                item = held or await stream.queue.get()
                if isinstance(item, BaseException):
                    done = True
                    raise item
                if merge:
                    item, held = _coalesced(item, stream.queue)
                done = item.finished
                yield item
                if done:
                    return
        finally:
            self._streams.pop(key, None)
            if not done and self.core._dead is None:
                self.send(wire.Abort(member, rid))

    def send(self, msg: wire.Add | wire.Abort) -> None:
        """Queue ``msg`` for the core (never blocks: no high-water mark)."""
        with contextlib.suppress(zmq.ZMQError):  # a closed socket: the server is stopping
            self._sock.send(self._enc.encode(msg), zmq.NOBLOCK)

    def cancel_all(self) -> None:
        """End this loop's streams as ``AsyncEngine.cancel_in_flight`` does; the core
        drops them (and frees their blocks) before its next step."""
        for member, rid in list(self._streams):
            self.send(wire.Abort(member, rid))
        self.fail_all(_shutting_down())

    def fail_all(self, exc: BaseException) -> None:
        for stream in list(self._streams.values()):
            with contextlib.suppress(RuntimeError):  # its loop has already closed
                self.loop.call_soon_threadsafe(stream.queue.put_nowait, exc)

    async def _read(self, sock: zmq.asyncio.Socket) -> None:
        dec = wire.decoder(wire.FromCore)
        while True:
            msg = dec.decode(await sock.recv())
            if isinstance(msg, wire.Failed):
                stream = self._streams.get((msg.engine, msg.request_id))
                if stream is not None:
                    stream.queue.put_nowait(wire.error_from(msg))
                continue
            for out in msg.outputs:
                stream = self._streams.get((msg.engine, out.request_id))
                if stream is None:
                    continue  # its consumer went away; the abort is on its way
                if stream.local is not None:
                    out.new_text = stream.local.delta(out)
                stream.token_ids.extend(out.new_token_ids)
                stream.text += out.new_text
                out.token_ids, out.text = list(stream.token_ids), stream.text
                stream.queue.put_nowait(out)

    # -- health ------------------------------------------------------------------------
    async def _watch(self, ctl: zmq.asyncio.Socket) -> None:
        """Probe every ``PROBE_INTERVAL_S`` (or at once when ``refresh`` asks)."""
        enc, dec = wire.encoder(), wire.decoder(wire.Health)
        seq = 0
        while self.core.alive():
            seq += 1
            start = time.monotonic()
            await ctl.send(enc.encode(wire.Probe(seq)))
            timeout = int(PROBE_INTERVAL_S * 1000)
            while await ctl.poll(timeout):  # this answer and any late ones
                self._record(dec.decode(await ctl.recv()))
                timeout = 0
            rest = PROBE_INTERVAL_S - (time.monotonic() - start)
            if rest > 0:
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._kick.wait(), rest)
            self._kick.clear()

    def _record(self, health: wire.Health) -> None:
        self.health, self.health_at = health, time.monotonic()
        for fut in self._fresh:
            if not fut.done():
                fut.set_result(None)
        self._fresh.clear()
        if not health.alive:
            self.core.die(f"its loop ended: {health.reason}")

    async def refresh(self) -> None:
        """Wait (at most ~2 s) for a probe answered after this call."""
        if not self.core.alive():
            return
        fut = asyncio.get_running_loop().create_future()
        self._fresh.append(fut)
        self._kick.set()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(fut, timeout=2.0)

    def step_seconds(self) -> float:
        since = time.monotonic() - self.health_at
        if self.health is None or since > SILENT_AFTER_S:
            return since
        running = self.health.step_seconds
        return running + since if running > 0 else 0.0


class RemoteEngine:
    """One member engine of the core, with ``AsyncEngine``'s surface (module docstring)."""

    def __init__(
        self, core: Core, member: int, tokenizer: Any, image_processor: Any = None
    ) -> None:
        info = core.info.members[member]
        self.core, self.member = core, member
        self.model_name, self.max_model_len = info.name, info.max_model_len
        self.max_waiting, self.tokenizer = info.max_waiting, tokenizer
        self.image_processor = image_processor
        self.stage = RemoteStage(info.sample_rate, info.frame_s) if info.sample_rate else None

    def generate(
        self,
        prompt_token_ids: list[int],
        params: SamplingParams,
        request_id: str | None = None,
        spans: list[EmbeddingSpan] | None = None,
        stage_request: Any = None,
        audio: AudioSpec | None = None,
    ) -> AsyncIterator[RequestOutput]:
        if stage_request is not None and self.stage is None:
            raise ValueError("this engine has no output stage for a stage request")
        seed = None if stage_request is None else int(stage_request.seed)
        detok = None
        if self.tokenizer is not None and seed is None and params.detokenize and not params.stop:
            detok = IncrementalDetokenizer(
                self.tokenizer.backend,
                prompt_token_ids,
                params.skip_special_tokens,
                getattr(self.tokenizer, "all_special_ids", None),
            )
        return self.core.client().generate(
            self.member, prompt_token_ids, params, request_id, spans, seed, audio, detok
        )

    async def abort(self, request_id: str) -> None:
        self.core.client().send(wire.Abort(self.member, request_id))

    def stats(self) -> EngineStats:
        client = self.core.current()
        health = client.health if client is not None else self.core.probe_now()
        if health is None or self.member >= len(health.stats):
            return _empty_stats()
        return health.stats[self.member]

    async def refresh(self) -> None:
        await self.core.client().refresh()

    def alive(self) -> bool:
        return self.core.alive()

    def step_seconds(self) -> float:
        client = self.core.current()
        return 0.0 if client is None else client.step_seconds()

    def cancel_in_flight(self) -> None:
        """End every request this process has in flight (a graceful shutdown's grace has
        run out) with an ``EngineDeadError``; thread-safe."""
        for client in list(self.core._clients.values()):
            with contextlib.suppress(RuntimeError):  # its loop has already closed
                client.loop.call_soon_threadsafe(client.cancel_all)

    async def shutdown(self) -> None:
        self.core.close()

    def shutdown_sync(self) -> None:
        self.core.close()
