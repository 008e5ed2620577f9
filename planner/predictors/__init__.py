"""Load predictors (see planner.predict for the registry and the planner entry point)."""

from planner.predictors.base import PredictorBase, check_series, conformal_offset
from planner.predictors.kalman import KalmanPredictor
from planner.predictors.simple import ConstantPredictor, SeasonalNaivePredictor

__all__ = [
    "PredictorBase",
    "check_series",
    "conformal_offset",
    "ConstantPredictor",
    "SeasonalNaivePredictor",
    "KalmanPredictor",
]
