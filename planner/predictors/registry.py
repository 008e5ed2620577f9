"""The predictor registry: every load predictor by its configuration name.

The planner configuration validates predictor names and parameters against it,
and the forecast step builds its predictors from it.
"""

from __future__ import annotations

from typing import Any

from planner.predictors.auto import CANDIDATES, AutoPredictor
from planner.predictors.base import PredictorBase

PREDICTORS: dict[str, type[PredictorBase]] = {**CANDIDATES, AutoPredictor.name: AutoPredictor}


def predictor_names() -> list[str]:
    """Registered predictor names, in registry order."""
    return list(PREDICTORS)


def make_predictor(name: str, **params: Any) -> PredictorBase:
    """A new, unfitted predictor by registry name.

    params: keyword hyperparameters of that predictor's constructor. An unknown
    name or parameter is a ValueError listing the valid ones.
    """
    cls = PREDICTORS.get(name)
    if cls is None:
        raise ValueError(f"unknown predictor {name!r}; valid names: {', '.join(PREDICTORS)}")
    return cls.from_params(**params)


__all__ = ["PREDICTORS", "make_predictor", "predictor_names"]
