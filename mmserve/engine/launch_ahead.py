"""Asynchronous launch-ahead: the engine's next forward queued before this step's
tokens reach the host (CUDA, ``EngineConfig.async_scheduling``).

Two ways a step goes out early, both the step the synchronous engine takes next,
proposed and scheduled from the same state, so tokens are those of the synchronous
engine (the same steps, kernels and graphs; batch invariance for any row dropped, and
for a request admitted a step later than the synchronous engine admits it):

- **ahead**: when every sequence of a step samples its next token (a decode, or a
  prompt chunk that reaches its prompt's end) and each request's token can be picked on
  the device (greedy: the argmax; sampled: a draw from the request's own generator; no
  logprobs, penalties, min_tokens or logit bias to apply; a grammar's bitmask is fine: a
  step with a constrained row is picked in the engine's next call, once the host has
  the tokens its masks depend on), the next step is launched before this step's tokens
  are brought to the host, so the host's postprocessing and the next launch run while
  the GPU computes. That step decodes every running request one position on, its input
  ids taken on the device from this step's picks, and admits waiting requests into the
  free sequence slots, each with its whole prompt as one chunk from the host (their
  images encoded first), as the synchronous scheduler would chunk it (a caption job
  brings a new request nearly every step). A request that this step finishes (EOS, a
  stop string) drops its row of the step already running; its KV there lands in blocks
  it has just freed, written before any later step can reuse them (one stream); its
  slot takes a waiting request a step later than it would have. A sampled row is drawn
  when its step is launched, from its generator, in the synchronous engine's order.
- **prelaunched**: any other step (logprobs, penalties, a verify, a prefill) is launched
  once the last step's tokens are in and committed, before that step's text (for
  requests without stop strings, whose text can end nothing) and outputs are built, so
  those and the caller's work between steps overlap its forward.

Speculation records each step's cost before the next is chosen, as it does
synchronously; a step launched in an earlier call is timed from the last step's cost
record (one whole period). On CPU a step launched ahead runs at once, so the engine
keeps this off there; tests switch it on to check the bookkeeping.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import torch

from mmserve.engine.block_manager import BlockManager, BlockTable
from mmserve.engine.request import Request
from mmserve.engine.runner import ModelRunner, StepLogits
from mmserve.engine.sampler import Sampler, adjusts_besides_grammar
from mmserve.engine.scheduler import ScheduledSeq, Scheduler
from mmserve.engine.span_encoder import SpanMaterializer
from mmserve.speculative.speculator import Speculator


@dataclass
class LaunchedStep:
    """A step whose forward is queued: its sequences, its logits (on the device, maybe
    not computed yet) and the speculator's quiet flag as it proposed the step."""

    seqs: list[ScheduledSeq]
    result: StepLogits
    quiet: bool


@dataclass
class DecodeOnDevice(LaunchedStep):
    """A step whose tokens were picked on the device, one a sequence (decodes, and prompt
    chunks that reach their prompt's end); row ``i`` is sequence ``i``, and its tokens
    travel to the host while later work runs."""

    tokens: torch.Tensor  # (n,) on the device (argmax or drawn; valid until the next
    # replay, which every read of them is queued before)
    host: torch.Tensor | None  # CUDA: pinned (n,), the copy's target
    ready: torch.cuda.Event | None  # CUDA: recorded after the copy (None: not yet queued)


class StepClock(NamedTuple):
    """When a step's period began (``time.perf_counter``) and the seconds of the last
    step's text work that fell in it, for the speculator's cost record."""

    start: float
    carried: float = 0.0


def picked_on_device(req: Request, ahead: int) -> bool:
    """No logprobs, and nothing for the sampler to apply ``ahead`` tokens from now that
    needs the host's count of the tokens before (penalties, min_tokens, a logit bias):
    the request's next token can be picked on the device, the argmax (greedy) or a draw
    from its own generator (sampled), the logits masked first by its grammar's bitmask
    (filled on the host once the token before is in: see ``LaunchAhead._launch``)."""
    return req.params.logprobs is None and not adjusts_besides_grammar(req.sampling, [0] * ahead)


class LaunchAhead:
    """Holds the step launched early (at most one) and decides when one may go."""

    def __init__(
        self,
        enabled: bool,
        scheduler: Scheduler,
        blocks: BlockManager,
        runner: ModelRunner,
        sampler: Sampler,
    ) -> None:
        self.enabled = enabled
        self.scheduler, self.blocks, self.runner, self.sampler = scheduler, blocks, runner, sampler
        self.pending: LaunchedStep | None = None  # the step launched early, if any
        self.recorded_at = 0.0  # when the last step's cost was recorded
        self.carried_emit = 0.0  # text work of the last step done after ``pending`` launched
        self.spans: SpanMaterializer | None = None  # the engine's, once it has an encoder
        self.ahead_steps = 0  # steps launched ahead (tests, benchmarks)
        self.ahead_admissions = 0  # requests admitted into a step launched ahead
        self.prelaunched_steps = 0  # steps launched before the last step's outputs

    def take(self) -> tuple[LaunchedStep | None, StepClock]:
        """The step launched in the last call (None: none, or all its requests finished or
        were aborted), and when this step's period began."""
        now = time.perf_counter()
        step, self.pending = self.pending, None
        carried, self.carried_emit = self.carried_emit, 0.0
        if step is None or all(s.req.finished for s in step.seqs):
            return None, StepClock(now)
        return step, StepClock(self.recorded_at, carried)

    def settle(self) -> None:
        """With no work left, drop a step launched ahead whose requests have all finished
        (its rows only ran past their ends): the engine may not be stepped again to take
        it. Nothing on the device reads its buffers later."""
        step = self.pending
        if step is not None and all(s.req.finished for s in step.seqs):
            self.pending = None

    def on_device(self, step: LaunchedStep) -> DecodeOnDevice | None:
        """``step`` with its tokens picked on the device, when they can wait there while
        the next step launches (None: the host samples it)."""
        if isinstance(step, DecodeOnDevice):
            return step
        if not self._overlaps(step.seqs):
            return None
        return self._picked(step.seqs, step.result, step.quiet)

    def launch_next(self, cur: DecodeOnDevice, spec: Speculator | None) -> None:
        """Launch the decode after ``cur`` now, if it is known without ``cur``'s tokens."""
        self.pending = self._launch_ahead(cur, spec)

    def token_ids(self, cur: DecodeOnDevice) -> list[int]:
        """``cur``'s tokens on the host; waits for its copy only (queued by the launch
        of the step ahead, or now)."""
        if cur.host is None:
            return cur.tokens.tolist()
        self._send(cur)
        assert cur.ready is not None
        cur.ready.synchronize()
        return cur.host.tolist()

    def prelaunch(self, schedule_and_run: Callable[[], LaunchedStep | None]) -> None:
        """Once the last step's tokens are committed: launch the next step before its
        text and outputs are built, if none is launched already and there is work."""
        self.recorded_at = time.perf_counter()
        if self.pending is not None or not self.enabled or not self.scheduler.has_work():
            return
        step = schedule_and_run()
        if step is not None:
            self.prelaunched_steps += 1
        self.pending = step

    # -- deciding ----------------------------------------------------------------------
    def _overlaps(self, seqs: list[ScheduledSeq]) -> bool:
        """Whether this step's tokens can wait on the device while the next step launches:
        no drafts, every sequence samples one token (a decode, or the last chunk of its
        prompt), every request picked on the device (greedy or sampled) with nothing the
        sampler applies (penalties, min_tokens) and no logprobs, now and one token on
        (those need the host's counts or this step's logits, which the next step's
        replay overwrites)."""
        if not self.enabled:
            return False
        for s in seqs:
            if s.draft or not s.samples or not picked_on_device(s.req, 0):
                return False
        return True

    def _picked(self, seqs: list[ScheduledSeq], result: StepLogits, quiet: bool) -> DecodeOnDevice:
        """The step's tokens picked on the device, on CUDA with a pinned buffer for their
        way to the host (the step launched ahead copies them there in its own input
        copy's launch: one launch fewer a step). A graph's argmax buffer is read in
        place: every read of it, the copy to the host and the next step's input ids, is
        queued before the next replay overwrites it. Sampled rows are drawn now, before
        any later step's draw from the same generators. (The host's counts may lack the
        last step's token here, for a step launched ahead; nothing a draw reads depends
        on them: a request overlaps only with no penalty and with its min_tokens behind
        it.)"""
        n = len(seqs)
        assert result.rows[-1] == [n - 1] and len(result.rows) == n, "one row a sequence"
        argmax = result.argmax[:n] if result.argmax is not None else None
        tokens = self.sampler.sample_tokens(
            result.logits[:n], [s.req.sampling for s in seqs], argmax=argmax
        )
        if tokens.device.type != "cuda":
            return DecodeOnDevice(seqs, result, quiet, tokens, None, None)
        host = torch.empty(n, dtype=tokens.dtype, pin_memory=True)
        return DecodeOnDevice(seqs, result, quiet, tokens.contiguous(), host, None)

    def _send(self, cur: DecodeOnDevice) -> None:
        """Queue ``cur``'s tokens' copy to the host, unless it is queued already."""
        if cur.host is not None and cur.ready is None:
            cur.ready = self.runner.copy_to_host(cur.host, cur.tokens)

    def _launch_ahead(self, cur: DecodeOnDevice, spec: Speculator | None) -> LaunchedStep | None:
        """Launch the step after ``cur`` before ``cur``'s tokens are on the host, when it
        is known without them: every running request decodes its next token, all keep
        overlapping, their slots fit without preempting anyone, speculation (if on) would
        draft nothing, and every waiting request a free slot could take is admitted with
        its whole prompt (``Scheduler.ahead_candidates``; else the synchronous scheduler
        admits and chunks it once the tokens are in). A request whose ``cur`` token is its
        last by length frees its slot for this step, as it does synchronously (its blocks
        are freed once the tokens are in: the admitted take fresh ones). A request that
        ends at an EOS or a stop string frees its slot a step later than it would have:
        the one step ahead its row ran in."""
        sched = self.scheduler
        running, waiting = sched.running, len(sched.waiting)
        if not sched.policy.steady():
            return None
        # cur's rows of requests that finished since it launched (a step ahead) are dropped
        live = [s for s in cur.seqs if not s.req.finished]
        if len(running) != len(live) or any(
            s.req is not r for s, r in zip(live, running, strict=True)
        ):
            return None
        ahead = self._next_rows(cur)
        if ahead is None or not ahead or (len(ahead) < len(live) and spec is not None):
            return None  # (for speculation a row ending by length is a new shape)
        # (returning None: the engine queues cur's copy to the host itself)
        admit: list[Request] = []
        # the slots free in the next step: rows ending by length (cur's token their last)
        # leave theirs, as they do for the synchronous scheduler once cur's tokens are in
        slots = sched.max_num_seqs - len(ahead)
        if waiting and slots > 0:
            admit = sched.ahead_candidates(
                sched.budget - len(ahead), slots, lambda c: self.runner.fits_ahead(len(ahead), c)
            )
            if len(admit) < min(waiting, slots):
                return None  # one that must be chunked (or would not replay): the scheduler's
        fresh = sum(
            max(0, self.blocks.blocks_for(a.start + 1) - len(table.block_ids))
            for a, table, _ in ahead
        )
        if fresh > self.blocks.num_fresh_blocks:
            return None
        if spec is not None and not spec.propose_ahead(running, waiting - len(admit)):
            return None
        for a, table, _ in ahead:
            extra = a.start + 1 - table.num_tokens
            if extra > 0:
                reserved = self.blocks.append_slots(table, extra)
                assert reserved  # the free pool held them
        chunks = sched.admit_ahead(admit) if admit else []  # the decodes' slots taken first
        self.ahead_admissions += len(chunks)
        return self._launch(cur, ahead, spec is not None and spec.quiet, chunks)

    def _next_rows(self, cur: DecodeOnDevice) -> list[tuple[ScheduledSeq, BlockTable, int]] | None:
        """Each row of the step after ``cur``: its sequence, its table, where ``cur``'s
        row of it is (None: a request's next token needs the host). A request whose
        ``cur`` token is its last by length has no row. The blocks a row's slot needs are
        taken from the free pool alone (a row may still end at EOS, and the synchronous
        engine would never have taken, or evicted a cached prefix for, its block; short
        of it the scheduler decides, and may preempt)."""
        rows = []
        for i, s in enumerate(cur.seqs):
            req, p, table = s.req, s.req.params, s.req.table
            if req.finished:
                continue  # since cur launched: its row there is dropped
            assert table is not None
            if not picked_on_device(req, 1):
                return None
            if (p.max_tokens is not None and len(req.output_ids) + 1 >= p.max_tokens) or (
                req.num_tokens + 1 >= req.max_total_len
            ):
                continue  # cur's token is its last
            rows.append((ScheduledSeq(req, s.start + s.num_real, 1), table, i))
        return rows

    def _launch(
        self,
        cur: DecodeOnDevice,
        ahead: list[tuple[ScheduledSeq, BlockTable, int]],
        quiet: bool,
        chunks: list[ScheduledSeq],
    ) -> LaunchedStep:
        """Queue the decode of ``ahead``'s rows, input ids taken from ``cur``'s tokens,
        then ``chunks`` (their images encoded first). When every row goes on, the launch
        that copies them in also copies them to the host; else ``cur``'s own copy goes
        first, so the host never waits behind the step ahead."""
        decodes = [a for a, _, _ in ahead]
        whole = len(ahead) == len(cur.seqs)
        keep = cur.tokens if whole else cur.tokens[self.runner.device_ids([i for _, _, i in ahead])]
        carry = None
        if whole and cur.host is not None and cur.ready is None:
            carry = (cur.host, torch.cuda.Event())
        else:
            self._send(cur)
        if self.spans is not None:  # pending spans the chunks read: one batched encode
            self.spans.fill((s.req, s.start, s.start + s.num_real) for s in chunks if s.req.spans)
        result = self.runner.run_ahead(decodes, keep, tokens_to=carry, chunks=chunks)
        seqs = decodes + chunks
        if carry is not None:
            cur.ready = carry[1]
        self.ahead_steps += 1
        if any(s.req.sampling.grammar is not None for s in seqs):
            # a grammar's mask needs the state after cur's token: the step is picked in
            # the engine's next call (``on_device``), once cur's tokens are observed; its
            # forward runs meanwhile, under the host's update, outputs and mask fill
            return LaunchedStep(seqs, result, quiet)
        return self._picked(seqs, result, quiet)
