"""Level-only exponential smoothing in statsmodels' own arithmetic: its fit and its run, without statsmodels.

Simple exponential smoothing is the planner's default exponential smoothing
(`planner.predictors.ets`). statsmodels' Holt-Winters fits it in four steps:
the initial level ("estimated" initialisation: the first point below 10
points, else the intercept of a line through the first 10), a grid of 87
smoothing levels scored by their sum of squared one-step errors, then
L-BFGS-B over (smoothing level mapped to [0, 1], initial level) from the best
grid point. `fit_level_only` takes the same steps with the same floating-point
operations in the same order and the same SciPy optimiser, so it returns
statsmodels' smoothing level and initial level bit for bit; `LevelRun` runs
the levels at fixed parameters. Neither imports statsmodels or pandas (about
0.25 s on the first fit of a process).
"""

from __future__ import annotations

import functools

import numpy as np
from scipy.optimize import minimize

# statsmodels' bounds for the smoothing level: (0, 1) narrowed by sqrt(machine epsilon) at both ends.
_LOWER_BOUND = np.sqrt(np.finfo(float).eps)
_ALPHA_LB = max(_LOWER_BOUND, 0.0)
_ALPHA_UB = min(1 - _LOWER_BOUND, 1.0)
# Its starting grid: 87 smoothing levels, half a percent in from either bound.
_GRID = np.linspace(0.0 + 0.005 * (1.0 - 0.0), 1.0 - 0.005 * (1.0 - 0.0), 87)
# L-BFGS-B's forward differences without a gradient: an absolute step of 1e-8 (its `eps`), or, where that step
# is lost in x's rounding, SciPy's relative step sqrt(machine epsilon) * max(1, |x|).
_FD_STEP = 1e-8
_FD_RELATIVE = np.finfo(float).eps ** 0.5


def initial_level(z: np.ndarray) -> float:
    """statsmodels' "estimated" initial level of a level-only model: z[0] below 10 points, else a fitted intercept.

    From 10 points, the intercept of the least-squares line through the first
    10 (statsmodels' heuristic initialisation, the same pseudo-inverse product).
    """
    z = np.asarray(z, dtype=float)
    if z.size < 10:
        return z[0]
    return np.squeeze(_line_pinv().dot(np.atleast_2d(z).T[:10]))[0]


@functools.cache
def _line_pinv() -> np.ndarray:
    """The pseudo-inverse of [1, k] for k = 1..10 (`initial_level`'s design matrix): the same on every call."""
    exog = np.c_[np.ones(10), np.arange(10) + 1]
    pinv = np.linalg.pinv(exog)
    pinv.flags.writeable = False
    return pinv


def _grid_sse(z: np.ndarray, level0: float) -> list[float]:
    """Sum of squared one-step errors for every grid smoothing level, each as statsmodels computes it."""
    alphac = 1 - _GRID
    y_alpha = np.multiply.outer(z, _GRID)
    levels = np.empty((z.size, _GRID.size))
    levels[0] = level0
    for i in range(1, z.size):
        np.add(y_alpha[i - 1], alphac * levels[i - 1], out=levels[i])
    errors = np.ascontiguousarray((z[:, None] - levels).T)
    return [e.T @ e for e in errors]


def _sse(z: np.ndarray, z_list: list[float], alpha: float, level0: float) -> float:
    """Sum of squared one-step errors at one smoothing level and initial level (statsmodels' holt__ objective)."""
    alphac = 1 - alpha
    level = level0
    levels = [level]
    for y in z_list[:-1]:
        level = (alpha * y) + (alphac * level)
        levels.append(level)
    err = z - np.array(levels)
    return err.T @ err


def fit_level_only(z: np.ndarray) -> tuple[float, float]:
    """(smoothing level, initial level) of a level-only model fitted to z, as statsmodels' `fit()` gives them.

    z: the series, no gaps (at least one point).
    """
    z = np.ascontiguousarray(z, dtype=float)
    if z.ndim != 1 or z.size == 0 or not np.isfinite(z).all():
        raise ValueError(f"fit_level_only: z must be a non-empty 1-d series of finite values, got shape {z.shape}")
    level0 = initial_level(z)
    best_val, best = np.inf, _GRID[0]
    for alpha, val in zip(_GRID, _grid_sse(z, float(level0)), strict=True):
        if val < best_val:
            best, best_val = alpha, val
    z_list = z.tolist()
    span = _ALPHA_UB - _ALPHA_LB

    def objective(x):
        return _sse(z, z_list, _ALPHA_LB + float(x[0]) * span, float(x[1]))

    x0 = np.array([(best - _ALPHA_LB) / span, level0])
    res = minimize(objective, x0, jac=lambda x: forward_gradient(objective, x), bounds=[(0, 1), (None, None)],
                   method="L-BFGS-B")
    return _ALPHA_LB + res.x[0] * span, res.x[1]


def forward_gradient(f, x: np.ndarray) -> np.ndarray:
    """The gradient L-BFGS-B estimates for f at x by forward differences when it is given none.

    x: (scaled smoothing level in [0, 1], initial level). The same steps and
    float operations as SciPy's `approx_derivative` there (a step that would
    leave [0, 1] is taken backwards), so the search, and the fit, come out the
    same bit for bit; without that function's general machinery, which cost
    most of a level-only fit's time.
    """
    f0 = f(x)
    grad = np.empty(2)
    for i in range(2):
        h = _FD_STEP
        if (x[i] + h) - x[i] == 0:
            h = _FD_RELATIVE * (1.0 if x[i] >= 0 else -1.0) * max(1.0, abs(x[i]))
        if i == 0 and not 0.0 <= x[i] + h <= 1.0:
            h = -h
        x1 = x.copy()
        x1[i] = x[i] + h
        grad[i] = (f(x1) - f0) / ((x[i] + h) - x[i])
    return grad


class LevelRun:
    """Simple exponential smoothing run with a fixed smoothing level: statsmodels' arithmetic, without its tables.

    z: the series (no gaps). level0: the initial level (`initial_level(z)`,
    or the fitted one). alpha: the smoothing level in [0, 1]. The levels are
    l[0] = level0, l[i] = alpha * z[i-1] + (1 - alpha) * l[i-1], computed with
    the same operations in the same order as statsmodels' Holt-Winters
    recursion for a model without trend or season, so `fittedvalues`
    (l[0..n-1], one-step forecasts) and `forecast(h)` (l[n], h times) are the
    floats its results give.
    """

    def __init__(self, z: np.ndarray, level0: float, alpha: float):
        y_alpha = (alpha * np.asarray(z, dtype=float)).tolist()
        alphac = 1 - alpha
        levels = [float(level0)]
        for ya in y_alpha:
            levels.append(ya + alphac * levels[-1])
        self.params = {"smoothing_level": alpha}
        self.fittedvalues = np.array(levels[:-1])
        self.level = levels[-1]

    def forecast(self, h: int) -> np.ndarray:
        return np.full(h, self.level)
