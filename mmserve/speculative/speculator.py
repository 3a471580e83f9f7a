"""Speculative decoding inside the engine step: choose k, draft, verify, account.

Per step: the controller picks k (0..k_max) for every request that is decoding;
the drafter proposes up to k tokens each; the scheduler appends them to the
request's step as verify tokens; the runner returns k+1 logits rows; here they are
verified — greedy rows by comparing the target's own argmax at each position (so
output ids equal plain decode exactly), sampled rows by lossless rejection
sampling with the drafter's real probabilities (one-hot when it is greedy).
Rejected positions are rolled back by the engine by shrinking ``num_computed``
and truncating the block table; no KV is copied.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import torch

from mmserve.speculative.config import SpecConfig
from mmserve.speculative.controller import SpecController
from mmserve.speculative.drafter import Drafter, DraftRequest
from mmserve.speculative.interface import SpecRequest, TargetSampler, VerifySeq
from mmserve.speculative.verify import greedy_verify, rejection_sample

# a probe drafts only from a context match of at least this many tokens: on the bench
# workloads (prompt lookup, k = 2, CPU) drafts from a 1-token match were accepted 10-13 %
# (chat, code) and 23 % (edit), from 2 tokens or more 36-100 %; prose probes that found
# only 1-token matches (103 of its 114 drafts there) were most of what chat probed
PROBE_MIN_MATCH = 2


class Speculator:
    def __init__(self, config: SpecConfig, drafter: Drafter) -> None:
        self.config, self.drafter = config, drafter
        self.controller = SpecController(k_max=config.max_tokens_per_step)
        self._probs: dict[str, torch.Tensor | None] = {}
        # host time of ``propose`` and ``record_step`` (what speculation adds to every
        # step, drafting or not) and the steps it was spent in: ``mmserve bench spec``
        # reports it per step, a measurement on the bench's own host
        self.host_seconds = 0.0
        self.host_steps = 0
        # the steady state: the running requests of the last step (all decoding) and the
        # shape choose() got, so a step with the same requests can skip the pass over them
        self._last_running: list[SpecRequest] = []
        self._steady_shape: tuple[int, int] | None = None
        self._steady_ids: tuple[str, ...] = ()  # their ids, in order (as choose got them)
        self._quiet = False  # this step was taken as quiet (controller.quiet_step)
        # (running, decoding requests, their k): a choice ``propose_ahead`` made for the
        # coming step, drafted by ``propose`` if that step has the same requests
        self._planned: tuple[list[SpecRequest], list[SpecRequest], list[int]] | None = None
        self._quiet_steps = 0
        # requests the drafter has prepared (indexed) for, and this step's time doing so:
        # a one-off per request, kept out of the step's measured cost. Charged to a first
        # probe's verify step, it makes a small probe bucket read dearer than larger ones
        # and holds probes back; built for every prompt at prefill instead, it is paid by
        # long prompts that never draft (docs/performance.md).
        self._prepared: set[str] = set()
        self._one_off = 0.0
        self._checks_matches = type(drafter).has_match is not Drafter.has_match

    def propose(self, running: Sequence[SpecRequest], waiting: int = 0) -> dict[str, list[int]]:
        """Drafts for the decoding requests of the coming step, keyed by request id;
        ``waiting``: requests queued for a slot (none: each request's speed counts, see
        ``mmserve.speculative.controller``)."""
        start = time.perf_counter()
        self.controller.waiting = waiting
        drafts = self._propose(running)
        self.host_seconds += time.perf_counter() - start
        self.host_steps += 1
        return drafts

    def propose_ahead(self, running: Sequence[SpecRequest], waiting: int = 0) -> bool:
        """For a step launched before the last step's tokens reach the host (async
        scheduling): True if it drafts nothing, decided as ``propose`` decides it and
        counted as ``propose`` counts it, before those tokens are in (the steady path's
        pause, quiet step or veto hold, else the controller's choice, where a due probe
        asks for a match in the context so far); False: some request is given k > 0, and
        ``propose`` for the step drafts from that choice once the tokens are in."""
        start = time.perf_counter()
        self.controller.waiting = waiting
        self._planned = None
        plain = self._steady_skip(running)
        if not plain:
            # the controller's choice needs no token (a due probe asks the drafter for a
            # match in the context without the newest one: a speed decision only). Nobody
            # given k > 0: a plain step. Else the choice waits for ``propose``, which
            # drafts from it once the tokens are in, for these same requests
            plan = self._plan(running)
            plain = plan is None or not any(plan[1])
            if not plain:
                assert plan is not None
                self._planned = (list(running), *plan)
        self.host_seconds += time.perf_counter() - start
        self.host_steps += plain
        return plain

    def _steady_skip(self, running: Sequence[SpecRequest]) -> bool:
        """The steady path: with the same requests as the last planned step (all decoding
        then, so all decoding now: one that finished or was preempted left ``running``),
        True takes the step plain without a pass over them (paused, quiet, or held back by
        a veto); False (no state changed): plan it."""
        self._quiet = False
        last = self._last_running
        if not (
            self._steady_shape is not None
            and len(running) == len(last)
            and all(a is b for a, b in zip(running, last, strict=True))
        ):
            return False
        if self.controller.paused():
            return True
        if self.controller.quiet_step(self._steady_shape):
            self._quiet = True
            return True
        return self.controller.held_back(self._steady_ids, self._steady_shape[1])

    @property
    def quiet(self) -> bool:
        """Whether the step just proposed was taken as quiet (pass it to ``record_step``)."""
        return self._quiet

    def _propose(self, running: Sequence[SpecRequest]) -> dict[str, list[int]]:
        planned, self._planned = self._planned, None
        if planned is not None:  # chosen ahead (``propose_ahead``): once a step, as always
            live = {id(r) for r in running}
            if live <= {id(r) for r in planned[0]}:  # since then requests can only leave
                keep = [
                    (r, k) for r, k in zip(planned[1], planned[2], strict=True) if id(r) in live
                ]
                return self._draft([r for r, _ in keep], [k for _, k in keep])
        if self._steady_skip(running):
            return {}
        plan = self._plan(running)
        return self._draft(*plan) if plan is not None else {}

    def _plan(self, running: Sequence[SpecRequest]) -> tuple[list[SpecRequest], list[int]] | None:
        """The pass over the running requests and the controller's choice -> (decoding
        requests, their k), or None: nobody drafts (no decoding request, or paused)."""
        decoding, pending = [], 0  # one pass: this runs every step, drafting or not
        for r in running:
            n = r.num_tokens - r.num_computed
            pending += n
            if n == 1 and r.params.logprobs is None:
                decoding.append(r)
        others = pending - len(decoding)
        steady = self.config.auto and pending == len(running) and bool(decoding)
        self._last_running = list(running) if steady else []
        self._steady_shape = (len(decoding), others) if steady else None
        ids = [r.request_id for r in decoding]
        self._steady_ids = tuple(ids)
        if not decoding or self.controller.paused():
            return None
        if self.config.auto:
            return decoding, self.controller.choose(
                ids, max(0, others), self._match_check(decoding)
            )
        return decoding, [self.config.max_tokens_per_step] * len(decoding)

    def _draft(self, decoding: list[SpecRequest], ks: list[int]) -> dict[str, list[int]]:
        """Drafts of the requests given k > 0 (their newest token is in)."""
        # only requests given k > 0: all_ids copies the whole context. A probe drafts only
        # from a match of PROBE_MIN_MATCH tokens or more
        probing = self.controller.probing
        batch = [
            DraftRequest(
                r.request_id,
                r.all_ids,
                min(k, r.max_total_len - r.num_tokens - 1),
                PROBE_MIN_MATCH if probing(r.request_id) else 1,
            )
            for r, k in zip(decoding, ks, strict=True)
            if k > 0
        ]
        batch = [b for b in batch if b.k > 0]
        if not batch:
            return {}
        for b in batch:
            self._prepare(b)
        drafts = self.drafter.propose(batch)
        out = {}
        for b, d in zip(batch, drafts, strict=True):
            if d.tokens:
                out[b.request_id] = list(d.tokens)
                self._probs[b.request_id] = d.probs
            else:
                self.controller.no_draft(b.request_id)
        if out and self.controller.hold_drafts():  # a probe came back empty: veto
            for request_id in [r for r in out if not probing(r)]:
                del out[request_id]
                self._probs.pop(request_id, None)
        return out

    def _prepare(self, request: DraftRequest) -> None:
        if request.request_id not in self._prepared:  # its first draft: index its context
            self._prepared.add(request.request_id)
            start = time.perf_counter()
            self.drafter.prepare(request)
            self._one_off += time.perf_counter() - start

    def _match_check(self, decoding: list[SpecRequest]) -> Callable[[str], bool] | None:
        """For the controller: whether a probe of a request would draft anything (a
        context match of PROBE_MIN_MATCH tokens), where the drafter can tell without
        drafting. The controller asks at shapes whose probes passed an evaluation lately,
        and does not plan a probe the answer is no for (elsewhere a probe is evaluated
        first, and one that drafts nothing goes through ``no_draft``)."""
        if not self._checks_matches:
            return None
        by_id: dict[str, SpecRequest] = {}

        def has_match(request_id: str) -> bool:
            if not by_id:
                by_id.update((r.request_id, r) for r in decoding)
            r = by_id[request_id]
            probe = DraftRequest(request_id, r.all_ids, 1, PROBE_MIN_MATCH)
            self._prepare(probe)
            return self.drafter.has_match(probe) is not False

        return has_match

    def verify(self, seq: VerifySeq, logits: torch.Tensor, sampler: TargetSampler) -> list[int]:
        """Tokens to append (accepted draft prefix + one target token); logits: (k+1, V)."""
        req, draft = seq.req, seq.draft
        states = [req.sampling] * (len(draft) + 1)
        extra = [draft[:j] for j in range(len(draft) + 1)]  # penalties see earlier drafts
        q = self._probs.pop(req.request_id, None)
        if req.params.greedy:
            return self.verify_greedy(seq, sampler.sample(logits, states, extra).token_ids)
        p = sampler.probs(logits, states, extra)
        q = q[: len(draft)] if q is not None else None
        return self._account(seq, rejection_sample(p, draft, q, req.sampling.generator))

    def verify_greedy(self, seq: VerifySeq, target: list[int]) -> list[int]:
        """Greedy verify from the target's own tokens at the k+1 positions (sampled by the
        engine in one batch call with everyone else's rows)."""
        self._probs.pop(seq.req.request_id, None)
        return self._account(seq, greedy_verify(target, seq.draft))

    def _account(self, seq: VerifySeq, tokens: list[int]) -> list[int]:
        req, drafted, accepted = seq.req, len(seq.draft), len(tokens) - 1
        self.controller.observe(req.request_id, drafted, accepted)
        req.num_draft_tokens += drafted
        req.num_accepted_tokens += accepted
        return tokens

    def record_step(
        self,
        num_tokens: int,
        seconds: float,
        verify: bool,
        graph: bool,
        emitted: int = 0,
        sequences: int = 0,
        quiet: bool = False,
    ) -> None:
        """A whole engine step's wall time (from before ``propose``, or for a step launched
        in an earlier call from the last step's record, to its tokens committed), and the
        tokens its ``sequences`` decoding sequences emitted. ``quiet``: ``self.quiet``
        as it was when the step was proposed (with async scheduling the next step may have
        been proposed since)."""
        if quiet:
            # plain steps of one shape in a row: every 8th keeps the curve fresh
            self._quiet_steps += 1
            if self._quiet_steps % 8:
                return
        start = time.perf_counter()
        seconds, self._one_off = max(seconds - self._one_off, 1e-9), 0.0
        self.controller.record_step(num_tokens, seconds, verify, graph, emitted, sequences)
        self.host_seconds += time.perf_counter() - start

    def forget(self, request_id: str) -> None:
        self._prepared.discard(request_id)
        self.controller.forget(request_id)
        self.drafter.on_finished(request_id)
        self._probs.pop(request_id, None)
