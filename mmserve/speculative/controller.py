"""Chooses how many tokens to draft (k in 0..k_max) per request per step.

Speculation must never make a workload slower than plain decode. For each request
the controller compares throughput with ``k`` drafted tokens against ``k = 0``::

    R(k) = (S + E(k)) / cost(T + k)  /  (S / cost(T))

where ``T`` is the step's query tokens so far, ``S`` the tokens the step is expected
to emit so far (one per decoding request, plus the expected acceptances of requests
already given drafts) and ``E(k)`` the request's expected accepted tokens
(``mmserve.speculative.acceptance``). ``cost`` is the measured wall time of a whole engine
step (choosing k, drafting, the forward, sampling, verifying, bookkeeping), so the
drafter's and the controller's own time are paid for; a forward alone would miss
them, and on CUDA the forward returns before the GPU finishes. With one request this
is ``(1 + E(k)) / cost(1 + k)`` relative to ``1 / cost(1)``; in a large batch the extra
verify tokens slow every request, so speculation switches off when the step is compute
bound.

For a request that is drafting, the best ``k`` becomes the target if
``R >= 1 + margin / 2``, else the target is 0; the chosen ``k`` moves toward the
target by at most ``max_step_change`` per step (no cliffs), or up to twice its last k
when that whole draft was accepted (slow start: a copying request reaches k_max from a
2-token probe in 2 steps, not 3; a short edit answer is only a few verify steps).

A request that is off (and every new request) comes back only through a probe: a few
draft tokens, after forgetting part of its old evidence. A new request probes at its
first decode step. After a probe that accepts nothing the wait to the next one is what
the probe budget takes to refill twice the probe's cost, or a wait that doubles with
each such probe in a row after ``probe_free_failures``, whichever is longer, up to
``probe_interval``; after ``miss_limit`` drafts in a row that accept nothing the
request ramps down to 0 and waits the whole interval. A probe runs only when perfect
acceptance would pay at this step's cost, when it costs at most ``probe_max_overhead``
of the step, and from a budget that refills by ``probe_budget_per_step`` a step; a
probe accepted whole and followed by drafting gets its charge back (it paid), so the
budget bounds what probes that do not pay cost; one that accepts but is not followed
by drafting (the step too dear for what it accepts) waits as a failed probe does. A
probe denied by the step (its shape too dear, the budget empty) is not asked again at
that shape until the answer could change (an interval; a quarter; the refill), and
while no request can probe a step takes no per-request pass. The prior cannot turn a
request on by itself: posterior means decay toward a population prior that may come
from other, copy-heavy requests, and with ~10 effective observations its floor (~0.13
at a 0.8 prior) kept a request that copies nothing drafting 5-6 tokens a step
(simulated: 0.85x plain). An off request costs ~1 us to choose for, not ~12 for a full
evaluation (at 16 requests and a ~2 ms CUDA-graph step, that was ~10 % of it).
A last check watches what speculation delivered rather than what it expected: over
the last ~``guard_window`` verify steps (decayed sums) it compares the time they took
with the time plain decode steps of the same batch sizes (the measured plain curve)
would have taken to emit the same tokens. If they were slower by more than
``1 - guard_floor``, nobody drafts (no probes either) for ``guard_pause`` steps, a
pause that doubles each time the check fails again, up to ``guard_pause_max``, and
is reset by twice ``guard_window`` verify steps without a failure.
Whatever the model's estimates get wrong (acceptance of prose that the population prior
overrates, verify costs that drift), a workload then loses at most one window per
pause.

Whose throughput: while requests wait for a slot (``waiting``), a request that finishes
early hands its slot to the next one, so the step maximises the batch's tokens per
second, as above. While none waits, a slot freed early stays empty: a batch of
requests finishes when its slowest one does, and a verify step that speeds one request
up slows every other request of the step by what its extra rows cost. Then a step
drafts only if no request of it is expected to run slower than in a plain step:
``(1 + E_j(k_j)) * cost(T) >= cost(T + sum k)`` for every request ``j`` of the step
that is not probing (one that drafts nothing has ``E = 0``). Otherwise its drafts are
vetoed (probes, budgeted exploration, still run) and the same requests are not
planned again for 1, 2, 4 .. ``probe_interval`` steps; a new set of requests (one
finished, one admitted) is planned at once. Judged by the sum alone, requests that
draft slow down one that does not, and the batch, which finishes with its slowest
request, ends later than plain decode would (docs/performance.md). For
the same reason, with none waiting a probe beside a request that neither drafts nor
probes is called off (what it learns could not be used), and a probe that drafts
nothing (the speculator asks probes for a match of 2+ tokens) vetoes the others.
Everything is a deterministic function of the calls made.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from mmserve.speculative.acceptance import (
    PopulationAcceptance,
    RequestAcceptance,
    SpecTotals,
    expected_accepted,
)
from mmserve.speculative.cost_model import StepCostModel

# what a probe is charged while verify steps of its size were never measured (a fraction
# of a step): enough to explore once, not to probe every step on a guess
PROBE_NOMINAL = 0.25


@dataclass
class _RequestState:
    acceptance: RequestAcceptance
    k: int = 0  # the k chosen at the previous step
    steps_off: int = 0  # consecutive steps with k == 0
    wait: int = 1  # off steps before the next probe (1 .. probe_interval)
    probe_cost: float = 0.0  # the last probe's expected overhead, a fraction of a step
    probing: bool = False  # the last k was a probe whose outcome is not yet observed
    winding_down: bool = False  # target 0 until k reaches 0 (after misses)
    misses: int = 0  # consecutive verified drafts with nothing accepted
    failed_probes: int = 0  # consecutive verified probes that accepted nothing
    full: bool = False  # the last verified draft was accepted whole
    judge_probe: bool = False  # the last probe accepted: the next choice judges it
    blank_step: int = -1  # the step whose due probe had nothing to draft (``has_match``)


class SpecController:
    """Per-request, per-step choice of the number of draft tokens; see the module docstring."""

    def __init__(
        self,
        k_max: int = 8,
        *,
        margin: float = 0.1,
        max_step_change: int = 2,
        probe_interval: int = 16,
        probe_k: int = 2,
        probe_max_overhead: float = 0.5,
        probe_free_failures: int = 3,
        probe_budget_per_step: float = 0.01,
        probe_forget: float = 0.3,
        miss_limit: int = 6,
        prior_accept: float = 0.5,
        prior_strength: float = 1.0,
        decay: float = 0.9,
        cost_alpha: float = 0.2,
        default_step_seconds: float = 0.01,
        knee_tokens: float = 256.0,
        guard_window: int = 32,
        guard_floor: float = 0.98,
        guard_pause: int = 32,
        guard_pause_max: int = 1024,
    ) -> None:
        if k_max < 1 or max_step_change < 1 or probe_interval < 1 or probe_k < 1:
            raise ValueError("k_max, max_step_change, probe_interval and probe_k must be >= 1")
        if not (0.0 < decay <= 1.0 and 0.0 <= probe_forget <= 1.0 and 0.0 < prior_accept < 1.0):
            raise ValueError("need 0 < decay <= 1, 0 <= probe_forget <= 1, 0 < prior_accept < 1")
        self.k_max = k_max
        self.margin = margin
        self.max_step_change = max_step_change
        self.probe_interval = probe_interval
        self.probe_k = min(probe_k, k_max, max_step_change)  # probes obey the ramp too
        self.probe_max_overhead = probe_max_overhead
        self.probe_free_failures = probe_free_failures
        self.probe_forget = probe_forget
        self.miss_limit = miss_limit
        self.prior_strength = prior_strength
        self.decay = decay
        # plain and verify steps can differ in kind, not just in size (a plain decode step
        # replays a CUDA graph, a verify step may run eagerly): one cost curve for each
        self._cost = StepCostModel(cost_alpha, default_step_seconds, knee_tokens)
        self._verify_cost = StepCostModel(cost_alpha, default_step_seconds, knee_tokens)
        self._population = PopulationAcceptance(k_max, prior_accept)
        self._requests: dict[str, _RequestState] = {}
        self._since_plain = 2  # consecutive steps in which some request drafted
        # probes spend from a budget that refills by ``probe_budget_per_step`` (a fraction
        # of a step) each step, so their total cost stays ~1 % however many requests probe
        self.probe_budget_per_step = probe_budget_per_step
        self._probe_budget = 1.0
        # True when the runner pads every sequence of a verify step to the longest draft
        # (CUDA graphs): one request's k then costs rows for all of them
        self.padded = False
        # and to the graph's query bucket at or above the longest draft + 1 (the engine's
        # (1, 2, 3, 5, 9) for k_max = 8): a draft of 5 then costs 9 rows a sequence, not 6.
        # Priced at 6, a c=4 code step drafting 2, 2 and 5 is costed from 24 rows, well
        # under the 36 it runs
        self.query_sizes: tuple[int, ...] = ()
        self._guard = _RealizedGuard(guard_window, guard_floor, guard_pause, guard_pause_max)
        self._steps = 0  # steps planned (choose calls past the early returns)
        # (decoding requests, other tokens) -> what the last evaluation of a probe at that
        # shape, with nobody drafting, said, and until which step it holds: (until, None)
        # denied, no evaluation before then; (until, cost) passed at that cost, a due probe
        # may first ask the drafter for a match (see ``_probe``)
        self._verdicts: dict[tuple[int, int], tuple[int, float | None]] = {}
        # steps ahead in which no known request can be due for a probe and none drafts,
        # and the steps skipped that way (added to each ``steps_off`` when planning resumes)
        self._quiet = 0
        self._quiet_shape = (0, 0)  # (decoding requests, other tokens) it holds for
        self._skipped = 0
        # requests waiting for a slot (the caller sets it each step): 0 = each request's
        # own speed counts, not only the batch's (module docstring)
        self.waiting = 0
        # the requests whose drafts the last veto held back, the step until which they
        # are not planned again, and the length of the next such pause
        self._veto_ids: tuple[str, ...] = ()
        self._veto_until = 0
        self._veto_pause = 1
        self.vetoes = 0  # steps whose drafts were vetoed (tests, traces)
        # this step's requests when its drafts passed the veto only because a probe was
        # counted on to draft, and whether one then drafted nothing (``hold_drafts``)
        self._probe_step: tuple[str, ...] = ()
        self._blank_probe = False

    def choose(
        self,
        request_ids: Sequence[str],
        num_other_tokens: int = 0,
        has_match: Callable[[str], bool] | None = None,
    ) -> list[int]:
        """k for each decoding request of this step, in order.

        ``num_other_tokens`` counts the step's query tokens besides one per decoding
        request (prefill chunks). Call once per step; it advances the ramp and probe
        state of each request. ``has_match(request_id)``: whether the drafter would
        draft anything for a probe of that request now (asked only when a probe is due;
        see ``_blank``).
        """
        tokens = len(request_ids) + num_other_tokens
        self._probe_step, self._blank_probe = (), False
        if self.paused():
            return [0] * len(request_ids)
        if self.padded and num_other_tokens:
            # with CUDA graphs a step that carries a prefill chunk runs eagerly: its cost
            # is not the graph verify step's the curves know, so it does not draft
            return [0] * len(request_ids)
        if self._baseline_due(tokens):
            # measure the baseline at this size with one plain step: when every step
            # drafts, the cost of not drafting would otherwise stay a guess
            self._since_plain = 0
            return [0] * len(request_ids)
        states = self._requests
        shape = (len(request_ids), num_other_tokens)
        if all(r in states for r in request_ids) and self.quiet_step(shape):
            return [0] * len(request_ids)
        if self._held(tuple(request_ids)):
            self._skip_step()  # the step the veto held back, unchanged: not planned
            return [0] * len(request_ids)
        self._probe_budget = min(1.0, self._probe_budget + self.probe_budget_per_step)
        self._steps += 1
        if self._skipped:
            for state in states.values():
                state.steps_off += self._skipped
            self._skipped = 0
        plan = _StepPlan(
            self._cost,
            len(request_ids) + num_other_tokens,
            float(max(len(request_ids), 1)),
            self._verify_cost if self._verify_cost.measured else self._cost,
            padded=self.padded,
            num_decoding=len(request_ids),
            num_other=num_other_tokens,
            query_sizes=self.query_sizes,
        )
        prior: list[float] | None = None
        ks = []
        # the fewest tokens a step expected of a request that is not probing (1 + E)
        worst = math.inf
        for request_id in request_ids:
            state = states.get(request_id) or self._state(request_id)
            # off: no evaluation until a probe is due (the first test is _probe's own,
            # inlined: this loop runs for every request every step)
            if state.k == 0 and (
                state.steps_off + 1 < state.wait
                or not self._probe(state, plan, request_id, has_match)
            ):
                state.steps_off += 1
                ks.append(0)
                worst = 1.0
                continue
            if prior is None:
                prior = self._population.prior_rates()
            expected = expected_accepted(state.acceptance.rates(prior, self.prior_strength))
            if state.probing and state.k == 0:
                k = self.probe_k
            else:
                target = 0 if state.winding_down else self._target(expected, plan)
                up = max(self.max_step_change, state.k) if state.full else self.max_step_change
                k = state.k + max(-self.max_step_change, min(up, target - state.k))
            if state.judge_probe:
                state.judge_probe = False
                if k == 0:
                    # it accepted, but not enough to pay at this step's cost: a failed
                    # probe as far as waiting goes, or it probes again at once, every
                    # other step
                    state.failed_probes += 1
                    state.wait = self._backoff(state)
                else:
                    state.failed_probes = 0
                    if state.full:  # accepted whole and drafting follows: it paid, and
                        # the budget is for probes that do not (prose that accepts one
                        # token of two now and then must not buy more prose probes)
                        self._probe_budget = min(1.0, self._probe_budget + state.probe_cost)
            state.steps_off = 0 if k else state.steps_off + 1
            state.winding_down = state.winding_down and k > 0
            state.k = k
            if not state.probing:
                worst = min(worst, 1.0 + expected[k])
            plan.total_tokens += k
            plan.emitted += expected[k]
            plan.verifying = plan.verifying or k > 0
            plan.probe_denied = plan.probe_denied and k == 0  # a new shape: ask again
            plan.max_k = max(plan.max_k, k)
            ks.append(k)
        if plan.verifying and not self.waiting and len(ks) > 1:
            self._probes_need_company(request_ids, ks, plan)
            if plan.verifying:
                self._veto(request_ids, ks, worst, plan)
        self._since_plain = self._since_plain + 1 if plan.verifying else 0
        # a vetoed step's requests keep their k, so no request is off and due: the pause
        # itself is quiet (planning vetoed steps costs host time a step)
        vetoed = self._veto_until - self._steps if self._veto_ids == tuple(request_ids) else 0
        self._quiet = 0 if plan.verifying else max(self._quiet_steps(shape), vetoed)
        self._quiet_shape = shape
        return ks

    def _quiet_steps(self, shape: tuple[int, int]) -> int:
        """Coming steps of this shape in which no known request can probe: none is due,
        or the shape's probes are denied until then (0 if a request drafts)."""
        due = self.probe_interval
        for state in self._requests.values():
            if state.k or state.probing:
                return 0
            due = min(due, state.wait - state.steps_off - 1)
        until, cost = self._verdicts.get(shape, (0, None))
        return max(0, due, (until if cost is None else 0) - self._steps - 1)

    def _veto(
        self, request_ids: Sequence[str], ks: list[int], worst: float, plan: _StepPlan
    ) -> None:
        """Hold this step's drafts back (probes run) if a request of it that is not
        probing is expected to run slower than in a plain step (module docstring). One
        that drafts nothing always would: a verify step with more rows is never cheaper
        than the plain step, whatever noisy curves say."""
        states = self._requests
        if worst > 1.0 and worst * self._cost.cost(len(request_ids) + plan.num_other) >= (
            plan.verify_cost(plan.tokens_with(0))
        ):
            if any(states[r].probing for r in request_ids):  # one that drafts nothing
                # leaves its request slower: decided once the drafts are known
                self._probe_step = tuple(request_ids)
            else:
                self._veto_pause = 1  # drafting that leaves nobody slower: forgiven
            return
        vetoed = False
        for i, r in enumerate(request_ids):
            if ks[i] and not states[r].probing:
                ks[i], vetoed = 0, True  # its k stays the ramp's: it resumes there
        if vetoed:
            plan.verifying = any(ks)
            self._vetoed(request_ids)

    def _probes_need_company(
        self, request_ids: Sequence[str], ks: list[int], plan: _StepPlan
    ) -> None:
        """With nobody waiting, a probe can only lead to drafting if every other request
        of the step drafts or probes too (else the veto holds the drafts back): beside a
        request that does neither, probes are called off, their budget refunded, and
        they wait ``probe_interval`` steps. Requests that start together probe together;
        one that failed probes again once the others draft. Otherwise a batch pays for
        probes whose acceptance no step can use."""
        states, step = self._requests, self._steps
        if all(
            k or states[r].probing or states[r].blank_step == step
            for r, k in zip(request_ids, ks, strict=True)
        ):
            return
        for i, r in enumerate(request_ids):
            state = states[r]
            if state.probing:
                state.probing, state.k, ks[i] = False, 0, 0
                state.steps_off, state.wait = 0, self.probe_interval
                self._refund(state)
        plan.verifying = any(ks)

    def _refund(self, state: _RequestState) -> None:
        """Give back the budget charge of a probe that ran no verify step."""
        self._probe_budget = min(1.0, self._probe_budget + max(state.probe_cost, 0.0))

    def _vetoed(self, request_ids: Sequence[str]) -> None:
        self.vetoes += 1
        self._veto_ids = tuple(request_ids)
        self._veto_until = self._steps + self._veto_pause
        self._veto_pause = min(2 * self._veto_pause, self.probe_interval)

    def hold_drafts(self) -> bool:
        """Call after the drafter ran and ``no_draft`` was called: True if the drafts of
        requests that are not probing must be dropped, because a probe of the step
        drafted nothing (no match long enough) and its request, now a plain one, would
        run slower for them (the veto, decided once the drafts are known)."""
        ids, blank = self._probe_step, self._blank_probe
        self._probe_step, self._blank_probe = (), False
        if not (ids and blank):
            return False
        self._vetoed(ids)
        return True

    def held_back(self, request_ids: tuple[str, ...], num_other_tokens: int = 0) -> bool:
        """``choose``'s test for a step a veto holds back, for a caller that knows its
        requests are the last planned step's (the speculator's steady path): True takes
        the step plain, as ``choose`` would, without the per-request pass before it. A
        pause whose vetoed step still verified (a probe ran) is not quiet, so each of its
        steps took that pass (code c=4 on the dev CPU: ~44 us a step, ~20 without).
        False wherever ``choose`` returns before its veto test (then call it)."""
        if (
            not self._held(request_ids)
            or (self.padded and num_other_tokens)
            or self._baseline_due(len(request_ids) + num_other_tokens)
        ):
            return False  # not held, or choose returns before its veto test
        self._probe_step, self._blank_probe = (), False
        self._skip_step()
        return True

    def _held(self, request_ids: tuple[str, ...]) -> bool:
        """Whether these requests' step is one a veto holds back."""
        return self._veto_until > self._steps and self._veto_ids == request_ids

    def _baseline_due(self, tokens: int) -> bool:
        """Whether ``choose`` takes this step plain to measure the plain cost of its size."""
        return (
            self._verify_cost.measured
            and not self._cost.has_bucket(tokens)
            and self._since_plain >= 2
        )

    def _skip_step(self) -> None:
        """A step taken plain without a per-request pass (off requests' waits run on)."""
        self._probe_budget = min(1.0, self._probe_budget + self.probe_budget_per_step)
        self._steps += 1
        self._skipped += 1
        self._since_plain = 0

    def quiet_step(self, shape: tuple[int, int]) -> bool:
        """Take this step as a plain one without a per-request pass, if none of its known
        requests can probe or draft: all are off and none is due, or the shape's probes
        are denied until later (a new request would be due, so the caller vouches that
        every request of the step is known). ``shape``: (decoding requests, other
        tokens), as ``choose`` gets them; False: call ``choose``. At c=16 the passes are a
        few percent of a step that drafts nothing."""
        if not self._quiet or shape != self._quiet_shape:
            return False
        self._quiet -= 1
        self._skip_step()
        return True

    def observe(self, request_id: str, num_drafted: int, num_accepted: int) -> None:
        """Verification outcome of one request's draft (``num_drafted`` may be < the chosen k)."""
        assert 0 <= num_accepted <= num_drafted, (num_drafted, num_accepted)
        self._population.observe(num_drafted, num_accepted)
        state = self._requests.get(request_id)
        if state is not None:
            state.acceptance.observe(num_drafted, num_accepted, self.decay)
            if num_drafted:
                state.misses = 0 if num_accepted else state.misses + 1
                state.full = num_accepted == num_drafted
                if num_accepted == 0 and state.probing:  # the probe is the test: off
                    state.k, state.steps_off, state.misses = 0, 0, 0
                    state.failed_probes += 1
                    state.wait = self._backoff(state)
                elif state.probing:  # accepted: the next choice says if it paid
                    state.wait, state.judge_probe = 1, True
                elif state.misses >= self.miss_limit:  # ramp down, then wait for a probe
                    state.winding_down, state.misses = True, 0
                    state.wait = self.probe_interval
                state.probing = False

    def record_step(
        self,
        num_query_tokens: int,
        seconds: float,
        verify: bool = False,
        graph: bool = False,
        emitted: int = 0,
        sequences: int = 0,
    ) -> None:
        """Measured wall time of one whole engine step whose forward ran ``num_query_tokens``
        rows (drafting and sampling included); ``verify``: the step carried draft tokens;
        ``graph``: it replayed a CUDA graph. With graphs (``padded``) only graph steps are
        recorded: steps that carry a prefill chunk run eagerly and never draft, and their
        costs (milliseconds, seconds when a kernel compiles) interpolated into the small
        sizes would price a short verify far above a decode step, so no probe would fit.
        ``emitted`` tokens by ``sequences`` decoding sequences: what a verify step
        delivered, for the realized-throughput check (module docstring)."""
        if self.padded and not graph:
            return
        (self._verify_cost if verify else self._cost).record(num_query_tokens, seconds)
        if verify and emitted and sequences and self._cost.has_bucket(sequences):
            plain = self._cost.cost(sequences) * emitted / sequences
            self._guard.observe(plain, seconds)

    def paused(self) -> bool:
        """Whether the realized-throughput check holds drafting off this step (call once
        a step: it counts the pause down; ``choose`` calls it too, so call one of them)."""
        return self._guard.paused()

    @property
    def pauses(self) -> int:
        """How many times the realized-throughput check paused speculation."""
        return self._guard.pauses

    def no_draft(self, request_id: str) -> None:
        """The drafter found nothing for a request given k > 0 (no verify happens). A
        probe that drafts nothing counts as failed; a drafting request that keeps finding
        nothing winds down like one that keeps missing (its choice still costs time)."""
        state = self._requests.get(request_id)
        if state is None:
            return
        if state.probing:  # no verify step: the budget gets its charge back
            self._blank_probe = True
            state.probing, state.k = False, 0
            self._blank(state)
            self._refund(state)
            return
        state.misses += 1
        if state.misses >= self.miss_limit:
            state.winding_down, state.misses, state.wait = True, 0, self.probe_interval

    def _blank(self, state: _RequestState) -> None:
        """A probe with nothing to draft (no context match long enough): as a failed one
        for the wait (an H200 A/B chose this over a neutral count). Found out before the
        probe is planned (``choose``'s ``has_match``) it costs no evaluation, and no
        evidence is forgotten (there is none): on chat most probes are blank, and planning
        each one cost more host time than the probe could win."""
        state.steps_off = 0
        state.failed_probes += 1
        state.wait = self._backoff(state)

    def probing(self, request_id: str) -> bool:
        """Whether the k just chosen for a request is a probe."""
        state = self._requests.get(request_id)
        return state is not None and state.probing

    def forget(self, request_id: str) -> None:
        """Drop a finished request's state (unknown ids are ignored)."""
        self._requests.pop(request_id, None)

    def acceptance_by_position(self) -> list[float]:
        """P(draft token at position i accepted), over all drafts reaching position i."""
        return self._population.by_position()

    def totals(self) -> SpecTotals:
        return self._population.totals()

    def step_cost(self, num_query_tokens: int, verify: bool = False) -> float:
        """The cost model's predicted seconds for a step (exposed for metrics and tests)."""
        model = self._verify_cost if verify and self._verify_cost.measured else self._cost
        return model.cost(num_query_tokens)

    def _state(self, request_id: str) -> _RequestState:
        state = self._requests.get(request_id)
        if state is None:
            # a new request probes at its first decode step: acceptance differs far more
            # between requests (copying vs free prose) than the population prior shows
            state = _RequestState(RequestAcceptance.empty(self.k_max))
            self._requests[request_id] = state
        return state

    def _ratios(self, expected: Sequence[float], plan: _StepPlan) -> list[float]:
        """R(k) for k = 0..k_max: throughput with k draft tokens relative to k = 0 (module
        docstring); ``expected[k]``: the tokens expected accepted from k. This runs for
        every drafting request every step (as separate calls, a large share of a small
        step's host time): one pass, no calls beyond the step's memoised costs."""
        base, costs = plan.costs_for_k(self.k_max)
        emitted = plan.emitted
        scale = base / emitted
        return [1.0] + [
            (emitted + expected[k]) / costs[k] * scale for k in range(1, self.k_max + 1)
        ]

    def _target(self, expected: list[float], plan: _StepPlan) -> int:
        ratios = self._ratios(expected, plan)
        best = 0
        for k in range(1, self.k_max + 1):  # the smallest k of the best ratio
            if ratios[k] > ratios[best]:
                best = k
        return best if ratios[best] >= 1.0 + self.margin / 2 else 0

    def _probe(
        self,
        state: _RequestState,
        plan: _StepPlan,
        request_id: str,
        has_match: Callable[[str], bool] | None,
    ) -> bool:
        """Whether an off request probes this step: the only way back to drafting."""
        if state.steps_off + 1 < state.wait:
            return False
        # what denies a probe is the step (its cost, the budget), not the request: the
        # step's other off requests are not evaluated again (16 evaluations a step were
        # ~6 % of a c=16 GPU step with nothing drafted), nor are probes at the same shape
        # for the next quarter interval while nobody drafts (with 16 requests off, one of
        # them is due almost every step, and an evaluation took ~25 us of the ~65 us that
        # speculation added to a c=16 step that drafted nothing; measured on the CPU)
        shape = (plan.num_decoding, plan.num_other)  # as ``choose`` keys it
        fresh = not plan.verifying
        until, fit_cost = self._verdicts.get(shape, (0, None))
        if not plan.probe_denied and fresh and fit_cost is None and until > self._steps:
            plan.probe_denied = True
        if (
            not plan.probe_denied
            and has_match is not None
            and fit_cost is not None
            and until > self._steps
            and not has_match(request_id)
        ):
            # nothing to draft: a blank probe, found before it costs an evaluation. Asked
            # only at a shape whose probes passed one lately: elsewhere the evaluation
            # (and the shape's denial, its quiet steps) comes first. Asked first at every
            # due probe, the look-ups multiply a c=16 step's host time: nothing matches,
            # so the shape is never evaluated and never denied
            state.probe_cost = fit_cost  # what the probe would have cost: paces the wait
            self._blank(state)
            state.blank_step = self._steps  # company for the step's probes, as a probe was
            state.steps_off -= 1  # the caller counts this step off
            return False
        cost, retry = (None, 0) if plan.probe_denied else self._probe_fits(plan)
        if fresh and not plan.probe_denied:  # what an evaluation of the shape said
            self._verdicts[shape] = (
                self._steps + (self.probe_interval if cost is not None else retry),
                cost,
            )
        if cost is None:
            plan.probe_denied = True
            # try again later (each try costs a full evaluation)
            state.steps_off -= max(self.probe_interval // 4, state.wait // 2)
            return False
        state.probe_cost = cost
        state.acceptance.shrink(self.probe_forget)
        state.probing = True
        return True

    def _backoff(self, state: _RequestState) -> int:
        """Steps to wait after a probe that found nothing: as many as the probe budget
        takes to refill twice its cost. On a GPU at batch 1 a 3-row verify costs what a
        decode step costs, so a copying request may probe again at once (a doubling wait
        cost short edit responses most of their speed-up); at 16 rows padded to 48 the
        wait grows toward ``probe_interval``."""
        steps = math.ceil(max(state.probe_cost, 0.0) / (2 * self.probe_budget_per_step))
        # and a wait that doubles after ``probe_free_failures`` failures in a row: a
        # request that copies nothing stops probing every other step (a batch-1 probe is
        # priced ~0 from the curves, yet its drafting and verifying cost a share of the
        # step), while an edit answer, copy runs between short rewrites, finds each run
        # again at once (a fixed wait after every failure, or a doubling from the second,
        # costs edit/rewrite at batch 1 much of its speed-up; docs/performance.md)
        doubling = 2 ** max(0, state.failed_probes - self.probe_free_failures)
        return max(1, min(self.probe_interval, max(steps, doubling)))

    def _probe_fits(self, plan: _StepPlan) -> tuple[float | None, int]:
        """The probe's expected overhead (a fraction of the step) if it could pay at all
        (with every draft token accepted), costs at most ``probe_max_overhead`` of the
        step, and fits the refilling probe budget; else None, with the steps after which
        asking again at this shape could change the answer (the whole interval when
        the step is too dear for any draft; when the budget will have refilled).

        While verify steps of the probe's size were never measured, the plain curve's
        extrapolation is all there is, and it prices rows by what more *requests* cost
        (their sampling and bookkeeping): a probe that could pay then goes ahead, charged
        ``PROBE_NOMINAL`` to the budget (or less, where the verify curve, measured
        at other sizes or once at this one, prices it lower), so the verify curve gets
        measured."""
        best_case = max(self._ratios(range(self.k_max + 1), plan)[1:])
        if best_case < 1.0 + self.margin:
            # the step is too expensive for speculation: nothing to learn
            return None, self.probe_interval
        probe_rows = plan.tokens_with(self.probe_k)
        overhead = PROBE_NOMINAL  # unmeasured: explore, at a nominal price
        if self._verify_cost.measured:
            estimate = plan.verify_cost(probe_rows) / plan.cost(plan.tokens_with(0)) - 1.0
            # a size seen once (one-off costs) or only extrapolated to (verify steps of other
            # batch sizes) can lower the price, not raise it: after a warm-up at batch 4 the
            # nominal price held a batch-1 edit request's first probe back ~25 steps
            overhead = (
                estimate if self._verify_cost.has_bucket(probe_rows) else min(estimate, overhead)
            )
        if overhead > self.probe_max_overhead:
            return None, max(1, self.probe_interval // 4)  # the curves drift: not long
        if overhead > self._probe_budget:
            return None, math.ceil((overhead - self._probe_budget) / self.probe_budget_per_step)
        self._probe_budget -= max(overhead, 0.0)
        return overhead, 0


class _RealizedGuard:
    """Realized speed-up of verify steps, decayed over ``window`` of them; pauses drafting
    when it falls below ``floor`` (judged once ``window`` steps were seen since the last
    pause, so a short unlucky run cannot trigger it)."""

    def __init__(self, window: int, floor: float, pause: int, pause_max: int) -> None:
        self.window, self.floor = window, floor
        self.decay = 1.0 - 1.0 / window
        self.base_pause, self.pause_max, self.pause = pause, pause_max, pause
        self.plain_seconds = self.seconds = 0.0
        self.steps = 0  # verify steps since the last pause
        self.skip = 0  # steps of the current pause left
        self.pauses = 0

    def paused(self) -> bool:
        """Called once per step."""
        if self.skip:
            self.skip -= 1
            return True
        return False

    def observe(self, plain_seconds: float, seconds: float) -> None:
        """One verify step: what plain steps would have taken to emit its tokens, and what
        it took."""
        self.plain_seconds = self.plain_seconds * self.decay + plain_seconds
        self.seconds = self.seconds * self.decay + seconds
        self.steps += 1
        if self.steps < self.window:
            return
        if self.plain_seconds < self.floor * self.seconds:
            self.skip, self.pauses = self.pause, self.pauses + 1
            self.pause = min(2 * self.pause, self.pause_max)
            self.plain_seconds = self.seconds = 0.0
            self.steps = 0
        elif self.steps >= 2 * self.window:  # a pause's worth of good evidence: forgiven
            self.pause = self.base_pause


@dataclass
class _StepPlan:
    """The step being planned by one ``choose`` call."""

    model: StepCostModel
    total_tokens: int  # query tokens so far
    emitted: float  # expected emitted tokens so far
    verify_model: StepCostModel
    verifying: bool = False  # some request of this step already drafts
    padded: bool = False  # verify steps pad every sequence to the longest draft
    num_decoding: int = 0
    num_other: int = 0  # prefill tokens of the step
    max_k: int = 0  # the longest draft given so far
    query_sizes: tuple[int, ...] = ()  # padded: rows a sequence is padded to (sorted)
    probe_denied: bool = False  # a probe did not fit this step as planned so far
    _costs: dict[tuple[bool, int], float] = field(default_factory=dict)  # memo per call
    _costs_key: tuple[int, int, bool] | None = None
    _base: float = 0.0
    _k_costs: list[float] = field(default_factory=list)

    def tokens_with(self, k: int) -> int:
        """Query rows the step computes if the request being planned drafts ``k``."""
        if self.padded and (self.verifying or k):
            q = max(self.max_k, k) + 1
            i = bisect.bisect_left(self.query_sizes, q)
            return self.num_other + self.num_decoding * (
                self.query_sizes[i] if i < len(self.query_sizes) else q
            )
        return self.total_tokens + k

    def costs_for_k(self, k_max: int) -> tuple[float, list[float]]:
        """The step's cost as planned (k = 0) and ``verify_cost(tokens_with(k))`` for
        k = 0..k_max, cached until the plan's shape changes (padded: its longest draft)."""
        key = (-1 if self.padded else self.total_tokens, self.max_k, self.verifying)
        if self._costs_key != key:
            self._costs_key = key
            rows = [self.tokens_with(k) for k in range(k_max + 1)]
            self._base = self.cost(rows[0])
            self._k_costs = [self.verify_cost(r) for r in rows]
        return self._base, self._k_costs

    def cost(self, num_tokens: int) -> float:
        """The step as planned so far: a verify step once anyone drafts, else plain."""
        return self._memo(self.verifying, num_tokens)

    def verify_cost(self, num_tokens: int) -> float:
        return self._memo(True, num_tokens)

    def _memo(self, verify: bool, num_tokens: int) -> float:
        cost = self._costs.get((verify, num_tokens))
        if cost is None:
            model = self.verify_model if verify else self.model
            cost = self._costs[(verify, num_tokens)] = model.cost(num_tokens)
        return cost
