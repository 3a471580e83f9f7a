"""SpecController: simulated workloads with known acceptance and step-cost curves."""

from __future__ import annotations

import bisect
import itertools
import math
import random
from collections.abc import Callable, Sequence

import pytest

from mmserve.speculative.acceptance import expected_accepted
from mmserve.speculative.controller import SpecController
from mmserve.speculative.cost_model import StepCostModel

Cost = Callable[[int], float]
FLAT: Cost = lambda t: 0.010 * (1 + t / 2000)  # memory bound: verify is nearly free
SLOPED: Cost = lambda t: 0.010 * (1 + 0.03 * (t - 1))  # each extra token costs 3 % of a step
STEEP: Cost = lambda t: 0.010 * max(1.0, t / 32)  # compute bound beyond 32 tokens


class Sim:
    """Drives a controller step by step; acceptance draws from a seeded RNG."""

    def __init__(self, ctrl: SpecController, cost: Cost, seed: int = 0) -> None:
        self.ctrl, self.cost, self.rng = ctrl, cost, random.Random(seed)
        self.history: dict[str, list[int]] = {}
        self.drafted = [0] * ctrl.k_max
        self.accepted = [0] * ctrl.k_max

    def run(
        self, steps: int, accept: float, ids: Sequence[str] = ("r0",), prefill: int = 0
    ) -> None:
        for _ in range(steps):
            ks = self.ctrl.choose(list(ids), num_other_tokens=prefill)
            for rid, k in zip(ids, ks, strict=True):
                m = self.verify(rid, k, accept)
                for i in range(k):
                    self.drafted[i] += 1
                    self.accepted[i] += int(i < m)
            self.record(len(ids) + prefill + sum(ks), ks)

    def verify(self, rid: str, k: int, accept: float) -> int:
        """Each of ``k`` draft tokens accepted with probability ``accept`` until the first
        rejection; the controller observes it -> the number accepted."""
        m = 0
        while m < k and self.rng.random() < accept:
            m += 1
        self.ctrl.observe(rid, k, m)
        self.history.setdefault(rid, []).append(k)
        return m

    def record(self, tokens: int, ks: list[int]) -> None:
        """Report the step's measured cost (drafting included) to the controller."""
        self.ctrl.record_step(tokens, self.cost(tokens) + 2e-6 * sum(ks))


def test_high_acceptance_and_cheap_verify_picks_high_k() -> None:
    sim = Sim(SpecController(k_max=8), FLAT)
    sim.run(40, accept=0.9)
    # ramps up: 2 a step, or doubling after a draft accepted whole (slow start)
    assert sim.history["r0"][:3] == [2, 4, 8]
    assert min(sim.history["r0"][4:]) >= 6


def test_interior_optimum_moves_with_acceptance() -> None:
    """With a per-token verify cost, depth follows acceptance (deeper on copyable text)."""
    means = []
    for accept in (0.3, 0.6, 0.95):
        sim = Sim(SpecController(k_max=8), SLOPED)
        sim.run(60, accept=accept)
        means.append(sum(sim.history["r0"][20:]) / 40)
    assert 0.25 <= means[0] < means[1] < means[2] and means[2] >= 7


def test_low_acceptance_turns_off_reprobes_and_comes_back() -> None:
    ctrl = SpecController(k_max=8, probe_interval=32)
    sim = Sim(ctrl, SLOPED)
    sim.run(120, accept=0.05)
    ks = sim.history["r0"]
    first_off = ks.index(0)
    assert first_off <= 15
    probes = [i for i in range(first_off, 120) if ks[i] > 0 and ks[i - 1] == 0]
    gaps = [b - a for a, b in itertools.pairwise(probes)]  # paced by what a probe costs
    assert len(probes) >= 3 and min(gaps) >= 3
    assert sum(ks[first_off:]) <= 3 * 2 * len(probes)  # off except short probes
    sim.run(140, accept=0.9)  # the text became copyable: a probe brings speculation back
    assert max(sim.history["r0"][-20:]) >= 6 and min(sim.history["r0"][-10:]) >= 4


def test_large_compute_bound_batch_turns_speculation_off() -> None:
    ctrl = SpecController(k_max=8)
    sim = Sim(ctrl, STEEP)
    sim.run(40, accept=0.7)  # alone, the same request speculates deeply
    assert sim.history["r0"][-1] >= 6
    sim.run(3, accept=0.7, ids=["r0"], prefill=480)  # prefill steps measure large sizes
    ids = ["r0"] + [f"b{i}" for i in range(63)]
    sim.run(80, accept=0.7, ids=ids)
    assert all(sim.history[r][-70:] == [0] * 70 for r in ids)
    assert sum(sum(sim.history[r]) for r in ids[1:]) == 0  # newcomers never paid for drafts
    sim.run(30, accept=0.7, ids=["r0"])  # alone again: it comes back (after a probe)
    assert sim.history["r0"][-1] >= 6


def test_changes_are_gradual() -> None:
    """k falls by at most 2 a step and rises by 2, or at most doubles after a draft that
    was accepted whole."""
    ctrl = SpecController(k_max=8, max_step_change=2)
    ctrl.waiting = 1  # a queue: the batch's throughput counts, no step is vetoed
    sim = Sim(ctrl, SLOPED, seed=5)
    for accept in (0.95, 0.02, 0.8, 0.3, 0.9):
        sim.run(40, accept=accept, ids=["a", "b"])
    doubled = 0
    for ks in sim.history.values():
        for a, b in itertools.pairwise([0, *ks]):
            assert a - 2 <= b <= a + max(2, a)
            doubled += b > a + 2
    assert doubled  # the slow start was exercised


def test_deterministic() -> None:
    histories = []
    for _ in range(2):
        sim = Sim(SpecController(k_max=6), SLOPED, seed=3)
        for accept in (0.9, 0.1, 0.6):
            sim.run(50, accept=accept, ids=["a", "b", "c"])
        histories.append(sim.history)
    assert histories[0] == histories[1]


def test_metrics_and_forget() -> None:
    ctrl = SpecController(k_max=4)
    sim = Sim(ctrl, FLAT, seed=1)
    sim.run(50, accept=0.7, ids=["a", "b"])
    expected = [a / d if d else 0.0 for a, d in zip(sim.accepted, sim.drafted, strict=True)]
    assert ctrl.acceptance_by_position() == pytest.approx(expected)
    totals = ctrl.totals()
    assert (totals.num_draft_tokens, totals.num_accepted_tokens) == (
        sum(sim.drafted),
        sum(sim.accepted),
    )
    assert ctrl.choose(["a"]) != [0]
    ctrl.forget("a")
    ctrl.forget("never-seen")
    assert ctrl.choose(["a"]) == [2]  # a fresh request starts its ramp again


def test_expected_accepted_matches_enumeration() -> None:
    rates = [0.9, 0.5, 0.7, 0.2]
    for k in range(len(rates) + 1):
        total = 0.0
        for m in range(k + 1):  # P(exactly m accepted of k)
            p = 1.0
            for i in range(m):
                p *= rates[i]
            if m < k:
                p *= 1 - rates[m]
            total += m * p
        assert expected_accepted(rates)[k] == pytest.approx(total)


def test_cost_model_interpolates_and_extrapolates_conservatively() -> None:
    model = StepCostModel(alpha=1.0, default_step_seconds=0.02, knee_tokens=100)
    assert model.cost(1) == pytest.approx(0.02) and model.cost(101) > model.cost(1)
    for t in (4, 8, 64, 128):
        model.record(t, 0.001 * t)  # compute bound everywhere measured
        model.record(t, 0.001 * t)
    assert model.cost(8) == pytest.approx(0.008)
    assert model.cost(32) == pytest.approx(0.032)  # linear between buckets
    assert model.cost(256) >= 0.256 * 0.99  # measured slope continues above the data
    assert model.cost(1) <= 0.004 and model.cost(1) >= 0.001  # and below it
    model.record(8, 0.0)  # unmeasured steps are ignored
    assert model.cost(8) == pytest.approx(0.008)


def test_cost_model_first_step_of_a_shape_is_replaced_by_the_second() -> None:
    """The first step of a shape carries one-off costs (a CUDA graph's first replay, an
    allocation): it stands alone until a second step of the bucket replaces it, and the
    bucket does not count as measured before that."""
    model = StepCostModel(alpha=0.2)
    model.record(3, 0.0025)  # first replay: slow
    assert not model.has_bucket(3) and model.cost(3) == pytest.approx(0.0025)
    model.record(3, 0.0015)
    assert model.has_bucket(3) and model.cost(3) == pytest.approx(0.0015)
    model.record(3, 0.0025)  # from now on an EWMA
    assert model.cost(3) == pytest.approx(0.0015 + 0.2 * 0.001)


class KindSim(Sim):
    """Plain steps replay a CUDA graph (1 ms); any step with drafts runs eagerly."""

    verify_seconds = 0.008

    def record(self, tokens: int, ks: list[int]) -> None:
        verify = sum(ks) > 0
        self.ctrl.record_step(tokens, self.verify_seconds if verify else 0.001, verify=verify)


def test_verify_steps_of_another_kind_are_costed_separately() -> None:
    """A verify step 8x a plain (graph) step: at 60 % acceptance speculation loses, and
    the controller stays off after its first probe (a single cost curve would call the
    verify step cheap and keep drafting). At 2x, perfect acceptance pays: it drafts deep.
    A verify shape's first step only stands until a second one measures it again (one-off
    costs of a first run), so there are two probes before it stays off."""
    sim = KindSim(SpecController(k_max=8), FLAT)
    sim.run(60, accept=0.6)
    ks = sim.history["r0"]
    assert sum(k > 0 for k in ks) <= 2 and sum(ks[20:]) == 0
    sim = KindSim(SpecController(k_max=8), FLAT)
    sim.verify_seconds = 0.002
    sim.run(60, accept=1.0)
    assert min(sim.history["r0"][10:]) >= 6


def test_off_requests_cost_no_evaluation_until_a_probe_is_due(monkeypatch) -> None:
    """16 requests held off are not evaluated at all between probes (choose() stays cheap
    next to a ~2 ms GPU step), and only a probe brings one back."""
    ctrl = SpecController(k_max=8, probe_interval=16)
    ids = [f"r{i}" for i in range(16)]
    sim = Sim(ctrl, STEEP)
    sim.run(60, accept=0.0, ids=ids)  # compute bound and nothing accepted: all off
    assert all(h[-1] == 0 for h in sim.history.values())
    calls = []
    real = ctrl._target
    monkeypatch.setattr(ctrl, "_target", lambda *a: calls.append(1) or real(*a))
    sim.run(80, accept=0.0, ids=ids)
    assert calls == []  # every probe failed, so no request was ever evaluated
    assert all(sum(1 for k in h[-80:] if k) <= 80 // 16 + 1 for h in sim.history.values())


def test_a_step_too_dear_to_probe_is_not_evaluated_again_for_an_interval(monkeypatch) -> None:
    """16 requests off in padded (CUDA graph) steps too dear for any draft to pay: one of
    them is due for a probe almost every step, but the step's shape, not the request, is
    what denies it, so the controller evaluates that shape once per probe interval, not
    once a step (an evaluation was ~25 us of the ~65 us speculation added to such a step;
    CPU), and the steps between take no per-request pass."""
    ctrl = SpecController(k_max=8, probe_interval=16)
    ctrl.padded = True  # a probe of k pads all 16 rows to k + 1: 48 rows, STEEP prices 1.5x
    ids = [f"r{i}" for i in range(16)]
    sim = Sim(ctrl, STEEP)
    for i in range(16):  # arriving one a step, so their probes fall due on different steps
        sim.run(1, accept=0.5, ids=ids[: i + 1])
    sim.run(60, accept=0.5, ids=ids)
    calls = []
    real = ctrl._probe_fits
    monkeypatch.setattr(ctrl, "_probe_fits", lambda plan: calls.append(1) or real(plan))
    sim.run(80, accept=0.5, ids=ids)
    assert all(sum(h[-80:]) == 0 for h in sim.history.values())  # no probe ever fits
    assert 80 // 16 - 1 <= len(calls) <= 80 // 16 + 1
    before = len(calls)
    sim.run(10, accept=0.5, ids=ids[:15])  # another shape is evaluated at once
    assert len(calls) > before and all(sum(h[-90:]) == 0 for h in sim.history.values())


def test_a_failed_probe_keeps_a_request_off_whatever_the_prior() -> None:
    """The population has seen copy-heavy requests (prior ~0.8); a request that copies
    nothing probes once per interval and drafts nothing in between."""
    ctrl = SpecController(k_max=8, probe_interval=16)
    for _ in range(300):
        ctrl.observe("other", 4, 3)
    sim = Sim(ctrl, FLAT)
    sim.run(96, accept=0.0)
    ks = sim.history["r0"]
    # probes after 1, 2, 4, 8 steps, then every 16: never more than a probe's k
    assert sum(1 for k in ks if k) <= 4 + 96 // 16 + 1 and max(ks) <= ctrl.probe_k


def test_with_graphs_eager_verify_steps_do_not_price_drafting() -> None:
    """With CUDA graphs (padded), eager steps (prefill chunks, kernel compiles) stay out of
    the cost curves, and a step carrying a prefill chunk drafts nothing."""
    ctrl = SpecController(k_max=4)
    ctrl.padded = True
    for _ in range(5):
        ctrl.record_step(2, 0.0015, graph=True)
        ctrl.record_step(3, 0.0016, verify=True, graph=True)
        ctrl.record_step(300, 2.5, verify=False, graph=False)  # prefill + a Triton compile
        ctrl.record_step(300, 0.010, verify=True, graph=False)  # prefill + verify, eager
    assert ctrl.step_cost(3, verify=True) == pytest.approx(0.0016)
    assert ctrl.step_cost(3) < 0.002
    assert not ctrl._verify_cost.has_bucket(300) and not ctrl._cost.has_bucket(300)
    assert ctrl.choose(["a", "b"], num_other_tokens=128) == [0, 0]
    assert ctrl.choose(["a", "b"]) == [2, 2]  # new requests probe at their first decode step


class PaddedSim(Sim):
    """CUDA-graph steps: every sequence runs the query bucket at or above the longest
    draft + 1, and the step is recorded at those rows, as the engine's runner reports it."""

    QSIZES = (1, 2, 3, 5, 9)

    def record(self, tokens: int, ks: list[int]) -> None:
        q = self.QSIZES[bisect.bisect_left(self.QSIZES, max(ks) + 1)]
        rows = len(ks) * q
        self.ctrl.record_step(rows, self.cost(rows), verify=max(ks) > 0, graph=True)


def test_padded_steps_are_priced_at_the_graph_query_bucket() -> None:
    """A draft of 5 runs 9 rows a sequence in a graph, so a step that pays for 9 rows
    drafts 8 (more to accept, same price), and a draft whose bucket does not pay is not
    given because its own k + 1 rows would: every settled k is a bucket's top - 1."""
    for accept in (0.8, 0.9):  # priced at k + 1 rows these settle at 3 and 5
        ctrl = SpecController(k_max=8)
        ctrl.padded, ctrl.query_sizes = True, PaddedSim.QSIZES
        sim = PaddedSim(ctrl, SLOPED, seed=1)
        sim.run(200, accept=accept, ids=["a", "b", "c", "d"])
        target = ctrl._target(expected_accepted([accept] * 8), _plan(ctrl, 4))
        assert target in (2, 4)
    plan = _plan(ctrl, 4)
    assert [plan.tokens_with(k) for k in range(9)] == [4, 8, 12, 20, 20, 36, 36, 36, 36]
    ctrl.query_sizes = ()  # without buckets: k + 1 rows a sequence
    assert [_plan(ctrl, 4).tokens_with(k) for k in range(9)] == [4 * (k + 1) for k in range(9)]


class H200c4Sim(PaddedSim):
    """c=4 steps priced as H200 traces measured them:
    plain 1.35 ms, a verify step 2.1 ms at 3 rows a sequence, 2.2 at 5, 2.4 at 9."""

    VERIFY = {3: 0.0021, 5: 0.0022, 9: 0.0024}

    def record(self, tokens: int, ks: list[int]) -> None:
        q = self.QSIZES[bisect.bisect_left(self.QSIZES, max(ks) + 1)]
        seconds = self.VERIFY.get(q, 0.0021) if q > 1 else 0.00135
        self.seconds += seconds
        self.emitted += len(ks) + self.last_accepted
        self.ctrl.record_step(len(ks) * q, seconds, verify=q > 1, graph=True)

    def verify(self, rid: str, k: int, accept: float) -> int:
        m = super().verify(rid, k, accept)
        self.last_accepted = m if rid == "a" else self.last_accepted + m
        return m


def test_probes_within_the_cap_find_copying_and_dearer_ones_do_not_run() -> None:
    """c=4 steps priced as the H200 measured them. A probe costing 0.4 of a step runs and
    a copying workload drafts deep; one costing 0.56 (the H200's 12-row verify) is over
    the 0.5 cap and does not run. Raised to 1.0, the cap let code at c=4 (acceptance
    ~0.4) draft at a loss on the H200 (docs/performance.md)."""
    for verify_12, accept, check in (
        (0.0019, 0.9, lambda r, n: r > 2.5),
        (0.0021, 0.9, lambda r, n: n == 0),
        (0.0019, 0.0, lambda r, n: r > 0.98),
    ):
        ctrl = SpecController(k_max=8)
        ctrl.padded, ctrl.query_sizes = True, PaddedSim.QSIZES
        for _ in range(2):  # the curves as a warm-up left them
            ctrl.record_step(4, 0.00135, graph=True)
            ctrl.record_step(12, verify_12, verify=True, graph=True)
        sim = H200c4Sim(ctrl, SLOPED, seed=2)
        sim.VERIFY = {**H200c4Sim.VERIFY, 3: verify_12}
        sim.seconds, sim.emitted, sim.last_accepted = 0.0, 0, 0
        sim.run(300, accept=accept, ids=["a", "b", "c", "d"])
        speedup = (sim.emitted / sim.seconds) / (4 / 0.00135)
        drafted = sum(map(sum, sim.history.values()))
        assert check(speedup, drafted), (verify_12, accept, speedup, drafted)


def _plan(ctrl: SpecController, n: int):
    from mmserve.speculative.controller import _StepPlan

    return _StepPlan(
        ctrl._cost,
        n,
        float(n),
        ctrl._verify_cost,
        padded=ctrl.padded,
        num_decoding=n,
        query_sizes=ctrl.query_sizes,
    )


def test_a_probe_that_drafts_nothing_backs_off() -> None:
    ctrl = SpecController(k_max=4)
    assert ctrl.choose(["a"]) == [2]
    ctrl.no_draft("a")  # no suffix match: the probe tested nothing
    # verify steps never measured: the probe was priced at PROBE_NOMINAL = 0.25
    # of a step: the budget (1 % a step) refills twice that in 13 steps
    wait = min(ctrl.probe_interval, math.ceil(0.25 / (2 * ctrl.probe_budget_per_step)))
    ks = [ctrl.choose(["a"])[0] for _ in range(wait)]
    assert ks == [0] * (wait - 1) + [2]


class RealizedSim(Sim):
    """Reports what each step emitted, and charges verify steps ``verify_penalty`` x the
    plain cost the controller's curves see: an engine whose verify steps are dearer than
    any estimate (noise, drift, a cost the model cannot see)."""

    def __init__(
        self, ctrl: SpecController, cost: Cost, verify_penalty: float, seed: int = 0
    ) -> None:
        super().__init__(ctrl, cost, seed)
        self.penalty, self.seconds, self.tokens = verify_penalty, 0.0, 0

    def run(
        self, steps: int, accept: float, ids: Sequence[str] = ("r0",), prefill: int = 0
    ) -> None:
        for _ in range(steps):
            ks = self.ctrl.choose(list(ids))
            emitted = sum(self.verify(rid, k, accept) + 1 for rid, k in zip(ids, ks, strict=True))
            rows = len(ids) + sum(ks)
            verify = any(ks)
            seconds = self.cost(rows) * (self.penalty if verify else 1.0)
            self.ctrl.record_step(rows, seconds, verify=verify, emitted=emitted, sequences=len(ids))
            self.seconds += seconds
            self.tokens += emitted


def test_realized_guard_pauses_drafting_that_delivered_less_than_plain() -> None:
    """Whatever the estimates said: verify steps that emitted fewer tokens per second than
    the measured plain steps pause all drafting (probes too) for ``guard_pause`` steps,
    then longer each time again, back to the base after twice a window that pays."""
    ctrl = SpecController(k_max=8, guard_window=8, guard_pause=5, guard_pause_max=20)
    for _ in range(3):
        ctrl.record_step(1, 0.001)  # plain: 1 token a ms

    def verify_steps(n: int, emitted: int) -> None:
        for _ in range(n):  # 1.2 ms a verify step
            ctrl.record_step(3, 0.0012, verify=True, emitted=emitted, sequences=1)

    verify_steps(7, emitted=1)
    assert ctrl.pauses == 0  # not judged before a window's worth
    verify_steps(1, emitted=1)
    assert ctrl.pauses == 1
    assert [ctrl.choose(["r0"]) for _ in range(5)] == [[0]] * 5
    assert ctrl.choose(["r0"]) == [2]  # a new request's probe, once the pause is over
    verify_steps(8, emitted=1)
    assert ctrl.pauses == 2
    assert [ctrl.paused() for _ in range(11)] == [True] * 10 + [False]  # doubled
    verify_steps(16, emitted=3)  # 3 tokens in 1.2 ms: pays; two windows of it forgive
    assert ctrl.pauses == 2
    verify_steps(8, emitted=1)
    assert ctrl.pauses == 2  # decayed sums: the good steps still count
    verify_steps(16, emitted=1)
    assert ctrl.pauses == 3
    assert [ctrl.paused() for _ in range(6)] == [True] * 5 + [False]  # back to the base


def test_realized_guard_does_not_fire_on_bursty_copying() -> None:
    """Acceptance alternating 0.9 / 0 in phases of 3-12 steps (code with copied
    snippets), verify steps as dear as the curves say: speculation pays overall, and the
    decayed window never pauses it."""
    for phase in (3, 6, 12):
        ctrl = SpecController(k_max=8)
        sim = RealizedSim(ctrl, SLOPED, verify_penalty=1.0)
        for i in range(60):
            sim.run(phase, accept=0.9 if i % 2 == 0 else 0.0)
        assert ctrl.pauses == 0, phase
        assert sim.tokens * SLOPED(1) / sim.seconds > 1.3, phase


def test_realized_guard_leaves_paying_speculation_alone() -> None:
    ctrl = SpecController(k_max=8)
    sim = RealizedSim(ctrl, FLAT, verify_penalty=1.05)
    sim.run(300, accept=0.9)
    assert ctrl.pauses == 0
    assert sim.tokens / sim.seconds > 3 / FLAT(1)  # a copying request keeps its gain


def test_failed_probes_back_off_doubling_even_when_verify_looks_free() -> None:
    """FLAT costs, curves measured: a probe is priced at ~0 of a step, yet probes that
    keep failing space out (a doubling wait up to ``probe_interval``), while a preamble
    that fails a probe or two before the copying starts is found again within a few
    steps."""

    def warmed() -> SpecController:
        ctrl = SpecController(k_max=8, probe_interval=16)
        for _ in range(3):
            for rows in (1, 3, 5, 9):
                ctrl.record_step(rows, FLAT(rows), verify=rows > 1, emitted=1, sequences=1)
        return ctrl

    sim = RealizedSim(warmed(), FLAT, verify_penalty=1.0)
    sim.run(200, accept=0.0)
    probes = [i for i, k in enumerate(sim.history["r0"]) if k > 0]
    gaps = [b - a for a, b in itertools.pairwise(probes)]
    assert gaps[:7] == [1, 1, 1, 2, 4, 8, 16] and min(gaps[7:]) >= 16, gaps
    assert len(probes) <= 200 // 16 + 7

    sim = RealizedSim(warmed(), FLAT, verify_penalty=1.0)
    sim.run(3, accept=0.0)  # "Sure, here is the text:"
    sim.run(12, accept=0.95)  # then the copy
    assert max(sim.history["r0"][3:6]) >= 2 and min(sim.history["r0"][-6:]) >= 6


def test_a_probe_is_refunded_only_when_accepted_whole_and_followed_by_drafting() -> None:
    """A probe paid if it was accepted whole and the request then drafts: its budget
    charge comes back. Accepted in part, it is not refunded; accepted whole but in a step
    too dear for drafting to follow, it is neither refunded nor retried at once (it waits
    as a failed probe would, not every other step)."""
    for accepted, verify_s, refunded, drafts in (
        (2, 0.0013, True, True),
        (1, 0.0013, False, None),
        (2, 0.0018, False, False),
    ):
        ctrl = SpecController(k_max=8, probe_max_overhead=1.0)  # the dear probe may run
        for _ in range(2):
            ctrl.record_step(1, 0.0010)
            ctrl.record_step(3, verify_s, verify=True)
        if not drafts:  # other requests' drafts failed: a low prior for this one
            for _ in range(300):
                ctrl.observe("other", 2, 0)
        assert ctrl.choose(["r"]) == [2]  # a new request probes at once
        charge = verify_s / 0.0010 - 1.0
        assert ctrl._probe_budget == pytest.approx(1.0 - charge)
        ctrl.observe("r", 2, accepted)
        k = ctrl.choose(["r"])[0]
        if drafts is not None:
            assert (k > 0) == drafts
        spent = 1.0 + ctrl.probe_budget_per_step - ctrl._probe_budget
        assert spent == pytest.approx(0.0 if refunded else charge, abs=0.011)
        if drafts is False:  # waits, as after a failed probe
            assert [ctrl.choose(["r"])[0] for _ in range(3)] == [0, 0, 0]


def _mixed_run(
    ctrl: SpecController, steps: int, accept: dict[str, float], sim: Sim
) -> list[list[int]]:
    """Steps of requests with their own acceptance; -> the ks of each step."""
    ids, out = list(accept), []
    for _ in range(steps):
        probing = [ctrl.probing(r) for r in ids]
        ks = ctrl.choose(ids)
        for rid, k in zip(ids, ks, strict=True):
            if k:
                sim.verify(rid, k, accept[rid])
        sim.record(len(ids) + sum(ks), ks)
        out.append([k if not p else -k for k, p in zip(ks, probing, strict=True)])
    return out


def test_with_nobody_waiting_no_request_is_slowed_for_another() -> None:
    """While no request waits for a slot, a step drafts only if none of its requests is
    expected to run slower than plain: a copying request does not draft beside one that
    drafts nothing (every verify step would slow that one, and a batch finishes with
    its slowest request). With a queue, the batch's throughput decides and it drafts.
    When the other request leaves, it drafts at once."""
    accept = {"copy": 0.95, "prose": 0.0}
    for waiting in (0, 1):
        ctrl = SpecController(k_max=8)
        ctrl.waiting = waiting
        sim = Sim(ctrl, SLOPED, seed=3)
        steps = _mixed_run(ctrl, 200, accept, sim)
        # after the first steps (both probe), drafting steps in which "prose" neither
        # drafts nor probes
        mixed = [ks for ks in steps[20:] if ks[0] > 0 and ks[1] == 0]
        if waiting:
            assert len(mixed) > 150
        else:
            assert mixed == []
            assert ctrl.vetoes > 0
            # the vetoed set is not re-planned every step: pauses of 1, 2, 4 .. 16 steps
            assert ctrl.vetoes < 40
    ctrl.forget("prose")
    ks = [ctrl.choose(["copy"])[0] for _ in range(3)]
    assert ks[0] > 0  # alone: the veto held another set of requests


def test_with_nobody_waiting_requests_that_all_pay_draft_together() -> None:
    """The veto is not a ban on batches: requests that all copy draft in every step."""
    ctrl = SpecController(k_max=8)
    sim = Sim(ctrl, SLOPED, seed=4)
    steps = _mixed_run(ctrl, 100, {"a": 0.95, "b": 0.95, "c": 0.9}, sim)
    assert all(min(ks) > 0 for ks in steps[10:])
    assert ctrl.vetoes == 0


def test_a_probe_that_drafts_nothing_vetoes_the_steps_drafts() -> None:
    """A new request probes beside one that drafts: the drafts pass the veto counting on
    the probe to draft. If the drafter finds no match for it, its request runs as a
    plain one, slower for the others' drafts: ``hold_drafts`` says drop them. If the
    probe drafted, the step stands."""
    for blank in (True, False):
        ctrl = SpecController(k_max=8)
        sim = Sim(ctrl, FLAT, seed=1)
        sim.run(20, accept=0.95, ids=["a"])  # alone, "a" drafts deep
        ks = ctrl.choose(["a", "b"])
        assert ks[0] > 0 and ctrl.probing("b") and ks[1] == ctrl.probe_k
        if blank:
            ctrl.no_draft("b")
        assert ctrl.hold_drafts() is blank
        assert ctrl.vetoes == int(blank)
        assert ctrl.hold_drafts() is False  # once per step


def test_a_vetoed_sets_pause_is_taken_quiet() -> None:
    """The steps a veto holds back cost no planning: the same requests' next steps are
    quiet ones (the speculator then skips its pass over them) for the pause's length."""
    ctrl = SpecController(k_max=8)
    sim = Sim(ctrl, SLOPED, seed=3)
    accept = {"copy": 0.95, "prose": 0.0}
    for _ in range(200):
        before = ctrl.vetoes
        _mixed_run(ctrl, 1, accept, sim)
        if ctrl.vetoes > before and ctrl._veto_until - ctrl._steps >= 4:
            break
    else:
        pytest.fail("no veto with a pause of 4 steps or more")
    pause = ctrl._veto_until - ctrl._steps
    assert all(ctrl.quiet_step((2, 0)) for _ in range(pause))
    assert not ctrl.quiet_step((2, 0))  # the pause is over: plan again


def test_with_nobody_waiting_a_verify_step_has_every_request_in_it() -> None:
    """With nobody waiting, every step that verifies has every request drafting or
    probing: a probe beside a request that does neither is called off (what it learns
    could not be used: the veto would hold the drafts back) and its budget refunded.
    Requests that start together probe together, and copying ones draft together."""
    for accept in ({"a": 0.95, "b": 0.95, "p": 0.0}, {"a": 0.95, "b": 0.9, "c": 0.95}):
        ctrl = SpecController(k_max=8)
        sim = Sim(ctrl, SLOPED, seed=6)
        steps = _mixed_run(ctrl, 300, accept, sim)
        assert all(min(map(abs, ks)) > 0 for ks in steps if any(ks)), steps
        assert all(abs(k) == ctrl.probe_k for k in steps[0])  # all new: all probe
        drafting = sum(1 for ks in steps if any(ks))
        if "p" in accept:
            assert drafting < 30  # a request that never accepts keeps the others off
        else:
            assert drafting > 250


def test_a_due_probe_with_nothing_to_draft_is_not_planned(monkeypatch) -> None:
    """Once a shape's probes passed an evaluation, ``has_match`` is asked first: a due
    probe the drafter has no match for is not evaluated (no cost look-up, no budget
    spent), the request stays off and waits as after a blank probe; once a match
    exists, it probes."""
    ctrl = SpecController(k_max=8, probe_interval=32)
    asked: list[str] = []

    def no_match(request_id: str) -> bool:
        asked.append(request_id)
        return False

    # the shape was never evaluated: the first probe is, and goes ahead (then finds nothing)
    assert ctrl.choose(["a"], has_match=no_match) == [ctrl.probe_k] and asked == []
    ctrl.no_draft("a")
    calls: list[int] = []
    real = ctrl._probe_fits
    monkeypatch.setattr(ctrl, "_probe_fits", lambda plan: calls.append(1) or real(plan))
    budget = ctrl._probe_budget
    ks = [ctrl.choose(["a"], has_match=no_match)[0] for _ in range(30)]
    assert ks == [0] * 30 and calls == [] and len(asked) >= 2
    assert ctrl._probe_budget >= budget and not ctrl.probing("a")
    for _ in range(32):
        ks = ctrl.choose(["a"], has_match=lambda r: True)
        if ks[0]:
            break
    assert ks == [ctrl.probe_k] and ctrl.probing("a") and calls == [1]


def test_a_blank_due_probe_is_company_and_denied_shapes_ask_no_drafter() -> None:
    """A request whose due probe has nothing to draft keeps the step's other probes
    company, as the probe it replaces did (else at c=4 a copying request's probes were
    called off beside it: edit c=4 1.4-2.0x -> 1.1x on the H200). And a shape whose
    probes do not pass an evaluation never asks the drafter, so its quiet steps stay
    quiet (asked first, the look-ups took c=16 steps from 13 to 61 us of host time on
    the H200: nothing matched, so the shape was never evaluated and never denied)."""
    ctrl = SpecController(k_max=8)
    assert ctrl.choose(["a", "b"]) == [ctrl.probe_k] * 2  # the shape's probes pass
    ctrl.no_draft("a")
    ctrl.no_draft("b")
    ctrl.hold_drafts()
    for _ in range(ctrl.probe_interval):
        ks = ctrl.choose(["a", "b"], has_match=lambda r: r == "a")
        if any(ks):
            break
    assert ks == [ctrl.probe_k, 0] and ctrl.probing("a") and not ctrl.probing("b")

    ctrl = SpecController(k_max=8, probe_interval=16)
    ctrl.padded = True  # 16 rows padded to k + 1: STEEP prices any probe too dear
    ids = [f"r{i}" for i in range(16)]
    sim = Sim(ctrl, STEEP)
    asked: list[str] = []

    def has_match(request_id: str) -> bool:  # chat: nothing to copy
        asked.append(request_id)
        return False

    for i in range(16):
        sim.run(1, accept=0.5, ids=ids[: i + 1])
    sim.run(40, accept=0.5, ids=ids)
    quiet = 0
    for _ in range(80):
        if ctrl.quiet_step((16, 0)):
            quiet += 1
            continue
        assert ctrl.choose(ids, has_match=has_match) == [0] * 16
        sim.record(16, [0] * 16)
    assert asked == [] and quiet >= 60, (asked, quiet)


@pytest.mark.parametrize("others,padded", [(0, False), (1, False), (1, True)])
def test_held_back_takes_a_veto_pause_as_choose_does(others: int, padded: bool) -> None:
    """The speculator's steady path asks ``held_back`` before its per-request pass: the
    steps it takes plain must be the ones ``choose`` would have, with the same state after,
    so every later choice is the same. A request the drafter has no match for ("blank")
    makes its probes come back empty, and ``hold_drafts`` then vetoes the copying
    request's drafts: a pause that ``quiet_step`` does not cover (the vetoed step still
    had a probe planned). Compared step for step with a run that only calls ``choose``;
    also with ``others`` tokens of a request that is not decoding (with padded graphs
    ``choose`` then returns before its veto test, and so must ``held_back``)."""
    accept = {"copy": 0.95, "blank": 0.0, "prose": 0.1}
    runs = []
    for steady in (False, True):
        ctrl = SpecController(k_max=8)
        ctrl.padded = padded
        sim = Sim(ctrl, SLOPED, seed=3)
        ids, held, out = list(accept), 0, []
        for _ in range(400):
            if steady and (ctrl.paused() or ctrl.quiet_step((len(ids), others))):
                ks = [0] * len(ids)
            elif steady and ctrl.held_back(tuple(ids), others):
                ks, held = [0] * len(ids), held + 1
            else:
                ks = ctrl.choose(ids, others)
                for i, rid in enumerate(ids):  # the drafter's side, as the speculator's
                    if ks[i] and accept[rid] == 0.0:
                        ctrl.no_draft(rid)
                        ks[i] = 0
                if any(ks) and ctrl.hold_drafts():
                    ks = [k if ctrl.probing(r) else 0 for r, k in zip(ids, ks, strict=True)]
            for rid, k in zip(ids, ks, strict=True):
                if k:
                    sim.verify(rid, k, accept[rid])
            sim.record(len(ids) + others + sum(ks), ks)
            out.append(ks)
        runs.append((out, ctrl.vetoes, ctrl._steps, ctrl._veto_until, held))
    assert runs[0][:4] == runs[1][:4]
    if padded and others:
        assert runs[1][4] == 0 and runs[1][1] == 0  # nothing drafts, nothing is held
    else:
        assert runs[1][4] > 0  # held_back took some steps itself
