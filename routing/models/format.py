"""The latency-model document: the safe, JSON-only format the retrain flow publishes and the router serves.

The router never unpickles anything. A document carries, for each target (TTFT and TPOT), a mean
model and optionally a p90 model, each either gradient-boosted trees (the node
arrays of scikit-learn's HistGradientBoostingRegressor) or a linear model.

Document (format_version 2; version 1 is the same without "feature_set", which
then means feature set 1):

    {"format": "sla-planner/latency-model", "format_version": 2,
     "feature_set": 2,                           # routing.features.FEATURE_SETS key
     "version": "2026-11-22T02-00Z",            # unique, [A-Za-z0-9._-], <= 64 chars
     "created_at_s": 1795000000.0,               # optional, Unix seconds
     "metrics": {"ttft_mape": 0.041},            # optional, name -> finite number
     "notes": "...",                              # optional
     "base": "profile:h200_llama8b",              # with a relative target: the estimate it is relative to
     "targets": {
       "ttft": {"feature_names": [...TTFT_FEATURES], "mean": REG, "p90": REG, "relative": true},
       "tpot": {"feature_names": [...TPOT_FEATURES], "mean": REG}}}

    REG = {"kind": "hist_gradient_boosting", "link": "identity" | "log",
           "baseline": float,
           "trees": [{"feature": [int], "threshold": [float], "left": [int],
                      "right": [int], "value": [float], "is_leaf": [bool]}, ...]}
        | {"kind": "linear", "link": "identity" | "log", "intercept": float,
           "coef": [float, one per feature]}

A relative target ("relative": true; the document then names its estimate in
"base") predicts the ratio of the latency to the router's profile estimate
(routing.models.predictor.ProfileEstimator) on the same row: the router multiplies the two, so the estimate carries what
the trees cannot extrapolate (more load than training saw) and the trees
correct its bias. A router serves it only when its own estimate has that name
(the service refuses it on publish otherwise); a router that predates the
field refuses the document as a whole (unknown key), never serving a ratio as
milliseconds.

A tree's node 0 is its root; an internal node sends a row left when
x[feature] <= threshold, else right. The raw prediction is baseline + the sum of
the leaves reached (or intercept + x . coef); link "log" exponentiates it.
Predictions are in ms and clipped at 0. Features are never missing, so no
missing-value routing is stored: the router refuses non-finite feature rows
before a model sees them, and a NaN given to LatencyModel.predict directly
fails every "<=" test and goes right (sklearn would route it by the
missing-value direction it learned, which the format does not carry).
"""

from __future__ import annotations

from typing import Annotated, Literal, Union

from pydantic import ConfigDict, Field, model_validator

from planner.strict import StrictModel
from routing.features import TARGETS

FORMAT = "sla-planner/latency-model"
FORMAT_VERSION = 2
VERSION_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"


class TreeArrays(StrictModel):
    """One regression tree as parallel node arrays; node 0 is the root."""

    model_config = ConfigDict(allow_inf_nan=False)

    feature: list[int] = Field(min_length=1, description="split feature index per node (ignored on leaves)")
    threshold: list[float] = Field(min_length=1, description="split threshold per node: x <= threshold goes left")
    left: list[int] = Field(min_length=1, description="left child index per node (ignored on leaves)")
    right: list[int] = Field(min_length=1, description="right child index per node (ignored on leaves)")
    value: list[float] = Field(min_length=1, description="leaf value per node (ignored on internal nodes)")
    is_leaf: list[bool] = Field(min_length=1, description="true for leaves")

    @model_validator(mode="after")
    def _shape(self) -> "TreeArrays":
        n = len(self.is_leaf)
        if n == 0:
            raise ValueError("a tree needs at least one node")
        for name in ("feature", "threshold", "left", "right", "value"):
            if len(getattr(self, name)) != n:
                raise ValueError(f"{name} has {len(getattr(self, name))} entries, is_leaf has {n}")
        return self


class TreesRegressor(StrictModel):
    """Gradient-boosted trees (scikit-learn HistGradientBoostingRegressor node arrays)."""

    model_config = ConfigDict(allow_inf_nan=False)

    kind: Literal["hist_gradient_boosting"]
    link: Literal["identity", "log"] = Field("identity", description="log: prediction = exp(raw)")
    baseline: float = Field(description="raw prediction before the trees")
    trees: list[TreeArrays] = Field(min_length=1, description="trees, added to the baseline")


class LinearRegressor(StrictModel):
    """Linear model: raw = intercept + sum(coef * x)."""

    model_config = ConfigDict(allow_inf_nan=False)

    kind: Literal["linear"]
    link: Literal["identity", "log"] = Field("identity", description="log: prediction = exp(raw)")
    intercept: float
    coef: list[float] = Field(min_length=1, description="one coefficient per feature, in feature order")


Regressor = Annotated[Union[TreesRegressor, LinearRegressor], Field(discriminator="kind")]


class TargetModels(StrictModel):
    feature_names: list[str] = Field(
        description="exactly routing.features.FEATURE_SETS[feature_set][target], in order (column i = index i)"
    )
    mean: Regressor = Field(description="mean latency model, ms")
    p90: Regressor | None = Field(None, description="p90 latency model, ms (optional)")
    relative: bool = Field(False, description="the models predict ratios to the document's base estimate, not ms")


class TtftModels(TargetModels):
    pass


class TpotModels(TargetModels):
    pass


class Targets(StrictModel):
    ttft: TtftModels = Field(description="time to first token, ms")
    tpot: TpotModels = Field(description="time per output token, ms")


class ModelDocument(StrictModel):
    """A published latency-model bundle (see module docstring)."""

    model_config = ConfigDict(allow_inf_nan=False)

    format: Literal["sla-planner/latency-model"]
    format_version: Literal[1, 2]
    feature_set: int | None = Field(
        None, ge=1, description="routing.features feature-set version the models were trained on "
        "(required from format_version 2; version 1 documents mean set 1)"
    )
    version: str = Field(pattern=VERSION_PATTERN, description="unique version id")
    created_at_s: float | None = Field(None, ge=0, description="when the model was trained, Unix s")
    metrics: dict[str, float] = Field(default_factory=dict, description="evaluation metrics, finite numbers")
    notes: str = Field("", max_length=4096)
    base: str | None = Field(
        None, min_length=1, max_length=200,
        description="name of the profile estimate the predictions are ratios to (None: predictions are ms)",
    )
    targets: Targets

    @model_validator(mode="after")
    def _base(self) -> "ModelDocument":
        relative = [t for t in TARGETS if getattr(self.targets, t).relative]
        if relative and self.base is None:
            raise ValueError(f"base: required, targets {relative} are relative to an estimate")
        if self.base is not None and not relative:
            raise ValueError(f"base: {self.base!r} given but no target is relative")
        return self

    @model_validator(mode="after")
    def _feature_set(self) -> "ModelDocument":
        if self.format_version == 1 and self.feature_set not in (None, 1):
            raise ValueError(f"feature_set: format_version 1 documents use feature set 1, got {self.feature_set}")
        if self.format_version >= 2 and self.feature_set is None:
            raise ValueError("feature_set: required from format_version 2")
        return self

    @property
    def feature_set_version(self) -> int:
        return self.feature_set if self.feature_set is not None else 1
