"""Baselines: last value (constant) and seasonal naive.

These are the yardsticks every other predictor is scored against (MASE is
MAE relative to the constant predictor), and the automatic choice's safe
fallback.
"""

from __future__ import annotations

import numpy as np

from planner.predictors.base import Param, PredictorBase, previous_value


class ConstantPredictor(PredictorBase):
    """Next value = last observed value (NaN intervals skipped).

    Needs one finite point. Its one-step residuals are the series' own
    changes, so its p90 is "last value + 90th percentile of recent jumps".
    """

    name = "constant"
    limit_threads = False

    def _fit(self, t_s, y) -> "ConstantPredictor":
        _, v = self._set_series(t_s, y)
        self.insample_ = previous_value(v)
        return self

    def _predict(self, h: int) -> np.ndarray:
        return np.full(h, self.last_value_)


class SeasonalNaivePredictor(PredictorBase):
    """Next value = the value one season earlier (e.g. same time yesterday).

    season_s: season length, seconds (86400: daily); rounded to whole bins.
    With less than one season plus one bin of history, or a missing value a
    season back, it answers with the last value (fallback_reason_ says so).
    """

    name = "seasonal_naive"
    PARAMS = (Param("season_s", 86400.0, "number", gt=0),)
    limit_threads = False

    def _fit(self, t_s, y) -> "SeasonalNaivePredictor":
        t, v = self._set_series(t_s, y)
        p = int(round(self.season_s / self.interval_s_))
        if p < 1:
            raise ValueError(
                f"SeasonalNaivePredictor: season_s={self.season_s} s is shorter than one interval "
                f"({self.interval_s_} s)"
            )
        self.period_ = p
        if v.size <= p:
            self._fall_back(f"{v.size} points < one season ({p}) + 1: last value")
            return self
        prev = previous_value(v)
        ins = np.full(v.size, np.nan)
        ins[p:] = np.where(np.isfinite(v[:-p]), v[:-p], prev[p:])
        self.insample_ = ins
        return self

    def _predict(self, h: int) -> np.ndarray:
        n, p = self.y_.size, self.period_
        return self.y_[n - p + (np.arange(h) % p)]
