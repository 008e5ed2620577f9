"""ARIMA (pmdarima) with periodic order selection and Fourier terms for the daily cycle.

Dynamo's ARIMA picks its order once on the first few points and only updates
afterwards, and a seasonal auto_arima (m=24) takes a minute per call. Here:
- the order (p, d, q) is chosen by pmdarima's stepwise auto_arima on the most
  recent `select_window` points, and re-chosen only after `reselect_every`
  new points (warm start); a cold fit always selects. The search is most of a
  cold fit's cost, so it is kept cheap without shrinking it: it starts from
  (1, d, 1) rather than (2, d, 2) (fewer neighbours to visit) and ranks the
  candidates with the noise variance concentrated out of the likelihood (one
  parameter fewer for each candidate's optimiser), keeping neither smoothed
  states nor parameter covariances for them. The chosen order is then fitted
  with the full likelihood: fitting with the concentrated one too was
  measured to move the forecasts. No fit computes the parameter covariance
  (point forecasts and residual quantiles do not use it). A smaller search
  space or window was measured and lost accuracy (docs/predictors.md);
- the daily cycle enters as Fourier regressors sin/cos(2 pi k t / 1 day) of the
  real timestamps (regression with ARIMA errors), once the history spans
  `min_seasons` days: cheap, and valid for any bin width;
- between order selections the coefficients are re-estimated every
  `refit_every` new points; in between, the fitted coefficients are re-run
  over the new window (a Kalman filter pass, milliseconds).
"""

from __future__ import annotations

import warnings

import numpy as np

from planner.predictors.base import PredictorBase, check_horizon, single_threaded, clean_forecast, fill_gaps


def fourier_terms(t_s: np.ndarray, *, period_s: float, harmonics: int) -> np.ndarray:
    """sin/cos(2 pi k t / period) for k = 1..harmonics, one column each: (n, 2K)."""
    cols = []
    for k in range(1, harmonics + 1):
        w = 2.0 * np.pi * k * np.asarray(t_s, dtype=float) / period_s
        cols += [np.sin(w), np.cos(w)]
    return np.column_stack(cols) if cols else np.empty((len(t_s), 0))


class ArimaPredictor(PredictorBase):
    """Non-seasonal ARIMA with optional daily Fourier regressors and log1p transform.

    log1p: fit on log1p(y) (multiplicative noise and cycle).
    daily_harmonics: Fourier pairs for the daily cycle (0: none), used once the
        history spans min_seasons days.
    max_p, max_q: order search bounds; max_d: differencing bound.
    start_pq: the stepwise search starts at (start_pq, d, start_pq).
    concentrate_scale: rank the order search's candidates with the noise
        variance concentrated out of the likelihood (faster); a window where
        no concentrated candidate survives pmdarima's unit-root check is
        searched again without it, and a window where nothing fits answers
        with last value.
    select_window: most recent points the order search sees.
    reselect_every / refit_every: with warm_start, new points after which the
        order is searched again / the coefficients are re-estimated.
    min_points: finite points needed; fewer -> last value.
    """

    name = "arima"

    def __init__(
        self,
        *,
        log1p: bool = False,
        daily_harmonics: int = 3,
        min_seasons: float = 2.0,
        max_p: int = 2,
        max_q: int = 2,
        max_d: int = 1,
        start_pq: int = 1,
        concentrate_scale: bool = True,
        select_window: int = 288,
        reselect_every: int = 288,
        refit_every: int = 24,
        min_points: int = 10,
        residual_window: int = 200,
        warm_start: bool = False,
    ):
        self.log1p = log1p
        self.daily_harmonics = daily_harmonics
        self.min_seasons = min_seasons
        self.max_p = max_p
        self.max_q = max_q
        self.max_d = max_d
        self.start_pq = start_pq
        self.concentrate_scale = concentrate_scale
        self.select_window = select_window
        self.reselect_every = reselect_every
        self.refit_every = refit_every
        self.min_points = min_points
        self.residual_window = residual_window
        self.warm_start = warm_start

    def _search(self, z: np.ndarray, X: np.ndarray | None, *, concentrate: bool):
        """pmdarima's stepwise order search on (z, X); ValueError when no candidate fits."""
        import pmdarima as pm

        return pm.auto_arima(
            z,
            X=X,
            seasonal=False,
            stepwise=True,
            start_p=min(self.start_pq, self.max_p),
            start_q=min(self.start_pq, self.max_q),
            max_p=self.max_p,
            max_q=self.max_q,
            max_d=self.max_d,
            information_criterion="aic",
            suppress_warnings=True,
            error_action="ignore",
            sarimax_kwargs={"concentrate_scale": concentrate},
            # Only the candidates' AIC is needed: no smoother pass, no
            # parameter covariance (its numerical derivatives cost ~20%).
            low_memory=True,
            cov_type="none",
        )

    def _no_order(self) -> "ArimaPredictor":
        self._fall_back("no ARIMA order fits this window: last value")
        self.order_ = None
        return self

    def _exog(self, t: np.ndarray) -> np.ndarray | None:
        if not self.harmonics_:
            return None
        return fourier_terms(t, period_s=86400.0, harmonics=self.harmonics_)

    def fit(self, t_s, y) -> "ArimaPredictor":
        """Validate and fit on (t_s seconds, y); returns self."""
        with single_threaded():
            return self._fit(t_s, y)

    def _fit(self, t_s, y) -> "ArimaPredictor":
        import pmdarima as pm

        if not (isinstance(self.min_points, int) and self.min_points >= 5):
            raise ValueError(f"ArimaPredictor: min_points must be an integer >= 5, got {self.min_points!r}")
        if not (isinstance(self.daily_harmonics, int) and self.daily_harmonics >= 0):
            raise ValueError(f"ArimaPredictor: daily_harmonics must be an integer >= 0, got {self.daily_harmonics!r}")
        reuse = self._extends_previous(t_s, y)
        prev = {
            k: getattr(self, k, None)
            for k in ("order_", "harmonics_", "selected_at_s_", "selected_points_", "params_", "refit_at_s_", "refit_points_")
        }
        t, v = self._set_series(t_s, y, align=reuse)
        n_ok = int(np.isfinite(v).sum())
        self.model_ = None
        if n_ok < self.min_points:
            self._fall_back(f"{n_ok} points < min_points {self.min_points}: last value")
            return self
        first = int(np.flatnonzero(np.isfinite(v))[0])
        tt = t[first:]
        w = fill_gaps(v[first:])
        z = np.log1p(w) if self.log1p else w
        span_days = (tt[-1] - tt[0] + self.interval_s_) / 86400.0
        self.harmonics_ = self.daily_harmonics if span_days >= self.min_seasons else 0
        X = self._exog(tt)

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if (
                not reuse
                or prev["order_"] is None
                or prev["harmonics_"] != self.harmonics_
                or self._stale(prev["selected_at_s_"], prev["selected_points_"], self.reselect_every)
            ):
                k = min(z.size, int(self.select_window))
                concentrated = bool(self.concentrate_scale)
                try:
                    sel = self._search(z[-k:], None if X is None else X[-k:], concentrate=concentrated)
                except ValueError:
                    if not concentrated:
                        return self._no_order()
                    # On a window the model fits almost exactly every concentrated
                    # candidate can end at a unit root and be rejected; the full
                    # likelihood stops short of it.
                    concentrated = False
                    try:
                        sel = self._search(z[-k:], None if X is None else X[-k:], concentrate=False)
                    except ValueError:
                        return self._no_order()
                self.order_ = tuple(int(x) for x in sel.order)
                self.selected_at_s_, self.selected_points_ = t[-1], n_ok
                prev["params_"] = None
            else:
                self.order_ = prev["order_"]
                self.selected_at_s_, self.selected_points_ = prev["selected_at_s_"], prev["selected_points_"]
            model = pm.ARIMA(order=self.order_, suppress_warnings=True)
            if prev["params_"] is not None and not self._stale(
                prev["refit_at_s_"], prev["refit_points_"], self.refit_every
            ):
                # Same order, fresh window: re-run the filter with the fitted coefficients.
                model.fit(z, X=X, start_params=prev["params_"], maxiter=0, cov_type="none")
                self.refit_at_s_, self.refit_points_ = prev["refit_at_s_"], prev["refit_points_"]
                self.params_ = prev["params_"]
            else:
                model.fit(z, X=X, cov_type="none")
                self.refit_at_s_, self.refit_points_ = t[-1], n_ok
                self.params_ = np.asarray(model.params(), dtype=float)
        self.model_ = model
        fitted = np.asarray(model.predict_in_sample(X=X), dtype=float)
        if self.log1p:
            fitted = np.expm1(fitted)
        ins = np.full(v.size, np.nan)
        # The first d + 1 in-sample values are initialisation, not forecasts.
        skip = self.order_[1] + 1
        ins[first + skip:] = fitted[skip:]
        self.insample_ = ins
        self.t_end_s_ = t[-1]
        return self

    def predict(self, horizon: int = 1) -> np.ndarray:
        self._check_fitted()
        h = check_horizon(horizon, type(self).__name__)
        if self.model_ is None:
            return clean_forecast(np.full(h, self.last_value_), fallback=self.last_value_)
        t_next = self.t_end_s_ + self.interval_s_ * np.arange(1, h + 1)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            f = np.asarray(self.model_.predict(n_periods=h, X=self._exog(t_next)), dtype=float)
        if self.log1p:
            f = np.expm1(f)
        return clean_forecast(f, fallback=self.last_value_)
