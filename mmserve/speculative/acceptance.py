"""Acceptance statistics per draft position: per request (for choosing k) and overall.

The model: ``a_i = P(draft token i accepted | tokens 0..i-1 accepted)``. A draft of
``d`` tokens of which ``m`` were accepted is evidence "accepted" at positions
``0..m-1`` and, if ``m < d``, "rejected" at position ``m``; later positions were not
tested. The expected number of accepted tokens with ``k`` drafted is
``E(k) = sum_{j=1..k} prod_{i<=j} a_i``.

Per request, ``a_i`` is a Beta posterior mean whose pseudo-counts decay with each
observation (recent steps weigh more). Its prior mean at position ``i`` comes from the
population of all requests at ``i``, which itself falls back to position ``i - 1``
(and to ``prior_accept`` at position 0), so a fresh request starts at the population's
acceptance and deeper, untested positions borrow from shallower ones.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

_POPULATION_DECAY = 0.999  # the population adapts over ~1000 drafts
_POPULATION_STRENGTH = 5.0  # pseudo-counts tying a position to the one before it


class SpecTotals(NamedTuple):
    num_drafts: int  # verified drafts with at least one token
    num_draft_tokens: int
    num_accepted_tokens: int


@dataclass
class RequestAcceptance:
    """Decayed accept/reject pseudo-counts per draft position of one request."""

    accepts: list[float]
    rejects: list[float]

    @classmethod
    def empty(cls, k_max: int) -> RequestAcceptance:
        return cls([0.0] * k_max, [0.0] * k_max)

    def observe(self, num_drafted: int, num_accepted: int, decay: float) -> None:
        for i in range(min(num_accepted + 1, num_drafted, len(self.accepts))):
            self.accepts[i] *= decay
            self.rejects[i] *= decay
            if i < num_accepted:
                self.accepts[i] += 1.0
            else:
                self.rejects[i] += 1.0

    def shrink(self, factor: float) -> None:
        """Move toward the prior (forget part of the evidence)."""
        self.accepts = [a * factor for a in self.accepts]
        self.rejects = [r * factor for r in self.rejects]

    def rates(self, prior: list[float], strength: float) -> list[float]:
        return [
            (a + strength * m) / (a + r + strength)
            for a, r, m in zip(self.accepts, self.rejects, prior, strict=True)
        ]


def expected_accepted(rates: list[float]) -> list[float]:
    """``E(k)`` for k = 0..len(rates): expected accepted tokens when drafting k."""
    out, survive = [0.0], 1.0
    for a in rates:
        survive *= a
        out.append(out[-1] + survive)
    return out


@dataclass
class PopulationAcceptance:
    """Counters over all requests: the metrics, and the prior for new requests."""

    k_max: int
    prior_accept: float
    drafted: list[int] = field(init=False)  # drafts that reached position i (len > i)
    accepted: list[int] = field(init=False)  # drafts accepted at position i
    num_drafts: int = field(default=0, init=False)
    _cond_accepts: list[float] = field(init=False)
    _cond_tests: list[float] = field(init=False)

    def __post_init__(self) -> None:
        self.drafted = [0] * self.k_max
        self.accepted = [0] * self.k_max
        self._cond_accepts = [0.0] * self.k_max
        self._cond_tests = [0.0] * self.k_max

    def observe(self, num_drafted: int, num_accepted: int) -> None:
        if num_drafted <= 0:
            return
        self.num_drafts += 1
        for i in range(min(num_drafted, self.k_max)):
            self.drafted[i] += 1
            self.accepted[i] += int(i < num_accepted)
        for i in range(min(num_accepted + 1, num_drafted, self.k_max)):
            self._cond_accepts[i] = self._cond_accepts[i] * _POPULATION_DECAY + (i < num_accepted)
            self._cond_tests[i] = self._cond_tests[i] * _POPULATION_DECAY + 1.0

    def prior_rates(self) -> list[float]:
        """Population estimate of ``a_i``, each position shrunk toward the one before it."""
        out, previous = [], self.prior_accept
        for acc, tests in zip(self._cond_accepts, self._cond_tests, strict=True):
            previous = (acc + _POPULATION_STRENGTH * previous) / (tests + _POPULATION_STRENGTH)
            out.append(previous)
        return out

    def by_position(self) -> list[float]:
        """P(draft token i accepted) over all drafts that drafted position i (0.0 if none)."""
        return [a / d if d else 0.0 for a, d in zip(self.accepted, self.drafted, strict=True)]

    def totals(self) -> SpecTotals:
        return SpecTotals(self.num_drafts, sum(self.drafted), sum(self.accepted))
