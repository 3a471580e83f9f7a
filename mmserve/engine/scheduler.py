"""Which requests run this step, and with how many tokens.

One step mixes prefill chunks, plain decodes and speculative verifies under a
token budget of ``max_num_batched_tokens`` (continuous batching with chunked
prefill), in this order:

1. every running request that is decoding gets its token (plus its drafts), oldest
   first, so no stream ever skips a step for someone else's prompt;
2. prompts being prefilled (running ones, then waiting ones admitted in arrival
   order while sequence slots and blocks allow) share what is left in chunks; while
   another prefill waits behind it, a chunk holds at most ``prefill_chunk`` tokens,
   so one long prompt cannot take a whole step from the prompts queued after it.

Bounds (``t(n)``: the time of a step of ``n`` tokens; ``B`` the budget, ``D`` the
decoding requests, ``C`` the chunk cap): a running stream's inter-token gap is at most
``t(B)``, whatever prompts arrive. A new prompt of ``p`` tokens with ``k`` prompts
being prefilled ahead of it (and slots and blocks free) starts prefilling in the
next step and gets its first token after at most ``t(B)`` (the step in flight) plus
``ceil(p / (B - D - k*C))`` steps; behind one long prompt a short chat takes two
steps. When the KV pool runs dry the newest running request not yet scheduled this
step is preempted (its blocks freed, recomputed later); a step that has scheduled
nothing may preempt the request itself.

Audio requests (``Request.audio``) are ordered, skipped and admitted by the audio policy
(``mmserve.engine.deadlines``): by playback deadline, or in arrival order (``fifo``);
running requests are sorted by it before both passes, so decodes and prefills take
audio first, text in the budget and slots audio leaves (and, while a stream is close to
its deadline, in the time it can spare). Waiting audio streams the policy refuses are
handed back through ``refused``, for the engine to finish.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from mmserve.engine.block_manager import BlockManager
from mmserve.engine.deadlines import AudioPolicy
from mmserve.engine.request import Request, Status
from mmserve.errors import QueueFullError


@dataclass
class ScheduledSeq:
    """``num_real`` of the request's own pending tokens, then ``draft`` tokens to verify."""

    req: Request
    start: int  # position of the first token run this step (== req.num_computed)
    num_real: int
    draft: list[int] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return self.num_real + len(self.draft)

    @property
    def samples(self) -> bool:
        """True when this chunk reaches the end of the sequence, so it yields tokens."""
        return self.start + self.num_real == self.req.num_tokens


@dataclass
class Schedule:
    seqs: list[ScheduledSeq]
    preempted: list[Request]


@dataclass
class _Step:
    """A step being put together: what is scheduled, what was preempted, budget left."""

    budget: int
    seqs: list[ScheduledSeq] = field(default_factory=list)
    preempted: list[Request] = field(default_factory=list)
    scheduled: set[int] = field(default_factory=set)  # id() of the scheduled requests

    def add(self, seq: ScheduledSeq) -> None:
        self.seqs.append(seq)
        self.scheduled.add(id(seq.req))
        self.budget -= seq.num_tokens


class Scheduler:
    def __init__(
        self,
        blocks: BlockManager,
        max_num_seqs: int,
        max_num_batched_tokens: int,
        max_waiting: int,
        prefill_chunk: int | None = None,
        policy: AudioPolicy | None = None,
    ) -> None:
        self.blocks = blocks
        self.policy = policy or AudioPolicy()
        self.max_num_seqs = max_num_seqs
        self.budget = max_num_batched_tokens
        self.prefill_chunk = prefill_chunk or max(1, max_num_batched_tokens // 4)
        self.max_waiting = max_waiting
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.num_preemptions = 0
        self.prompt_steps = 0  # schedules that ran a prompt chunk
        self.refused: list[Request] = []  # refused by the audio policy, for the engine

    def add(self, req: Request) -> None:
        if len(self.waiting) >= self.max_waiting:
            raise QueueFullError(
                f"the waiting queue is full ({self.max_waiting} requests); retry later"
            )
        self.waiting.append(req)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self, drafts: dict[str, list[int]] | None = None) -> Schedule:
        step = _Step(self.budget)
        self.refused += self.policy.begin_step(self.running, self.waiting)
        self._schedule_decodes(step, drafts or {})
        decodes = len(step.seqs)
        self._schedule_prefills(step)
        self.prompt_steps += len(step.seqs) > decodes
        return Schedule(step.seqs, step.preempted)

    def _schedule_decodes(self, step: _Step, drafts: dict[str, list[int]]) -> None:
        for req in list(self.running):
            if step.budget <= 0:
                return
            if req.status is Status.WAITING or req.num_tokens - req.num_computed != 1:
                continue  # preempted this step (O(1), where a list look-up made it O(n^2)),
                # or prefilling
            if self.policy.skips(req):
                continue  # an audio stream well ahead of its playback (or outside the window)
            draft = drafts.get(req.request_id, [])[: step.budget - 1]
            if self._reserve(req, 1 + len(draft), step):
                step.add(ScheduledSeq(req, req.num_computed, 1, draft))

    def _schedule_prefills(self, step: _Step) -> None:
        prefilling = [
            r
            for r in self.running
            if r.num_tokens - r.num_computed > 1 and not self.policy.skips(r)
        ]
        for i, req in enumerate(prefilling):
            if step.budget <= 0:
                return
            if req.status is Status.WAITING:
                continue  # preempted for an earlier request this step
            behind = len(prefilling) - i - 1 + self._admissible()
            n = self.policy.chunk(
                req, self._chunk(req.num_tokens - req.num_computed, step.budget, behind)
            )
            if n > 0 and self._reserve(req, n, step):  # 0: it would make an audio stream late
                step.add(ScheduledSeq(req, req.num_computed, n))
        while self._admissible() and step.budget > 0 and not step.preempted:
            admitted = self._next_admitted()  # memory is short when someone was preempted
            if admitted is None or not self._admit(admitted):
                return
            req = admitted
            n = self.policy.chunk(
                req, self._chunk(req.num_tokens - req.num_computed, step.budget, self._admissible())
            )
            step.add(ScheduledSeq(req, req.num_computed, n))

    def _admit(self, req: Request) -> bool:
        """Give waiting ``req`` its blocks (its cached prefix reused) and a sequence slot;
        False (no change) when the blocks are short."""
        table = self.blocks.allocate(
            req.request_id, req.all_ids, req.extra_keys(self.blocks.block_size)
        )
        if table is None:
            return False
        self.waiting.remove(req)
        req.table, req.status = table, Status.RUNNING
        req.num_computed = table.num_cached_tokens
        req.num_cached_tokens = max(req.num_cached_tokens, table.num_cached_tokens)
        self.running.append(req)
        return True

    def ahead_candidates(
        self, budget: int, slots: int, fits: Callable[[list[tuple[int, bool]]], bool]
    ) -> list[Request]:
        """The waiting requests a step launched before the last step's tokens are in
        (async scheduling) may admit, each with its whole prompt as one chunk, so that
        chunk samples: in ``waiting``'s order, while one of ``slots`` sequence slots is
        free (``running`` may still hold requests whose last token comes from the step
        before), its prompt fits what is left of ``budget`` and the chunk cap (so
        ``_schedule_prefills`` would not cut it either), and ``fits`` says a step with
        these (prompt length, has an embedding span) chunks can run. Text only, with no
        audio stream in play: the audio policy decides its admissions at a step's start.
        Changes nothing."""
        out: list[Request] = []
        if self.policy.streams:
            return out
        chunks: list[tuple[int, bool]] = []
        for req in self.waiting:
            n = req.num_tokens  # at most: a cached prefix only shortens the chunk
            if len(out) >= slots or req.audio is not None:
                break
            chunk = (n, bool(req.spans))
            if n > min(budget, self.prefill_chunk) or not fits([*chunks, chunk]):
                break
            chunks.append(chunk)
            out.append(req)
            budget -= n
        return out

    def admit_ahead(self, reqs: list[Request]) -> list[ScheduledSeq]:
        """Admit ``ahead_candidates``' requests, in order, while blocks allow -> their
        chunks (each its whole prompt past the cached prefix)."""
        seqs = []
        for req in reqs:
            if not self._admit(req):
                break
            seqs.append(ScheduledSeq(req, req.num_computed, req.num_tokens - req.num_computed))
        self.prompt_steps += bool(seqs)
        return seqs

    def _next_admitted(self) -> Request | None:
        """The first waiting request the policy admits now, in ``waiting``'s order. Audio
        streams start in that order (once one must wait, later ones wait too), but text is
        not held behind an audio stream waiting for room: it runs in what audio leaves. A
        text request the policy turns away ends the step's admissions."""
        audio_waits = False
        for req in self.waiting:
            if audio_waits and req.audio is not None:
                continue
            if self.policy.admits(req):
                return req
            if req.audio is None:
                return None
            audio_waits = True
        return None

    def _admissible(self) -> int:
        """How many waiting requests a free sequence slot could take now (0 or 1 is enough
        to know whether a prefill has company)."""
        return int(bool(self.waiting) and len(self.running) < self.max_num_seqs)

    def _chunk(self, pending: int, budget: int, behind: int) -> int:
        """A prefill's share of the step: all it needs that fits, capped while others wait."""
        return min(pending, budget, self.prefill_chunk if behind else budget)

    def _reserve(self, req: Request, n: int, step: _Step) -> bool:
        """Make room for ``n`` tokens past ``num_computed``, preempting the newest running
        request this step has not scheduled (or ``req`` itself, when nothing else is left
        to free and the step is empty)."""
        assert req.table is not None
        while True:
            extra = req.num_computed + n - req.table.num_tokens
            if extra <= 0 or self.blocks.append_slots(req.table, extra):
                return True
            victim = next(
                (r for r in reversed(self.running) if r is not req and id(r) not in step.scheduled),
                None,
            )
            if victim is None:
                if step.seqs:
                    return False  # others run this step and free blocks as they finish
                victim = req
            self._preempt(victim)
            step.preempted.append(victim)
            if victim is req:
                return False

    def _preempt(self, req: Request) -> None:
        self.running.remove(req)
        self._release(req)
        req.status, req.num_computed = Status.WAITING, 0
        req.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(req)

    def finish(self, req: Request) -> None:
        """Remove a finished or aborted request and free its blocks now."""
        if req in self.running:  # (the status may say FINISHED already)
            self.running.remove(req)
        elif req in self.waiting:
            self.waiting.remove(req)
        self._release(req)
        req.status = Status.FINISHED

    def _release(self, req: Request) -> None:
        if req.table is not None:
            self.blocks.free(req.table)
            req.table = None
