"""Load predictors (planner.predictors.registry names them; planner.predict forecasts with them)."""

from planner.predictors.base import PredictorBase, check_series
from planner.predictors.kalman import KalmanPredictor
from planner.predictors.simple import ConstantPredictor, SeasonalNaivePredictor

__all__ = [
    "PredictorBase",
    "check_series",
    "ConstantPredictor",
    "SeasonalNaivePredictor",
    "KalmanPredictor",
]
