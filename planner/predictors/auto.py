"""Automatic choice: per series, the candidate that beat last value over the recent past.

Every fit scores each candidate against last value on genuine one-step-ahead
forecasts for the most recent `score_window` points: each made by the
candidate fitted only on the data before that point (kept from earlier fits
with warm_start, recomputed on a cold start), so parameters fitted on the
scored points never flatter a candidate. A candidate replaces last value only when it is
better by more than `margin_frac` *and* the advantage is consistent: the
mean of d = |last-value error| - |candidate error| is at least `min_t`
standard errors above zero (a one-sided Diebold-Mariano-style check) over at
least `min_scored` points. Among the eligible, the lowest error wins, and it
is blended with last value in proportion to the evidence (full trust at
`full_t` standard errors), so `auto` does not flip back and forth on a
borderline advantage. On a series where nothing is reliably better, `auto`
is last value; it never switches on the strength of a few lucky points.
"""

from __future__ import annotations

import math

import numpy as np

from planner.predictors.arima import ArimaPredictor
from planner.predictors.base import Param, PredictorBase
from planner.predictors.ets import ExponentialSmoothingPredictor
from planner.predictors.gbm import GradientBoostingPredictor
from planner.predictors.kalman import KalmanPredictor
from planner.predictors.prophet_model import ProphetPredictor
from planner.predictors.simple import ConstantPredictor, SeasonalNaivePredictor

DEFAULT_CANDIDATES = ("constant", "ets", "kalman", "gbm")
# The single models auto may choose between, by registry name (in registry order).
CANDIDATES: dict[str, type[PredictorBase]] = {
    cls.name: cls
    for cls in (
        ConstantPredictor,
        KalmanPredictor,
        SeasonalNaivePredictor,
        ExponentialSmoothingPredictor,
        ArimaPredictor,
        ProphetPredictor,
        GradientBoostingPredictor,
    )
}


def _key(t_s: float) -> float:
    """Dictionary key for an interval end time (robust to float noise)."""
    return round(float(t_s), 3)


class AutoPredictor(PredictorBase):
    """Keeps, per series, whichever candidate reliably predicted the recent past best.

    candidates: registry names tried ("a,b" or a tuple); "constant" is always included.
    score_window: most recent points the candidates are scored on.
    margin_frac: a candidate's MAE must be below (1 - margin_frac) x last value's.
    min_t: t-statistic of its advantage over last value above which a
        candidate starts to be trusted.
    full_t: t-statistic at which it is trusted fully; in between, "blend"
        mixes it with last value in proportion (t - min_t) / (full_t - min_t).
    min_scored: fewest scored points before any candidate may replace last value.
    combine: "best" (one candidate) or "weighted" (inverse squared MAE weights
        over the eligible candidates).
    candidate_params: {name: constructor parameters} per candidate.
    """

    name = "auto"
    PARAMS = (
        Param("candidates", DEFAULT_CANDIDATES),
        Param("score_window", 48, "int", ge=2), Param("margin_frac", 0.02, "number", ge=0),
        Param("min_t", 1.0, "number"), Param("full_t", 3.0, "number"), Param("min_scored", 8, "int", ge=2),
        Param("combine", "blend", choices=("best", "weighted", "blend")),
        Param("candidate_params", None),
    )

    def _candidate_names(self) -> list[str]:
        names = self.candidates.split(",") if isinstance(self.candidates, str) else list(self.candidates)
        names = [n.strip() for n in names if n.strip()]
        if "auto" in names:
            raise ValueError("AutoPredictor: 'auto' cannot be its own candidate")
        unknown = [n for n in names if n not in CANDIDATES]
        if unknown:
            raise ValueError(f"unknown predictor {unknown[0]!r}; valid names: {', '.join(CANDIDATES)}")
        if "constant" not in names:
            names.insert(0, "constant")
        return names

    def check_params(self) -> "AutoPredictor":
        """The hyperparameters, the candidates' names and each candidate's own parameters (ValueError); self."""
        self._check_own_params()
        names = self._candidate_names()
        params = self.candidate_params or {}
        if not isinstance(params, dict):
            raise ValueError(f"AutoPredictor: candidate_params must map candidate names to parameters, got {params!r}")
        for name, p in params.items():
            if name not in names:
                raise ValueError(f"AutoPredictor: candidate_params names {name!r}, not a candidate ({', '.join(names)})")
            if not isinstance(p, dict):
                raise ValueError(f"AutoPredictor: candidate_params.{name} must map parameters to values, got {p!r}")
            CANDIDATES[name].from_params(**p).check_params()
        return self

    def _fit(self, t_s, y) -> "AutoPredictor":
        names = self._candidate_names()
        reuse = self._extends_previous(t_s, y)
        old = getattr(self, "models_", {}) if reuse else {}
        t, v = self._set_series(t_s, y, align=reuse)
        params = self.candidate_params or {}
        models = {}
        for name in names:
            model = old.get(name)
            if model is None:
                model = CANDIDATES[name].from_params(warm_start=self.warm_start, **params.get(name, {}))
            # t, v: already validated (check_series); a kept candidate was fitted on the series this one extends.
            models[name] = model._fit_regular(t, v, extends=name in old)
        self.models_ = models

        start = max(1, v.size - int(self.score_window))
        keys = [_key(x) for x in t[start:].tolist()]  # each scored time's key, computed once
        books = self._out_of_sample(t, keys, v, models, start, reuse)
        # Each candidate's out-of-sample forecasts for the scored points (NaN where it has none).
        recent = {name: np.array([book.get(k, np.nan) for k in keys]) for name, book in books.items()}
        eligible = self._score(v, models, recent, start)
        self.chosen_, self.weights_ = self._weigh(eligible)
        self.insample_ = self._honest_insample(v, models, recent, start)
        # Remember this fit's forecasts: the next fit scores them out of sample for free.
        t_next = _key(t[-1] + self.interval_s_)
        for name, model in models.items():
            if name != "constant":
                books[name][t_next] = float(model.predict(1)[0])
        self.books_ = books
        return self

    def _score(self, v, models, recent_books, start) -> dict[str, float]:
        """Set scores_ ({name: (MAE ratio to last value, t-statistic, points)}); return the eligible ones' ratios.

        recent_books: {candidate: its out-of-sample forecasts for v[start:]}.
        """
        recent = slice(start, v.size)
        actual = v[recent]
        base_err = np.abs(actual - models["constant"].insample_[recent])
        self.scores_ = {}
        eligible = {}
        for name, model in models.items():
            if name == "constant" or model.fallback_reason_:
                continue  # still answering with last value: nothing to compare
            err = np.abs(actual - recent_books[name])
            ok = np.isfinite(err) & np.isfinite(base_err)
            n = int(ok.sum())
            if n < 2:
                continue
            d = base_err[ok] - err[ok]
            base_mae = float(base_err[ok].mean())
            ratio = float(err[ok].mean()) / base_mae if base_mae > 0 else 1.0
            sd = float(d.std(ddof=1))
            t_stat = float(d.mean()) / (sd / math.sqrt(n)) if sd > 0 else (math.inf if d.mean() > 0 else 0.0)
            self.scores_[name] = (ratio, t_stat, n)
            if n >= self.min_scored and ratio < 1.0 - self.margin_frac and t_stat > self.min_t:
                eligible[name] = ratio
        return eligible

    def _weigh(self, eligible: dict[str, float]) -> tuple[str, dict[str, float]]:
        """(chosen candidate, {name: weight}) from the eligible candidates' MAE ratios."""
        if not eligible:
            return "constant", {"constant": 1.0}
        best = min(eligible, key=lambda n: (eligible[n], n))
        if self.combine == "blend":
            # Trust grows with the evidence: no abrupt flips between last
            # value and the candidate when the advantage is borderline.
            _, t_best, _ = self.scores_[best]
            w = min(1.0, (t_best - self.min_t) / max(self.full_t - self.min_t, 1e-9))
            return best, ({best: w, "constant": 1.0 - w} if w < 1.0 else {best: 1.0})
        if self.combine == "weighted":
            inv = {n: 1.0 / r**2 for n, r in eligible.items()}
            total = sum(inv.values())
            return best, {n: w / total for n, w in inv.items()}
        return best, {best: 1.0}

    def _honest_insample(self, v, models, recent_books, start) -> np.ndarray:
        """The weighted in-sample predictions, out-of-sample ones over the scoring window.

        There the honest forecasts replace in-sample ones, so the residual
        quantile is not flattered by fitted parameters (where every weighted
        part has one). recent_books: as for `_score`.
        """
        ins = sum(w * models[n].insample_ for n, w in self.weights_.items())
        parts = [
            w * (models[n].insample_[start:] if n == "constant" else recent_books[n])
            for n, w in self.weights_.items()
        ]
        honest = np.logical_and.reduce([np.isfinite(p) for p in parts])
        ins[start:][honest] = sum(parts)[honest]
        return ins

    def _out_of_sample(self, t, keys, v, models, start, reuse) -> dict:
        """{candidate: {target time: one-step forecast made from data before it}} over the scoring window.

        Forecasts kept from earlier fits (warm start) are reused; any missing
        ones (all of them on a cold start) come from the candidate's
        `out_of_sample`, so a cold start scores on the same honest basis:
        one filter pass for Kalman and exponential smoothing, the held-out
        forecasts gradient boosting already made, a refit per point otherwise.
        keys: `_key` of each time from t[start] on.
        """
        from_key = _key(t[start]) if start < t.size else math.inf  # one point: nothing to score yet
        old = getattr(self, "books_", {}) if reuse else {}
        books = {}
        finite = np.isfinite(v)
        first = int(np.flatnonzero(finite)[0])
        scored = [i for i in range(max(start, first + 1), v.size) if finite[i]]
        for name, model in models.items():
            if name == "constant":
                continue
            book = {k: f for k, f in old.get(name, {}).items() if k >= from_key}
            books[name] = book
            if model.fallback_reason_:
                continue
            missing = [i for i in scored if keys[i - start] not in book]
            if not missing:
                continue
            for i, f in zip(missing, model.out_of_sample(missing), strict=True):
                if np.isfinite(f):
                    book[keys[i - start]] = float(f)
        return books

    def _predict(self, h: int) -> np.ndarray:
        return sum(w * self.models_[n].predict(h) for n, w in self.weights_.items())
