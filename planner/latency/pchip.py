"""Monotone piecewise-cubic (PCHIP) interpolant with a pure-Python scalar path.

Built once per profile; a scalar lookup is a bisect plus one cubic (a few
microseconds, no numpy call), `many` evaluates arrays.
"""

from __future__ import annotations

import bisect
import math

import numpy as np
from scipy.interpolate import PchipInterpolator


class Pchip:
    """PCHIP in x with a pure-Python scalar path; x strictly increasing.

    log_log: fit log(y) against log(x) and return exp() of it (needs x, y > 0;
    falls back to linear axes otherwise). One point gives a constant. Outside
    [x0, xn] the end value is returned (callers clamp and warn before calling).
    """

    __slots__ = ("x", "lo", "hi", "log_log", "_bp", "_coef", "_const", "_vec")

    def __init__(self, x: np.ndarray, y: np.ndarray, *, log_log: bool = False):
        self.x = np.asarray(x, dtype=float)
        y = np.asarray(y, dtype=float)
        self.lo = float(self.x[0])
        self.hi = float(self.x[-1])
        self.log_log = bool(log_log and np.all(self.x > 0) and np.all(y > 0))
        if len(x) == 1:
            self._const = float(y[0])
            self._bp: list[float] = []
            self._coef: list[tuple[float, float, float, float]] = []
            self._vec = None
            return
        self._const = None
        u, v = (np.log(self.x), np.log(y)) if self.log_log else (self.x, y)
        self._vec = PchipInterpolator(u, v, extrapolate=False)
        c = self._vec.c  # (4, n-1): highest power first, local to each left breakpoint
        self._bp = [float(b) for b in u[:-1]]
        self._coef = [(float(c[0, i]), float(c[1, i]), float(c[2, i]), float(c[3, i])) for i in range(c.shape[1])]

    def __call__(self, x: float) -> float:
        if self._const is not None:
            return self._const
        if x <= self.lo:
            x = self.lo
        elif x >= self.hi:
            x = self.hi
        u = math.log(x) if self.log_log else x
        i = bisect.bisect_right(self._bp, u) - 1
        a, b, c, d = self._coef[i]
        t = u - self._bp[i]
        v = ((a * t + b) * t + c) * t + d
        return math.exp(v) if self.log_log else v

    def many(self, x: np.ndarray) -> np.ndarray:
        x = np.asarray(x, dtype=float)
        if self._const is not None:
            return np.full(x.shape, self._const)
        x = np.clip(x, self.lo, self.hi)
        if self.log_log:
            return np.exp(self._vec(np.log(x)))
        return self._vec(x)



__all__ = ["Pchip"]
