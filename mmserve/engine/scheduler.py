"""Which requests run this step, and with how many tokens.

One step mixes continuing prefill chunks, plain decodes and speculative verifies
under a token budget (continuous batching with chunked prefill). Running requests
go first, oldest first; when the KV pool runs dry the newest running request is
preempted (its blocks freed, recomputed later). Waiting requests are admitted in
arrival order while budget, sequence slots and blocks allow.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from mmserve.engine.block_manager import BlockManager
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


class Scheduler:
    def __init__(self, blocks: BlockManager, max_num_seqs: int, max_num_batched_tokens: int,
                 max_waiting: int) -> None:
        self.blocks = blocks
        self.max_num_seqs = max_num_seqs
        self.budget = max_num_batched_tokens
        self.max_waiting = max_waiting
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.num_preemptions = 0

    def add(self, req: Request) -> None:
        if len(self.waiting) >= self.max_waiting:
            raise QueueFullError(
                f"the waiting queue is full ({self.max_waiting} requests); retry later")
        self.waiting.append(req)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self, drafts: dict[str, list[int]] | None = None) -> Schedule:
        drafts = drafts or {}
        budget = self.budget
        seqs: list[ScheduledSeq] = []
        preempted: list[Request] = []
        i = 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            pending = req.num_tokens - req.num_computed
            draft = drafts.get(req.request_id, []) if pending == 1 else []
            n = min(pending, budget)
            draft = draft[: max(0, budget - n)]
            if not self._reserve(req, n + len(draft), preempted):
                break  # req itself was preempted; everything after it is gone too
            seqs.append(ScheduledSeq(req, req.num_computed, n, draft))
            budget -= n + len(draft)
            i += 1
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            if preempted:
                break  # memory is short this step; admit nobody
            req = self.waiting[0]
            table = self.blocks.allocate(req.request_id, req.all_ids,
                                         req.extra_keys(self.blocks.block_size))
            if table is None:
                break
            self.waiting.popleft()
            req.table, req.status = table, Status.RUNNING
            req.num_computed = table.num_cached_tokens
            req.num_cached_tokens = max(req.num_cached_tokens, table.num_cached_tokens)
            self.running.append(req)
            n = min(req.num_tokens - req.num_computed, budget)
            seqs.append(ScheduledSeq(req, req.num_computed, n))
            budget -= n
        return Schedule(seqs, preempted)

    def _reserve(self, req: Request, n: int, preempted: list[Request]) -> bool:
        """Make room for ``n`` tokens past ``num_computed``, preempting the newest as needed."""
        assert req.table is not None
        while True:
            extra = req.num_computed + n - req.table.num_tokens
            if extra <= 0 or self.blocks.append_slots(req.table, extra):
                return True
            victim = self.running[-1]
            self._preempt(victim)
            preempted.append(victim)
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
        if req in self.running:
            self.running.remove(req)
        elif req in self.waiting:
            self.waiting.remove(req)
        self._release(req)
        req.status = Status.FINISHED

    def _release(self, req: Request) -> None:
        if req.table is not None:
            self.blocks.free(req.table)
            req.table = None
