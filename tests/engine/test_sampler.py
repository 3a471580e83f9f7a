"""Sampler tests: each feature against a plain float64 reference, plus batch invariance."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from mmserve.engine.sampler import Sampler, SamplingState, sample_from_probs
from mmserve.sampling_params import SamplingParams

V = 1003  # not a multiple of any SIMD width, so row alignment differs inside a batch
EOS = 2


def _logits(rows: int, seed: int, vocab: int = V, scale: float = 3.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(rows, vocab, generator=g) * scale


def _state(**kw: Any) -> SamplingState:
    return SamplingState.create(SamplingParams(**kw), {EOS}, "cpu")


def _ref_probs(logits: torch.Tensor, p: SamplingParams, generated: list[int]) -> torch.Tensor:
    """Straightforward float64 reference for one row (V,)."""
    x = logits.double().clone()
    for tok in set(generated):
        x[tok] -= generated.count(tok) * p.frequency_penalty + p.presence_penalty
    x = x / p.temperature
    probs = torch.softmax(x, -1)
    if p.min_p > 0:
        probs = torch.where(probs >= p.min_p * probs.max(), probs, 0.0)
    if p.top_k > 0:
        kth = sorted(probs.tolist(), reverse=True)[p.top_k - 1]
        probs = torch.where(probs >= kth, probs, 0.0)
    probs = probs / probs.sum()
    if p.top_p < 1.0:
        order = sorted(range(len(probs)), key=lambda i: (-probs[i].item(), i))
        keep, mass = torch.zeros_like(probs, dtype=torch.bool), 0.0
        for i in order:
            if mass >= p.top_p:
                break
            keep[i], mass = True, mass + probs[i].item()
        probs = torch.where(keep, probs, 0.0)
    return probs / probs.sum()


def test_greedy_is_argmax_lowest_id_on_ties() -> None:
    logits = _logits(4, 0)
    logits[1, 10] = logits[1, 500] = logits[1].max() + 1.0  # tie: id 10 must win
    res = Sampler().sample(logits, [_state(temperature=0.0) for _ in range(4)])
    expected = logits.argmax(-1).tolist()
    assert res.token_ids == expected and res.token_ids[1] == 10
    probs = Sampler().probs(logits, [_state(temperature=0.0) for _ in range(4)])
    assert torch.equal(probs, torch.nn.functional.one_hot(logits.argmax(-1), V).float())


def _run(logits_seq: list[torch.Tensor], states: list[SamplingState], row: int) -> list[int]:
    sampler, out = Sampler(), []
    for logits in logits_seq:
        ids = sampler.sample(logits, states).token_ids
        for s, t in zip(states, ids, strict=True):
            s.observe(t)
        out.append(ids[row])
    return out


MIXED = dict(
    temperature=0.8,
    top_k=50,
    top_p=0.9,
    min_p=0.02,
    presence_penalty=0.5,
    frequency_penalty=0.3,
    seed=1234,
)


def test_seeded_sampling_is_reproducible_and_batch_invariant() -> None:
    steps = [_logits(9, 100 + t) for t in range(40)]
    alone = _run([x[4:5] for x in steps], [_state(**MIXED)], 0)
    again = _run([x[4:5] for x in steps], [_state(**MIXED)], 0)
    others = [_state(temperature=0.5 + 0.1 * i, top_p=0.8, seed=i) for i in range(8)]
    others[2] = _state(temperature=0.0)
    batched = _run(steps, others[:4] + [_state(**MIXED)] + others[4:], 4)
    assert alone == again == batched
    assert len(set(alone)) > 5  # really sampled, not stuck on one token


def test_probs_are_bitwise_batch_invariant() -> None:
    logits = _logits(9, 7)
    states = [_state(temperature=0.3 + 0.2 * i, top_k=i * 40, top_p=1 - 0.05 * i) for i in range(9)]
    batched = Sampler().probs(logits, states)
    for i in range(9):
        assert torch.equal(Sampler().probs(logits[i : i + 1], [states[i]])[0], batched[i])


@pytest.mark.parametrize(
    "kw",
    [
        dict(top_k=7),
        dict(top_k=200, temperature=0.7),
        dict(top_p=0.5),
        dict(top_p=0.93),
        dict(min_p=0.05),
        dict(min_p=0.2, temperature=1.5),
        dict(top_k=100, top_p=0.8, min_p=0.01),
        dict(top_p=0.9, presence_penalty=1.0, frequency_penalty=-0.5),
    ],
)
def test_filters_match_float64_reference(kw: dict) -> None:
    params = SamplingParams(**kw)
    generated = [5, 5, 9, 700, 5]
    logits = _logits(3, 11)
    logits[:, generated] += 4.0  # make the penalized tokens matter
    states = [SamplingState.create(params, {EOS}, "cpu") for _ in range(3)]
    for s in states:
        for t in generated:
            s.observe(t)
    got = Sampler().probs(logits, states)
    for i in range(3):
        ref = _ref_probs(logits[i], params, generated)
        assert torch.equal(got[i] > 0, ref > 0), kw  # the kept set is exact
        torch.testing.assert_close(got[i].double(), ref, atol=1e-6, rtol=1e-4)


def test_top_k_keeps_ties_at_kth() -> None:
    logits = torch.tensor([[1.0, 3.0, 2.0, 2.0, 0.0]])
    probs = Sampler().probs(logits, [_state(top_k=2)])
    assert (probs[0] > 0).tolist() == [False, True, True, True, False]


def test_extra_tokens_equal_observed_tokens() -> None:
    kw = dict(temperature=0.9, presence_penalty=0.7, frequency_penalty=0.4, min_tokens=3)
    logits = _logits(3, 3)
    logits[:, EOS] += 10.0
    shared = _state(**kw)
    spec = Sampler().probs(logits, [shared] * 3, extra_tokens=[[], [8], [8, 8]])
    for i, extra in enumerate([[], [8], [8, 8]]):
        s = _state(**kw)
        for t in extra:
            s.observe(t)
        assert torch.equal(Sampler().probs(logits[i : i + 1], [s])[0], spec[i])
    assert spec[0, EOS] == 0 and spec[2, EOS] == 0


def test_min_tokens_bans_eos_and_stop_ids_until_reached() -> None:
    logits = torch.zeros(1, 10)
    logits[0, EOS], logits[0, 7] = 50.0, 40.0
    s = _state(temperature=0.0, min_tokens=2, stop_token_ids=[7])
    assert Sampler().sample(logits, [s]).token_ids[0] not in (EOS, 7)
    s.observe(3)
    s.observe(4)
    assert Sampler().sample(logits, [s]).token_ids == [EOS]
    ignore = _state(temperature=0.0, min_tokens=2, ignore_eos=True)
    assert Sampler().sample(logits, [ignore]).token_ids == [EOS]


def test_logprobs_are_raw_log_softmax() -> None:
    logits = _logits(3, 5)
    states = [
        _state(temperature=0.5, presence_penalty=1.0, logprobs=5, seed=1),
        _state(logprobs=None),
        _state(temperature=0.0, logprobs=0),
    ]
    states[0].observe(int(logits[0].argmax()))
    res = Sampler().sample(logits, states)
    ref = torch.log_softmax(logits.double(), -1)
    first = res.logprobs[0]
    assert first is not None and len(first) == 6
    assert first[0][0] == res.token_ids[0]
    top_ids = ref[0].topk(5).indices.tolist()
    assert [t for t, _ in first[1:]] == top_ids
    for tok, lp in first:
        assert math.isclose(lp, ref[0, tok].item(), abs_tol=1e-5)
    assert res.logprobs[1] is None
    assert res.logprobs[2] == [(res.token_ids[2], pytest.approx(ref[2].max().item(), abs=1e-5))]


def test_sample_from_probs_matches_sample() -> None:
    logits = _logits(1, 9)
    a, b = (
        _state(temperature=0.7, top_p=0.95, seed=42),
        _state(temperature=0.7, top_p=0.95, seed=42),
    )
    for _ in range(20):
        token = Sampler().sample(logits, [a]).token_ids[0]
        probs = Sampler().probs(logits, [b])[0]
        assert sample_from_probs(probs, b.generator) == token


def _chi2_quantile_999(dof: int) -> float:
    """Wilson-Hilferty approximation of the 99.9% chi-square quantile."""
    a = 2.0 / (9.0 * dof)
    return dof * (1.0 - a + 3.090 * math.sqrt(a)) ** 3


def _chi_square(counts: torch.Tensor, probs: torch.Tensor) -> tuple[float, int]:
    n = counts.sum().item()
    keep = probs > 0
    expected = probs[keep] * n
    return float(((counts[keep] - expected) ** 2 / expected).sum()), int(keep.sum()) - 1


@pytest.mark.parametrize("kw", [dict(temperature=0.7), dict(temperature=1.6, top_k=6)])
def test_sampling_frequencies_match_distribution(kw: dict) -> None:
    vocab, rows, steps = 12, 500, 40
    logits = _logits(1, 21, vocab=vocab, scale=1.0).expand(rows, vocab)
    states = [_state(seed=1000 + i, **kw) for i in range(rows)]
    counts = torch.zeros(vocab, dtype=torch.float64)
    for _ in range(steps):
        for t in Sampler().sample(logits, states).token_ids:
            counts[t] += 1
    ref = _ref_probs(logits[0], SamplingParams(**kw), [])
    stat, dof = _chi_square(counts, ref)
    assert counts[ref == 0].sum() == 0
    assert stat < _chi2_quantile_999(dof), (stat, dof, counts / counts.sum(), ref)


def test_greedy_rows_with_penalties_or_min_tokens_still_get_them() -> None:
    """All-greedy rows with nothing to apply take the logits' argmax directly; one row
    with a penalty or an active min_tokens sends the batch through ``process`` and that
    row (only) gets its adjustment, in a greedy verify's rows too (``extra_tokens``)."""
    logits = _logits(4, 7)
    top = logits.argmax(-1).tolist()
    plain = [_state(temperature=0.0) for _ in range(4)]
    assert Sampler().sample(logits, plain).token_ids == top
    second = logits[1].topk(2).values[1]
    logits[1, top[1]] = second + 0.5  # row 1's best by a margin a penalty of 2 overturns
    penalised = _state(temperature=0.0, presence_penalty=2.0)
    penalised.observe(top[1])
    banned = _state(temperature=0.0, min_tokens=3)
    logits[2, EOS] = logits[2].max() + 5.0  # row 2 wants EOS before min_tokens
    states = [plain[0], penalised, banned, plain[3]]
    want1, want2 = logits[1].clone(), logits[2].clone()
    want1[top[1]] -= 2.0
    want2[EOS] = float("-inf")
    got = Sampler().sample(logits, states, [[], [], [7], []]).token_ids
    assert got == [top[0], int(want1.argmax()), int(want2.argmax()), top[3]]
    assert got[1] != top[1] and got[2] != EOS
    banned.num_generated = 2  # with the extra verify token min_tokens is reached: EOS allowed
    assert Sampler().sample(logits, states, [[], [], [7], []]).token_ids[2] == EOS
