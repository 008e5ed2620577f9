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

from planner.predictors.base import Param, PredictorBase, fill_gaps


# Fitted attributes a warm-started refit may reuse.
_WARM_STATE = ("order_", "harmonics_", "selected_at_s_", "selected_points_", "params_", "refit_at_s_", "refit_points_")


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
    PARAMS = (
        Param("log1p", False, "bool"),
        Param("daily_harmonics", 3, "int", ge=0), Param("min_seasons", 2.0, "number", gt=0),
        Param("max_p", 2, "int", ge=0), Param("max_q", 2, "int", ge=0), Param("max_d", 1, "int", ge=0),
        Param("start_pq", 1, "int", ge=0),
        Param("concentrate_scale", True, "bool"), Param("select_window", 288, "int", ge=5),
        Param("reselect_every", 288, "int", ge=1), Param("refit_every", 24, "int", ge=1),
        Param("min_points", 10, "int", ge=5),
    )

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

    def _fit(self, t_s, y) -> "ArimaPredictor":
        import pmdarima as pm

        start = self._start_fit(t_s, y, warm=_WARM_STATE, model="model_")
        if start is None:
            return self
        reuse, previous, t, v, n_ok, first = start
        prev = dict(zip(_WARM_STATE, previous, strict=True))
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

    def _predict(self, h: int) -> np.ndarray:
        t_next = self.t_end_s_ + self.interval_s_ * np.arange(1, h + 1)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            f = np.asarray(self.model_.predict(n_periods=h, X=self._exog(t_next)), dtype=float)
        return np.expm1(f) if self.log1p else f
