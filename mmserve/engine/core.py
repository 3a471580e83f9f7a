"""The engine core: the step loop of one process, fed by API servers over ZeroMQ.

``EngineCore.run`` is ``AsyncEngine``'s loop without asyncio: between steps it drains
the request socket without waiting (adds, aborts), steps every member engine that has
work (the voice, whose audio has deadlines, before the LLM), and sends each step's
outputs to the API servers that own them, one message per engine per API server. Nothing
in the loop waits on HTTP, JSON, detokenization for clients or parsing; when no engine
has work it sleeps in ``poll`` until a request arrives or the earliest audio deadline.

Wire invariant: an output's cumulative ``token_ids`` and ``text`` are left empty (never
built: ``LLMEngine.cumulative_outputs``); they are the concatenations of the deltas, and
the client rebuilds them, so a step's message grows with the step, not with each
request's length. A request without stop strings comes with ``detokenize=False``: its
text can end nothing, so the core skips it and the API server makes it from the token
ids (``core_client.LocalText``).

A thread answers ``Probe``s on the control socket with the loop's health and every
member's stats, so ``/health`` and ``/metrics`` keep answering while a long step runs (a
stuck step shows as a growing ``step_seconds``, as in-process).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import zmq

from mmserve.engine import wire
from mmserve.engine.engine import LLMEngine
from mmserve.engine.outputs import RequestOutput
from mmserve.errors import EngineDeadError, QueueFullError

log = logging.getLogger("mmserve")

OWNER_CHECK_S = 1.0


@dataclass
class Member:
    """One engine the loop steps, with its optional output stage (the voice's audio)."""

    engine: LLMEngine
    stage: Any = None  # an ``async_engine.OutputStage``
    owner: dict[str, bytes] = field(default_factory=dict)  # request id -> API server id


class EngineCore:
    def __init__(self, members: list[Member], info: wire.CoreInfo) -> None:
        self.members, self.info = members, info
        for m in members:  # the wire invariant: deltas only (module docstring)
            m.engine.cumulative_outputs = False
        self.order = [*members[1:], members[0]]  # guests (a voice: deadlines) first
        self.step_since: float | None = None  # monotonic start of the step running now
        self.dead_reason = ""
        self.stopping = False
        self._enc = wire.encoder()
        self._dec = wire.decoder(wire.ToCore)
        self._outbox: dict[bytes, list[RequestOutput]] = {}
        self._owners_checked = 0.0  # monotonic time of the last ``_drop_orphans`` check

    # -- the loop ----------------------------------------------------------------
    def run(self, sock: zmq.Socket) -> None:
        """Step until ``stopping``; if the loop dies, every request gets the error first."""
        poller = zmq.Poller()
        poller.register(sock, zmq.POLLIN)
        try:
            while not self.stopping:
                self._drain(sock)
                self._drop_orphans()
                busy = [(i, m) for i, m in self._ordered() if m.engine.has_unfinished()]
                if not busy:
                    poller.poll(1000)
                    continue
                idle = min(self._step(sock, i, m) for i, m in busy)
                if idle > 0:
                    poller.poll(int(min(idle, 0.1) * 1000))
        except BaseException as exc:
            self.dead_reason = repr(exc)
            log.exception("the engine core loop died")
            for i, m in enumerate(self.members):
                for rid in list(m.owner):
                    self._fail(sock, i, rid, EngineDeadError(f"the engine has stopped: {exc!r}"))
            raise

    def _drop_orphans(self) -> None:
        """At most every ``OWNER_CHECK_S``: release the requests of API servers whose
        process is gone (nobody reads their outputs; their blocks would stay taken until
        each request ran to its end)."""
        now = time.monotonic()
        if now < self._owners_checked + OWNER_CHECK_S:
            return
        self._owners_checked = now
        owners = {o for m in self.members for o in m.owner.values()}
        gone = {o for o in owners if (pid := wire.owner_pid(o)) and not wire.pid_alive(pid)}
        for m in self.members if gone else ():
            for rid, owner in list(m.owner.items()):
                if owner in gone:
                    del m.owner[rid]
                    self._release(m, rid)
        if gone:
            log.warning("dropped the requests of %d API server(s) that exited", len(gone))

    def _ordered(self) -> list[tuple[int, Member]]:
        return [(self.members.index(m), m) for m in self.order]

    def _step(self, sock: zmq.Socket, i: int, m: Member) -> float:
        """One step of member ``i``, its outputs sent -> seconds it may now rest."""
        self.step_since = time.monotonic()
        try:
            outputs = m.engine.step()
            if m.stage is not None:
                m.stage.process(outputs)
        except Exception as exc:  # a bug must not kill the core: fail in-flight requests
            log.exception("engine step failed")
            for rid in list(m.engine.requests):
                self._release(m, rid)
                self._fail(sock, i, rid, RuntimeError(f"engine step failed: {exc}"))
            return 0.0
        finally:
            self.step_since = None
        self._send_outputs(sock, i, m, outputs)
        return m.engine.idle_for()

    def _send_outputs(
        self, sock: zmq.Socket, i: int, m: Member, outputs: list[RequestOutput]
    ) -> None:
        box = self._outbox
        for out in outputs:
            owner = (
                m.owner.pop(out.request_id, None) if out.finished else m.owner.get(out.request_id)
            )
            if owner is None:
                continue
            box.setdefault(owner, []).append(out)
        for owner, outs in box.items():
            sock.send_multipart([owner, self._enc.encode(wire.Outputs(i, outs))], copy=False)
        box.clear()

    # -- requests --------------------------------------------------------------------
    def _drain(self, sock: zmq.Socket) -> None:
        while True:
            try:
                owner, data = sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            msg = self._dec.decode(data)
            m = self.members[msg.engine]
            if isinstance(msg, wire.Abort):
                if m.owner.pop(msg.request_id, None) is not None:
                    self._release(m, msg.request_id)
            else:
                self._add(sock, owner, msg, m)

    def _add(self, sock: zmq.Socket, owner: bytes, msg: wire.Add, m: Member) -> None:
        rid, eng = msg.request_id, m.engine
        try:
            spans = wire.from_wire(msg.spans)
            if msg.stage_seed is not None and m.stage is None:
                raise ValueError("this engine has no output stage for a stage request")
            waiting = len(eng.scheduler.waiting)
            if waiting >= eng.config.max_waiting:
                raise QueueFullError(f"the waiting queue is full ({waiting} requests); retry later")
            eng.add_request(msg.prompt_token_ids, msg.params, rid, spans, msg.audio)
        except Exception as exc:  # refused without side effects (``add_request``)
            self._fail(sock, msg.engine, rid, exc, owner)
            return
        try:
            if msg.stage_seed is not None:
                m.stage.open(rid, _stage_request(msg.stage_seed, msg.audio is not None))
        except Exception as exc:
            self._release(m, rid)
            self._fail(sock, msg.engine, rid, exc, owner)
            return
        m.owner[rid] = owner

    def _release(self, m: Member, rid: str) -> None:
        m.engine.abort(rid)
        if m.stage is not None:
            m.stage.release(rid)

    def _fail(
        self, sock: zmq.Socket, i: int, rid: str, exc: BaseException, owner: bytes | None = None
    ) -> None:
        owner = owner or self.members[i].owner.pop(rid, None)
        if owner is not None:
            sock.send_multipart([owner, self._enc.encode(wire.failure(i, rid, exc))])

    # -- control (a thread of its own) ------------------------------------------------
    def serve_control(
        self, sock: zmq.Socket, loop: threading.Thread, stop: Callable[[], bool]
    ) -> None:
        """Answer probes until ``stop()`` (asked every second): health from the loop's
        state, stats read the way ``AsyncEngine.stats`` reads them (from outside the loop's
        thread)."""
        enc, dec = wire.encoder(), wire.decoder(wire.Control)
        while not stop():
            if not sock.poll(1000):
                continue
            owner, data = sock.recv_multipart()
            msg = dec.decode(data)
            if isinstance(msg, wire.Describe):
                sock.send_multipart([owner, enc.encode(self.info)])
                continue
            since = self.step_since
            health = wire.Health(
                msg.seq,
                loop.is_alive() and not self.dead_reason,
                0.0 if since is None else time.monotonic() - since,
                [m.engine.stats() for m in self.members],
                self.dead_reason,
            )
            sock.send_multipart([owner, enc.encode(health)])


def _stage_request(seed: int, paced: bool) -> Any:
    """``paced``: the request has an ``AudioSpec`` (the engine chunks its tokens)."""
    from tts.stage import AudioRequest

    return AudioRequest(seed, paced)
