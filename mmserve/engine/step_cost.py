"""How long a step takes, learned from the steps the engine runs.

``seconds ~ a + b * rows + c * prefill_tokens``, fitted by least squares with exponential
forgetting (recent steps weigh most, so the fit follows the machine and the load), with a
small ridge on ``b`` and ``c`` so that steps of one size alone (nothing yet to tell the
per-row cost from the fixed cost) give the fixed cost, not a guess at the slope.
Coefficients are clamped at zero: a step never gets cheaper with more rows.
"""

from __future__ import annotations

import numpy as np


class StepCost:
    def __init__(self, decay: float = 0.98, ridge: float = 1e-9) -> None:
        self.decay, self.ridge = decay, ridge
        self.xtx = np.zeros((3, 3))
        self.xty = np.zeros(3)
        self.samples = 0
        self.max_rows = 0
        self._coef: np.ndarray | None = None

    def record(self, rows: int, tokens: int, seconds: float) -> None:
        """One step of ``rows`` sequences and ``tokens`` tokens took ``seconds``."""
        if rows < 1 or not seconds > 0:
            return
        x = np.array([1.0, rows, max(0, tokens - rows)])
        self.xtx = self.xtx * self.decay + np.outer(x, x)
        self.xty = self.xty * self.decay + x * seconds
        self.samples += 1
        self.max_rows = max(self.max_rows, rows)
        self._coef = None

    @property
    def ready(self) -> bool:
        return self.samples >= 4

    def coef(self) -> np.ndarray:
        if self._coef is None:
            reg = self.xtx + np.diag([0.0, self.ridge, self.ridge]) * max(1.0, self.xtx[0, 0])
            try:
                c = np.linalg.solve(reg + np.eye(3) * 1e-12, self.xty)
            except np.linalg.LinAlgError:
                c = np.array([self.xty[0] / max(self.xtx[0, 0], 1e-12), 0.0, 0.0])
            self._coef = np.maximum(c, 0.0)
        return self._coef

    def predict(self, rows: int, prefill_tokens: int = 0) -> float:
        """Seconds a step of ``rows`` decoding sequences (plus prefill tokens) should take."""
        a, b, c = self.coef()
        return float(a + b * rows + c * prefill_tokens)
