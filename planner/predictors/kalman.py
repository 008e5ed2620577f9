"""Kalman filter on a local linear trend (level + slope), noise tuned on the history.

Dynamo's Kalman predictor uses fixed process/measurement noise, which makes it
either sluggish or jittery depending on the series (MASE 1.1-1.6 vs last value
on the shared traces). Here the two noise ratios are chosen from a small grid
by one-step-ahead MAE on recent history, so a noisy series gets a smooth level
(like an EWMA) and a drifting one a responsive level and slope.

The grid is scored by one filter pass that carries every candidate at once
(`grid_priors`: the same predict/update recursion as filterpy's, on arrays
with one entry per candidate), because filterpy filters one model at a time
and ten passes cost ~25 ms per series, too much for a stateless planner run
that forecasts three series. The chosen noise is then run through filterpy.
"""

from __future__ import annotations

import itertools

import numpy as np
from filterpy.kalman import KalmanFilter

from planner.predictors.base import Param, PredictorBase, clean_forecast

# Process noise / measurement noise ratios tried for level and slope.
LEVEL_RATIOS = (0.01, 0.1, 0.3, 1.0, 10.0)
SLOPE_RATIOS = (0.0, 1e-2)


def _filter(v: np.ndarray, r: float, q_level: float, q_slope: float, x0=None, P0=None):
    """Run the filter over v (NaN: predict only).

    Starts from state x0 / covariance P0, or from the first finite value with
    a wide covariance. Returns (one-step prior predictions, final posterior
    state, its covariance); a cold start's first prior is NaN (just the guess).
    """
    kf = KalmanFilter(dim_x=2, dim_z=1)
    kf.F = np.array([[1.0, 1.0], [0.0, 1.0]])
    kf.H = np.array([[1.0, 0.0]])
    kf.R = np.array([[r]])
    kf.Q = np.diag([q_level * r, q_slope * r])
    if x0 is None:
        first = v[np.flatnonzero(np.isfinite(v))[0]]
        kf.x = np.array([[first], [0.0]])
        kf.P = np.diag([r * 10.0, r])
    else:
        kf.x = np.asarray(x0, dtype=float).reshape(2, 1).copy()
        kf.P = np.asarray(P0, dtype=float).copy()
    zs = [None if not np.isfinite(z) else z for z in v]
    _, _, means_p, _ = kf.batch_filter(zs, update_first=False)
    prior = means_p[:, 0, 0].copy()
    if x0 is None:
        prior[0] = np.nan
    # batch_filter leaves the filter at the last posterior
    return prior, kf.x.ravel().copy(), kf.P.copy()


def grid_priors(v: np.ndarray, r: float, q_level: np.ndarray, q_slope: np.ndarray) -> np.ndarray:
    """One-step prior predictions of `_filter` for many noise settings in one pass.

    v: the series (NaN: predict only). r: measurement noise. q_level, q_slope:
    ratios, one entry per candidate. Returns (candidates, len(v)) priors, the
    first one NaN (a cold start's guess), equal to `_filter(v, r, ql, qs)[0]`
    for each candidate up to rounding.
    """
    ql = np.asarray(q_level, dtype=float) * r
    qs = np.asarray(q_slope, dtype=float) * r
    c = ql.size
    first = v[np.flatnonzero(np.isfinite(v))[0]]
    level, slope = np.full(c, float(first)), np.zeros(c)
    # Covariance entries of the level/slope state, per candidate.
    p00, p01, p11 = np.full(c, r * 10.0), np.zeros(c), np.full(c, float(r))
    out = np.empty((c, v.size))
    for i, z in enumerate(v.tolist()):
        # predict: x = F x, P = F P F' + Q with F = [[1, 1], [0, 1]]
        level = level + slope
        p00 = p00 + 2.0 * p01 + p11 + ql
        p01 = p01 + p11
        p11 = p11 + qs
        out[:, i] = level
        if z == z:  # not NaN: update with H = [1, 0]
            s_inv = 1.0 / (p00 + r)
            k0, k1 = p00 * s_inv, p01 * s_inv
            resid = z - level
            level = level + k0 * resid
            slope = slope + k1 * resid
            # P - K S K', the same matrix filterpy's Joseph form gives
            p11 = p11 - k1 * p01
            p01 = p01 - k0 * p01
            p00 = p00 - k0 * p00
    out[:, 0] = np.nan
    return out


class KalmanPredictor(PredictorBase):
    """Local linear trend Kalman filter with tuned noise.

    min_points: finite points needed before it forecasts; fewer -> last value.
    tune_window: most recent points the noise grid is scored on (and the
        filter runs over: older points barely move a tuned filter).
    retune_every: with warm_start, re-tune the noise after this many new
        points; in between the filter continues from its last state over the
        new points only.
    """

    name = "kalman"
    PARAMS = (
        Param("min_points", 5, "int", ge=2),
        Param("tune_window", 120, "int", ge=2),
        Param("retune_every", 24, "int", ge=1),
    )
    limit_threads = False

    def _fit(self, t_s, y) -> "KalmanPredictor":
        reuse = self._extends_previous(t_s, y)
        prev_tuned = getattr(self, "ratios_", None) if reuse else None
        tuned_at = getattr(self, "tuned_at_s_", None) if reuse else None
        tuned_points = getattr(self, "tuned_points_", None) if reuse else None
        prev = None
        if reuse and prev_tuned is not None and hasattr(self, "cov_"):
            prev = (self.t_s_, self.insample_, self.state_, self.cov_, self.r_)
        t, v = self._set_series(t_s, y, align=reuse)
        n_ok = int(np.isfinite(v).sum())
        if n_ok < self.min_points:
            self._fall_back(f"{n_ok} points < min_points {self.min_points}: last value")
            self.state_ = np.array([self.last_value_, 0.0])
            self.ratios_ = None
            return self
        if prev is not None and not self._stale(tuned_at, tuned_points, self.retune_every):
            # Same noise: continue the filter from its last state over the new
            # points only (what a cold run over the window converges to).
            old_t, old_ins, x0, P0, r = prev
            k_new = int(np.sum(t > old_t[-1] + 0.5 * self.interval_s_))
            prior, self.state_, self.cov_ = _filter(v[v.size - k_new :], r, *prev_tuned, x0=x0, P0=P0)
            ins = np.full(v.size, np.nan)
            offset = int(round((t[0] - old_t[0]) / self.interval_s_))
            for i in range(v.size - k_new):
                if 0 <= i + offset < old_ins.size:
                    ins[i] = old_ins[i + offset]
            ins[v.size - k_new :] = prior
            self.insample_ = ins
            self.ratios_, self.r_ = prev_tuned, r
            return self
        w = v[-int(self.tune_window):]
        if not np.isfinite(w).any():
            # Idle for longer than the window (an idle model's lengths are unknown, NaN): from the last value seen.
            w = v[int(np.flatnonzero(np.isfinite(v))[-1]):]
        d = np.diff(w[np.isfinite(w)])
        r = float(np.var(d) / 2.0) if d.size else 0.0
        r = max(r, 1e-6 * max(1.0, float(np.nanmean(w)) ** 2), 1e-9)
        self.r_ = r
        self.ratios_ = self._tune(w, r)
        self.tuned_at_s_, self.tuned_points_ = t[-1], n_ok
        prior, self.state_, self.cov_ = _filter(w, r, *self.ratios_)
        ins = np.full(v.size, np.nan)
        ins[-w.size:] = prior
        self.insample_ = ins
        return self

    def _tune(self, w: np.ndarray, r: float) -> tuple[float, float]:
        """The grid's (level, slope) ratios with the lowest one-step MAE on w (first on ties)."""
        grid = list(itertools.product(LEVEL_RATIOS, SLOPE_RATIOS))
        burn = min(5, max(1, w.size // 3))
        prior = grid_priors(w, r, np.array([g[0] for g in grid]), np.array([g[1] for g in grid]))
        err = np.abs(w[burn:] - prior[:, burn:])
        scored = np.isfinite(err[0])  # the same points for every candidate
        if not scored.any():
            return (LEVEL_RATIOS[2], 0.0)
        mae = err[:, scored].mean(axis=1)
        return grid[int(np.argmin(mae))]

    def out_of_sample(self, indices) -> np.ndarray:
        """Genuine one-step forecasts for points of the fitted series (see PredictorBase).

        One pass: the noise is tuned on the points before the first index
        only, then the filter runs on with it, so each prior is a forecast
        from earlier points. (A warm-started run would also re-tune every
        `retune_every` points inside the window; the difference is noise.)
        """
        self._check_fitted()
        idx = np.asarray(indices, dtype=np.int64)
        if idx.size == 0:
            return np.empty(0)
        start = int(idx.min())
        early = self.clone(warm_start=False).fit(self.t_s_[:start], self.y_[:start])
        if early.ratios_ is None:  # too few points before the window to tune on
            return super().out_of_sample(indices)
        prior, _, _ = _filter(self.y_[start:], early.r_, *early.ratios_, x0=early.state_, P0=early.cov_)
        return clean_forecast(prior[idx - start], fallback=early.last_value_)

    def _predict(self, h: int) -> np.ndarray:
        level, slope = self.state_
        return level + slope * np.arange(1, h + 1)
