"""Verification: greedy exactness, and statistical losslessness of rejection sampling.

The statistical tests compare emitted-token histograms with the target distribution by
a chi-square statistic against its 1e-6 upper quantile (fixed seeds, so they cannot
flake), and prove their power by catching a deliberately wrong residual.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from collections.abc import Callable

import pytest
import torch

from mmserve.speculative import verify
from mmserve.speculative.verify import greedy_verify, rejection_sample

V = 5


def test_greedy_verify_exhaustive() -> None:
    for k in range(4):
        for draft in itertools.product(range(3), repeat=k):
            for target in itertools.product(range(3), repeat=k + 1):
                out = greedy_verify(list(target), list(draft))
                m = next((i for i in range(k) if draft[i] != target[i]), k)
                assert out == list(draft[:m]) + [target[m]]
    with pytest.raises(ValueError, match="len\\(draft\\) \\+ 1"):
        greedy_verify([1, 2], [1, 2])


def test_greedy_speculation_reproduces_greedy_decoding() -> None:
    """With any drafts, greedy verification yields exactly the target's greedy sequence."""
    target = lambda ctx: hash(tuple(ctx[-3:])) % 4  # deterministic toy "model"
    plain = [1]
    while len(plain) < 60:
        plain.append(target(plain))
    gen = torch.Generator().manual_seed(0)
    spec = [1]
    while len(spec) < 60:
        k = int(torch.randint(0, 5, (1,), generator=gen))
        draft, ctx = [], list(spec)
        for _ in range(k):  # a drafter that is right most of the time
            guess = target(ctx) if torch.rand(1, generator=gen) < 0.7 else 3
            draft.append(guess)
            ctx.append(guess)
        argmax = [target(spec + draft[:i]) for i in range(k + 1)]
        spec += greedy_verify(argmax, draft)
    assert spec[:60] == plain


def chi2_bound(df: int) -> float:
    """Upper 1e-6 quantile of chi-square(df) (Wilson-Hilferty)."""
    z = 4.75
    return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


def chi2(counts: Counter, expected: dict, trials: int) -> float:
    assert sum(counts.values()) == trials and set(counts) <= set(expected)
    return sum((counts.get(c, 0) - trials * p) ** 2 / (trials * p) for c, p in expected.items())


def random_dist(*shape: int) -> torch.Tensor:
    """Random distributions over V with every probability >= 0.3 / V (no empty cells).
    Drawn from the global RNG, which each harness seeds."""
    raw = torch.distributions.Dirichlet(torch.ones(V)).sample(shape)
    return 0.7 * raw + 0.3 / V


def first_token_counts(
    p: torch.Tensor, q: torch.Tensor | None, trials: int, seed: int, fixed: int | None = None
) -> Counter:
    """k = 1: draft x ~ q (or the given fixed/random token with one-hot q), verify, count the
    first emitted token."""
    verify_gen, draft_gen = torch.Generator().manual_seed(seed), torch.Generator().manual_seed(99)
    counts: Counter = Counter()
    target = torch.stack([p, p])  # row 1 (the bonus distribution) does not matter here
    for _ in range(trials):
        if q is not None:
            x = int(torch.multinomial(q, 1, generator=draft_gen))
        else:
            x = fixed if fixed is not None else int(torch.randint(V, (1,), generator=draft_gen))
        probs = q.unsqueeze(0) if q is not None else None
        counts[rejection_sample(target, [x], probs, verify_gen)[0]] += 1
    return counts


CASES = ["real_q", "one_hot_fixed", "one_hot_random"]


def run_first_token(case: str, seed: int, trials: int = 12000) -> float:
    torch.manual_seed(seed)
    p, q = random_dist(2)
    fixed = int(torch.argsort(p)[V // 2])  # a token of middling probability
    counts = first_token_counts(
        p, q if case == "real_q" else None, trials, seed, fixed if case == "one_hot_fixed" else None
    )
    return chi2(counts, {y: float(p[y]) for y in range(V)}, trials)


def run_joint_two(real_q: bool, seed: int, trials: int = 15000) -> float:
    """k = 2 with a target whose second distribution depends on the first token: the joint
    of the first two emitted tokens (the second from a plain target step when only one
    token came out) must be p1(a) * p2(b | a)."""
    torch.manual_seed(seed)
    p1, q1 = random_dist(2)
    p2, q2 = random_dist(V), random_dist(V)  # (V, V) rows
    p3 = random_dist(V, V)
    verify_gen, draft_gen = torch.Generator().manual_seed(seed), torch.Generator().manual_seed(7)
    counts: Counter = Counter()
    for _ in range(trials):
        if real_q:
            x1 = int(torch.multinomial(q1, 1, generator=draft_gen))
            x2 = int(torch.multinomial(q2[x1], 1, generator=draft_gen))
            probs = torch.stack([q1, q2[x1]])
        else:
            x1, x2 = int(torch.argmax(q1)), int(torch.argmax(q2[int(torch.argmax(q1))]))
            probs = None
        out = rejection_sample(torch.stack([p1, p2[x1], p3[x1, x2]]), [x1, x2], probs, verify_gen)
        if len(out) == 1:
            out.append(int(torch.multinomial(p2[out[0]], 1, generator=verify_gen)))
        counts[(out[0], out[1])] += 1
    expected = {(a, b): float(p1[a] * p2[a, b]) for a in range(V) for b in range(V)}
    return chi2(counts, expected, trials)


@pytest.mark.parametrize("case", CASES)
def test_first_token_follows_target(case: str) -> None:
    assert run_first_token(case, seed=1) < chi2_bound(V - 1)


@pytest.mark.parametrize("real_q", [True, False])
def test_first_two_tokens_follow_target(real_q: bool) -> None:
    assert run_joint_two(real_q, seed=2) < chi2_bound(V * V - 1)


WRONG_RESIDUALS: dict[str, Callable] = {
    "residual_from_p": lambda p, q, token: p.float(),
    "residual_from_q": lambda p, q, token: q.float() if q is not None else p.float(),
}


@pytest.mark.parametrize(
    ("wrong", "case"),
    [
        ("residual_from_p", "real_q"),
        ("residual_from_p", "one_hot_fixed"),
        ("residual_from_q", "real_q"),
    ],
)
def test_wrong_residual_is_detected(monkeypatch: pytest.MonkeyPatch, wrong: str, case: str) -> None:
    """The same harness fails when the rejection residual is wrong (the test has power)."""
    monkeypatch.setattr(verify, "_residual", WRONG_RESIDUALS[wrong])
    assert run_first_token(case, seed=1) > chi2_bound(V - 1)


@pytest.mark.parametrize("real_q", [True, False])
def test_wrong_residual_detected_jointly(monkeypatch: pytest.MonkeyPatch, real_q: bool) -> None:
    monkeypatch.setattr(verify, "_residual", WRONG_RESIDUALS["residual_from_p"])
    assert run_joint_two(real_q, seed=2) > chi2_bound(V * V - 1)


def test_zero_probability_edge_cases() -> None:
    gen = torch.Generator().manual_seed(0)
    p = torch.tensor([[0.0, 0.5, 0.5], [1 / 3, 1 / 3, 1 / 3]])
    for _ in range(200):  # p(x) = 0: never accepted, never emitted
        assert rejection_sample(p, [0], None, gen)[0] != 0
        assert rejection_sample(p, [0], torch.tensor([[0.9, 0.1, 0.0]]), gen)[0] != 0
    p = torch.tensor([[0.2, 0.8, 0.0], [0.0, 0.0, 1.0]])
    for _ in range(50):  # q(x) = 0 < p(x): always accepted (then the bonus token 2)
        assert rejection_sample(p, [1], torch.tensor([[1.0, 0.0, 0.0]]), gen) == [1, 2]
    pq = torch.tensor([[0.5, 0.5, 0.0]])
    for _ in range(50):  # residual max(0, p - q) is all zero: falls back to p
        assert rejection_sample(torch.cat([pq, pq]), [2], pq, gen)[0] in (0, 1)
    one_hot = torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 1.0]])
    assert rejection_sample(one_hot, [1], None, gen) == [1, 2]
    assert rejection_sample(one_hot, [0], None, gen) == [1]


def test_deterministic_shapes_and_dtypes() -> None:
    torch.manual_seed(3)
    p = torch.softmax(torch.randn(4, 50), -1)
    q = torch.softmax(torch.randn(3, 50), -1)
    run = lambda seed, t: rejection_sample(t, [3, 7, 9], q, torch.Generator().manual_seed(seed))
    outs = [run(s, p) for s in range(20)]
    assert outs == [run(s, p) for s in range(20)]
    assert all(1 <= len(o) <= 4 for o in outs) and len(set(map(tuple, outs))) > 1
    assert all(len(run(s, p.bfloat16())) >= 1 for s in range(5))
    assert len(rejection_sample(p[:1], [], None, torch.Generator())) == 1
    with pytest.raises(ValueError, match="target_probs must be"):
        rejection_sample(p, [1], None, torch.Generator())
    with pytest.raises(ValueError, match="draft_probs must be"):
        rejection_sample(p, [1, 2, 3], q[:2], torch.Generator())
