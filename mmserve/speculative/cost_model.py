"""Online model of what one target forward step costs, as a function of its query tokens.

Measured step times are kept as an EWMA per bucket of query-token counts (exact up
to 16 tokens, then four buckets per octave). ``cost(t)`` interpolates linearly
between measured buckets. Outside them it extrapolates from the nearest measurement
with a prior shape ``1 + t / knee_tokens`` (flat while memory bound, linear once
compute bound), but never less steeply than the slope measured at that end of the
data (upper half / lowest octave, at least two points), and below the data never
under cost proportional to tokens. Unmeasured sizes are thus guessed against
speculation. With no measurement at all, the prior shape is used alone, in seconds,
from ``default_step_seconds`` at one token. The engine can seed the model during
warm-up (e.g. CUDA-graph capture at several batch sizes) through ``record``.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass


@dataclass
class _Point:
    tokens: float  # EWMA of the token counts recorded in this bucket
    seconds: float  # EWMA of their step times
    count: int = 1  # steps recorded (the first is replaced by the second)


def _bucket(num_tokens: int) -> int:
    if num_tokens <= 16:
        return num_tokens
    bits = num_tokens.bit_length()  # >= 5
    return 17 + 4 * (bits - 5) + ((num_tokens >> (bits - 3)) & 3)


class StepCostModel:
    """EWMA step seconds keyed by bucketed query-token count; see the module docstring."""

    def __init__(
        self, alpha: float = 0.2, default_step_seconds: float = 0.01, knee_tokens: float = 256.0
    ) -> None:
        if not 0.0 < alpha <= 1.0 or default_step_seconds <= 0 or knee_tokens <= 0:
            raise ValueError(
                "cost model needs 0 < alpha <= 1, default_step_seconds > 0 and knee_tokens > 0"
            )
        self.alpha = alpha
        self.default_step_seconds = default_step_seconds
        self.knee_tokens = knee_tokens
        self._points: dict[int, _Point] = {}
        self._xs: list[float] = []
        self._ys: list[float] = []
        self._tail_slope = 0.0  # measured slope of the upper half of the data
        self._head_slope = 0.0  # measured slope of the lowest octave of the data
        self._stale = False  # points changed since the curve was last built (built on use:
        # a step where nobody drafts records its cost and never asks for one)
        self._order: list[_Point] = []  # the points by bucket (rebuilt when one is added)
        self._slopes_valid = False
        # cost() by token count since the last refresh: a planned step asks for the same
        # few sizes 10-16 times (~3 us each on the dev CPU), and the verify curve is not
        # recorded on plain steps, so its answers last until the next verify step
        self._memo: dict[int, float] = {}

    @property
    def measured(self) -> bool:
        """Whether any step has been recorded."""
        return bool(self._points)

    def has_bucket(self, num_tokens: int) -> bool:
        """Whether steps of about this size have been measured (twice: see ``record``)."""
        point = self._points.get(_bucket(max(num_tokens, 1)))
        return point is not None and point.count >= 2

    def record(self, num_tokens: int, seconds: float) -> None:
        """Fold in one measured step of ``num_tokens`` query tokens taking ``seconds``.

        A bucket's first step stands only until its second replaces it: the first step
        of a shape carries one-off costs (a CUDA graph's first replay is markedly slower
        than later ones), and a bucket a controller then avoids would never be corrected."""
        if num_tokens < 1 or not seconds > 0.0:
            return  # nothing to learn from an empty or unmeasured step
        point = self._points.get(_bucket(num_tokens))
        if point is None:
            self._points[_bucket(num_tokens)] = _Point(float(num_tokens), seconds)
        elif point.count == 1:
            point.tokens, point.seconds, point.count = float(num_tokens), seconds, 2
        else:
            point.tokens += self.alpha * (num_tokens - point.tokens)
            point.seconds += self.alpha * (seconds - point.seconds)
            point.count += 1
        self._stale = True

    def cost(self, num_tokens: int) -> float:
        """Predicted seconds of a step with ``num_tokens`` query tokens."""
        if self._stale:
            self._refresh()
        cost = self._memo.get(num_tokens)
        if cost is None:
            cost = self._memo[num_tokens] = self._curve(float(max(num_tokens, 1)))
        return cost

    def _curve(self, t: float) -> float:
        xs, ys = self._xs, self._ys
        if not xs:
            return self.default_step_seconds * self._shape(t) / self._shape(1.0)
        if t <= xs[0]:
            scaled = ys[0] * self._shape(t) / self._shape(xs[0])
            return max(min(scaled, ys[0] - self._slopes()[0] * (xs[0] - t)), ys[0] * t / xs[0])
        if t >= xs[-1]:
            scaled = ys[-1] * self._shape(t) / self._shape(xs[-1])
            return max(scaled, ys[-1] + self._slopes()[1] * (t - xs[-1]))
        i = bisect.bisect_right(xs, t)
        x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
        return y0 + (y1 - y0) * (t - x0) / (x1 - x0)

    def _shape(self, t: float) -> float:
        return 1.0 + t / self.knee_tokens

    def _refresh(self) -> None:
        """Rebuild the curve from the points (each ``cost`` after a ``record``: one a step
        while requests draft, so the slopes, needed only outside the measured range, wait
        for their first use)."""
        self._stale = False
        self._memo.clear()
        if len(self._order) != len(self._points):
            self._order = [self._points[b] for b in sorted(self._points)]
        self._xs = [p.tokens for p in self._order]
        self._ys = [p.seconds for p in self._order]
        self._slopes_valid = False

    def _slopes(self) -> tuple[float, float]:
        """(head, tail): least-squares slopes of the lowest octave and the upper half of
        the points; at least the two outermost points each, so one far-away bucket still
        gives a slope."""
        if not self._slopes_valid:
            xs, ys, n = self._xs, self._ys, len(self._xs)
            upper = [i for i, x in enumerate(xs) if x >= xs[-1] / 2 or i >= n - 2]
            lower = [i for i, x in enumerate(xs) if x <= xs[0] * 2 or i < 2]
            self._head_slope = _slope([xs[i] for i in lower], [ys[i] for i in lower])
            self._tail_slope = _slope([xs[i] for i in upper], [ys[i] for i in upper])
            self._slopes_valid = True
        return self._head_slope, self._tail_slope


def _slope(xs: list[float], ys: list[float]) -> float:
    """Least-squares slope (>= 0) of the points; 0 with fewer than two distinct x."""
    if len(xs) < 2:
        return 0.0
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    var = sum((x - mx) ** 2 for x in xs)
    if var <= 0.0:
        return 0.0
    return max(0.0, sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / var)
