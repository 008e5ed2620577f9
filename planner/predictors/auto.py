"""Automatic choice: per series, the candidate with the best recent one-step error.

Every fit scores each candidate on the one-step-ahead predictions it made for
the most recent `score_window` points (its `insample_`, which a filter or
recursion computes from past values only) and keeps the best. A candidate
replaces last value only when its error is lower by more than `margin_frac`,
so `auto` does not trade a sure baseline for noise.
"""

from __future__ import annotations

import numpy as np

from planner.predictors.base import PredictorBase, check_horizon, single_threaded, clean_forecast

DEFAULT_CANDIDATES = ("constant", "ets", "kalman", "gbm")


class AutoPredictor(PredictorBase):
    """Keeps, per series, whichever candidate predicted the recent past best.

    candidates: registry names tried; "constant" is always included.
    score_window: most recent points the candidates are scored on (MAE).
    margin_frac: a candidate must beat last value's MAE by this fraction.
    candidate_params: per-candidate constructor parameters.
    """

    name = "auto"

    def __init__(
        self,
        *,
        candidates: tuple[str, ...] | str = DEFAULT_CANDIDATES,
        score_window: int = 48,
        margin_frac: float = 0.03,
        combine: str = "best",
        candidate_params: dict | None = None,
        residual_window: int = 200,
        warm_start: bool = False,
    ):
        self.candidates = candidates
        self.score_window = score_window
        self.margin_frac = margin_frac
        self.combine = combine
        self.candidate_params = candidate_params
        self.residual_window = residual_window
        self.warm_start = warm_start

    def _candidate_names(self) -> list[str]:
        names = self.candidates.split(",") if isinstance(self.candidates, str) else list(self.candidates)
        names = [n.strip() for n in names if n.strip()]
        if "auto" in names:
            raise ValueError("AutoPredictor: 'auto' cannot be its own candidate")
        if "constant" not in names:
            names.insert(0, "constant")
        return names

    def fit(self, t_s, y) -> "AutoPredictor":
        """Validate and fit on (t_s seconds, y); returns self."""
        with single_threaded():
            return self._fit(t_s, y)

    def _fit(self, t_s, y) -> "AutoPredictor":
        from planner.predict import make_predictor  # registry imports this module

        if self.combine not in ("best", "weighted"):
            raise ValueError(f"AutoPredictor: combine must be 'best' or 'weighted', got {self.combine!r}")
        if not (isinstance(self.score_window, int) and self.score_window >= 2):
            raise ValueError(f"AutoPredictor: score_window must be an integer >= 2, got {self.score_window!r}")
        reuse = self._extends_previous(np.asarray(t_s, dtype=float))
        old = getattr(self, "models_", {}) if reuse else {}
        t, v = self._set_series(t_s, y)
        params = self.candidate_params or {}
        models = {}
        for name in self._candidate_names():
            model = old.get(name) or make_predictor(name, warm_start=self.warm_start, **params.get(name, {}))
            models[name] = model.fit(t, v)
        self.models_ = models
        w = int(self.score_window)
        recent = slice(max(0, v.size - w), v.size)
        # Candidates still answering with last value (too little history for
        # their model) sit out; the rest are scored on the same points.
        racing = {n: m for n, m in models.items() if n == "constant" or not m.fallback_reason_}
        ok = np.isfinite(v[recent])
        for m in racing.values():
            ok &= np.isfinite(m.insample_[recent])
        scores = {}
        for name, m in racing.items():
            err = np.abs(v[recent] - m.insample_[recent])[ok]
            scores[name] = float(err.mean()) if err.size else np.inf
        self.scores_ = scores
        self.n_scored_ = int(ok.sum())
        base = scores["constant"]
        best = min(scores, key=lambda n: (scores[n], n != "constant"))
        if self.n_scored_ < 2 or not scores[best] < base * (1.0 - self.margin_frac):
            best = "constant"
        self.chosen_ = best
        self.weights_ = {best: 1.0}
        if self.combine == "weighted" and best != "constant":
            # Inverse squared error weights over the candidates at least as good as last value.
            good = {n: s for n, s in scores.items() if s <= base and s > 0}
            inv = {n: 1.0 / s**2 for n, s in good.items()}
            total = sum(inv.values())
            self.weights_ = {n: w / total for n, w in inv.items()}
        self.insample_ = sum(w * models[n].insample_ for n, w in self.weights_.items())
        if self.n_scored_ < 2:
            self.fallback_reason_ = f"{self.n_scored_} points to score candidates on: last value"
        return self

    def predict(self, horizon: int = 1) -> np.ndarray:
        self._check_fitted()
        h = check_horizon(horizon, type(self).__name__)
        f = sum(w * self.models_[n].predict(h) for n, w in self.weights_.items())
        return clean_forecast(f, fallback=self.last_value_)
