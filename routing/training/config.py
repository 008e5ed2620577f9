"""The settings of one retrain run: hyperparameters, data limits, gate thresholds."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from planner.strict import StrictModel
from routing.config import OnlineCalibrationConfig
from routing.features import FEATURE_SET_VERSION, FEATURE_SETS, TARGETS, Target


class TrainingConfig(StrictModel):
    """Hyperparameters, data limits and gate thresholds of one retrain run."""

    holdout_frac: float = Field(0.2, gt=0, lt=0.5, description="most recent share of samples held out for evaluation")
    calibration_frac: float = Field(
        0.1, ge=0, lt=0.5, description="share just before the holdout: early stopping and p90 calibration (0: none)"
    )
    min_train_samples: int = Field(1000, ge=20, description="fewest training samples per target; fewer: skip the run")
    min_holdout_samples: int = Field(200, ge=10, description="fewest held-out samples per target; fewer: skip the run")
    holdout_max_source_frac: float = Field(
        0.5, gt=0, le=1,
        description="no endpoint (a sample's source) may hold more of the held-out rows than this share, 1/k with "
        "only k endpoints there, or its share of the rows before them, whichever is largest; its oldest rows "
        "beyond it are left out of the evaluation",
    )
    max_ttft_ms: float = Field(600_000.0, gt=0, description="TTFT above this is absurd (dropped), ms")
    max_tpot_ms: float = Field(10_000.0, gt=0, description="TPOT above this is absurd (dropped), ms")
    point_loss: Literal["squared_error", "absolute_error"] = Field(
        "absolute_error",
        description="loss of the point (\"mean\") model on log latency: absolute_error predicts the median "
        "(lower relative error), squared_error the geometric mean (faster to fit)",
    )
    max_iter: int = Field(300, ge=1, le=1000, description="boosting iterations per model (at most)")
    learning_rate: float = Field(0.1, gt=0, le=1, description="boosting learning rate")
    max_leaf_nodes: int = Field(31, ge=2, le=255, description="leaves per tree")
    min_samples_leaf: int = Field(20, ge=1, description="fewest samples per leaf")
    l2_regularization: float = Field(0.0, ge=0, description="L2 penalty on leaf values")
    max_bins: int = Field(255, ge=2, le=255, description="histogram bins per feature")
    n_iter_no_change: int = Field(
        20, ge=1, description="stop when the calibration-slice loss has not improved for this many iterations"
    )
    n_threads: int = Field(
        1, ge=1, le=64, description="OpenMP threads for fitting (1: predictable on a shared machine)"
    )
    seed: int = Field(0, ge=0, description="random seed of the boosting")
    feature_set: int = Field(
        FEATURE_SET_VERSION, ge=1,
        description="routing.features feature set the models use: the current one, or an older one "
        "(for a router that only knows that set, or to measure what the newer features add)",
    )
    calibrate_p90: bool = Field(True, description="shift the p90 model so 90% of calibration samples fall below it")
    relative_to_estimate: Literal["select", "always", "never"] = Field(
        "select",
        description="fit the ratio of each latency to the router's profile estimate on the same row (a relative "
        "model: the router multiplies by its estimate) when the samples carry the estimate: always, never, or "
        "select per target (the point model with the lower MAPE on the calibration slice). The estimate "
        "extrapolates to more load than training saw, where trees stay flat; where it is far off, the ratio "
        "is harder to learn than the latency",
    )
    p90_calibration: dict[Target, Literal["global", "load_bucket"]] = Field(
        default_factory=lambda: {"ttft": "load_bucket", "tpot": "global"},
        description="per target: global, one conformal shift; load_bucket, one per load bucket (BUCKET_EDGES) "
        "with at least calibration_min_bucket_samples calibration rows, the global shift for the others. "
        "TTFT's error grows with the queue it joins (per bucket measured better); TPOT's buckets drift with "
        "load (per bucket measured worse)",
    )
    p90_select: bool = Field(
        True,
        description="for a relative model, keep the p90 trees only when, calibrated on the older half of the "
        "calibration slice, they have a lower p90 loss on its newer half than the estimate times a calibrated "
        "factor (flat p90); else publish the flat one. Trees fitted on older load can be confidently wrong on "
        "newer load, the estimate's shape holds",
    )
    point_select: bool = Field(
        True,
        description="when the samples carry the estimate (and relative_to_estimate is not never), keep the point "
        "trees (relative or absolute, as relative_to_estimate chose) only when their MAPE on the newer half of "
        "the calibration slice is lower than the estimate times a factor from its older half (the median "
        "ratio); else publish that flat "
        "model, with a flat p90, both calibrated on the whole slice. Trees that learned the training window's "
        "load can be worse than the estimate on newer load, and a model worse than the estimate is never published",
    )
    served_calibration: OnlineCalibrationConfig = Field(
        default_factory=OnlineCalibrationConfig,
        description="the routing service's online p90 calibration (its online_calibration setting): the held-out "
        "p90 is also scored as served through it (p90 coverage as served)",
    )
    calibration_min_bucket_samples: int = Field(
        200, ge=10, description="fewest calibration rows for a load bucket to get its own p90 shift"
    )
    min_improvement_frac: float = Field(
        0.0, ge=0, lt=1, description="candidate's score must beat the current model's by this relative margin"
    )
    max_regression_frac: float = Field(
        0.05, ge=0, description="no target's MAPE or p90 loss may exceed the current model's by this relative margin"
    )
    stratum_min_samples: int = Field(
        200, ge=1,
        description="a stratum (STRATA: queue depth, KV use, prompt length) with at least this many held-out rows "
        "of a target is gated on its own",
    )
    stratum_max_regression_frac: float = Field(
        0.10, ge=0,
        description="in a gated stratum, no MAPE or p90 loss may exceed the current model's by this relative margin "
        "(looser than the average's: a stratum has fewer rows)",
    )
    probe_context_tokens: int = Field(
        131_072, ge=1, description="longest prompt the publish probe grid tries (the served context length), tokens"
    )
    probe_max_requests: int = Field(
        1024, ge=1, description="deepest queue and largest batch the publish probe grid tries, requests"
    )
    probe_ceiling_factor: float = Field(
        10.0, gt=0,
        description="a probe prediction above this many times the target's largest training latency (and above "
        "max_<target>_ms in any case) is out of range and refuses the model",
    )

    @model_validator(mode="after")
    def _check(self) -> "TrainingConfig":
        missing = [t for t in TARGETS if t not in self.p90_calibration]
        if missing:
            raise ValueError(f"p90_calibration: missing targets {missing} (give both ttft and tpot)")
        if self.feature_set not in FEATURE_SETS:
            raise ValueError(f"feature_set must be one of {sorted(FEATURE_SETS)}, got {self.feature_set}")
        if self.holdout_frac + self.calibration_frac >= 0.8:
            raise ValueError(
                f"holdout_frac + calibration_frac must be < 0.8 (training needs the rest), "
                f"got {self.holdout_frac} + {self.calibration_frac}"
            )
        return self

    def max_latency_ms(self, target: Target) -> float:
        return self.max_ttft_ms if target == "ttft" else self.max_tpot_ms
