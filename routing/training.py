"""Training core of the latency predictor: stored samples in, a publish decision out.

Pure: no I/O, no clock, no Prefect. The retrain flow fetches samples from the
routing service and calls, in order:

1. `prepare_samples`: per target (TTFT, TPOT), drop unusable samples with a
   counted reason, order the rest by recording time, and build the feature
   matrix with routing.features (the router's own serving-time function).
2. `fit_target` on a time-ordered split (`time_split`): oldest samples train,
   the next slice calibrates, the most recent are held out. Models are
   scikit-learn HistGradientBoostingRegressor on log(latency): a point model
   (published in the format's "mean" slot; absolute error by default, so it
   predicts the median, which suits relative error better than the mean) and
   a p90 model (quantile loss, 0.9; quantiles survive the log).
   The p90 model is then calibrated on the calibration slice (conformalised
   quantile regression: one additive log offset, i.e. a factor, so that 90%
   of calibration latencies fall below it), which corrects the in-sample
   optimism of tree quantiles. A target may be relative: its models fit
   log(latency / the router's profile estimate) and the router multiplies
   back (`relative_to_estimate`: per target, the point model with the lower
   calibration MAPE); its p90 may then be "flat", the estimate times the
   calibration, when the trees do worse on the newer half of the calibration
   slice (`p90_select`).
3. `to_document`: export to the routing service's safe JSON format (trees as
   node arrays, link "log"; nothing pickled).
4. `evaluate` the candidate, the currently published model and the profile
   estimate on the same held-out rows (`holdout_rows`: the most recent slice,
   with no endpoint holding more than `holdout_max_source_frac` of it, so a
   source of fabricated samples cannot decide the gate): MAPE of the mean prediction, p90
   coverage and relative p90 (pinball) loss, overall, per load bucket and per
   stratum (STRATA: queue depth, KV-cache use, prompt length).
5. `probe_document`: the candidate's predictions over a probe grid of the
   feature ranges it may meet when serving (prompts up to the context length,
   deep queues, big batches, KV usage 0-1, every role); a non-finite, zero or
   absurd (above a ceiling) prediction anywhere on it refuses the model, even
   when forced. Held-out rows only cover the load the fleet happened to see.
6. `gate`: publish, refuse or skip, with the reason. Models are compared on
   MAPE of the point prediction and on the relative pinball loss of the p90
   (which rewards a calibrated p90, unlike coverage alone), on average and in
   every stratum with enough held-out rows.

Latencies are in ms throughout.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from routing.features import (
    FEATURE_SET_VERSION,
    FEATURE_SETS,
    FEATURES,
    RAW_FIELDS,
    ROLE_CODE,
    TARGETS,
    Target,
    columns_of,
    features_from_samples,
)
from routing.models import export_hist_gradient_boosting, model_document, parse_model_document

QUANTILE = 0.9
DROP_REASONS = ("bad_target", "non_finite_latency", "negative_latency", "absurd_latency", "bad_features")

# Load buckets for per-bucket metrics: TTFT by the queue a request joins,
# TPOT by the batch it decodes in. Lower edges; the last bucket is open.
BUCKET_EDGES: dict[Target, tuple[str, tuple[float, ...]]] = {
    "ttft": ("waiting_requests", (0, 1, 2, 4, 8)),
    "tpot": ("running_requests", (0, 8, 16, 32, 64)),
}


@dataclass(frozen=True)
class Stratum:
    """Held-out rows with lo <= feature < hi (hi None: open), scored apart from the average.

    Both targets are scored in every stratum (on their own rows): the average
    hides where routing decisions matter, because most requests meet an idle
    endpoint.
    """

    name: str
    feature: str
    lo: float
    hi: float | None

    def select(self, target: Target, x: np.ndarray) -> np.ndarray:
        """Boolean mask of the rows of x (full FEATURES[target] columns) in this stratum."""
        col = x[:, FEATURES[target].index(self.feature)]
        return (col >= self.lo) & (col < self.hi) if self.hi is not None else col >= self.lo


# Load strata (queue depth, KV-cache use) and prompt-length bands; a row is in one of each group.
STRATA: tuple[Stratum, ...] = (
    Stratum("queue 0", "waiting_requests", 0, 1),
    Stratum("queue 1-3", "waiting_requests", 1, 4),
    Stratum("queue 4+", "waiting_requests", 4, None),
    Stratum("kv < 80%", "kv_usage_frac", 0, 0.8),
    Stratum("kv >= 80%", "kv_usage_frac", 0.8, None),
    Stratum("prompt < 1k", "input_tokens", 0, 1024),
    Stratum("prompt 1k-4k", "input_tokens", 1024, 4096),
    Stratum("prompt >= 4k", "input_tokens", 4096, None),
)


class TrainingConfig(BaseModel):
    """Hyperparameters, data limits and gate thresholds of one retrain run."""

    model_config = ConfigDict(extra="forbid")

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


# -- samples ----------------------------------------------------------------


@dataclass(frozen=True)
class TargetData:
    """Usable samples of one target, oldest first.

    x: features (columns FEATURES[target]); y_ms: observed latency, ms;
    recorded_at_s: when each sample was recorded, s; seq: store sequence numbers.
    dropped: reason -> count of samples of this target left out.
    source: each sample's endpoint id (None: unknown, every row one source).
    estimate_ms: the profile estimate of each row, ms (None: not computed; models are then absolute).
    estimate_name: that estimate's name ("profile:<name>").
    """

    target: Target
    x: np.ndarray
    y_ms: np.ndarray
    recorded_at_s: np.ndarray
    seq: np.ndarray
    dropped: dict[str, int]
    source: np.ndarray | None = None
    estimate_ms: np.ndarray | None = None
    estimate_name: str | None = None

    @property
    def n(self) -> int:
        return int(self.y_ms.size)


@dataclass(frozen=True)
class PreparedSamples:
    """The fetched samples split by target, with what was dropped and why."""

    fetched: int
    by_target: dict[Target, TargetData]
    dropped_unknown_target: int = 0

    def dropped(self) -> dict[str, dict[str, int]]:
        out = {t: dict(d.dropped) for t, d in self.by_target.items()}
        if self.dropped_unknown_target:
            out["unknown"] = {"bad_target": self.dropped_unknown_target}
        return out


def prepare_samples(samples: Sequence[Mapping], cfg: TrainingConfig, *, estimate=None) -> PreparedSamples:
    """Split samples (the sample store's dicts) by target, drop bad ones, build features.

    estimate: the router's profile estimate (routing.predictor.ProfileEstimator: `name`,
    predict(target, x) -> ms); its prediction of each row is kept for relative models.

    Dropped with a reason: non-finite latency (NaN, inf, missing, not a number),
    negative latency, absurd latency (0, or above max_<target>_ms), bad
    features (a field missing, not finite, negative, or an unknown role).
    Kept samples are ordered by recorded_at_s, then seq.
    """
    rows: dict[Target, list[tuple[float, int, dict, float, str]]] = {t: [] for t in TARGETS}
    dropped = {t: dict.fromkeys(DROP_REASONS[1:], 0) for t in TARGETS}
    unknown = 0
    for i, s in enumerate(samples):
        target = s.get("target") if isinstance(s, Mapping) else None
        if target not in rows:
            unknown += 1
            continue
        y = _number(s.get("observed_ms"))
        if y is None or not math.isfinite(y):
            dropped[target]["non_finite_latency"] += 1
            continue
        if y < 0:
            dropped[target]["negative_latency"] += 1
            continue
        if y == 0 or y > cfg.max_latency_ms(target):
            dropped[target]["absurd_latency"] += 1
            continue
        feats = _raw_features(s)
        if feats is None:
            dropped[target]["bad_features"] += 1
            continue
        t_s = _number(s.get("recorded_at_s"))
        seq = _number(s.get("seq"))
        endpoint = s.get("endpoint_id")
        rows[target].append((t_s if t_s is not None and math.isfinite(t_s) else math.inf,
                             int(seq) if seq is not None and math.isfinite(seq) else i, feats, y,
                             endpoint if isinstance(endpoint, str) else ""))
    by_target = {}
    for target in TARGETS:
        kept = sorted(rows[target], key=lambda r: (r[0], r[1]))
        x = features_from_samples(target, [r[2] for r in kept])
        by_target[target] = TargetData(
            target=target,
            x=x,
            y_ms=np.array([r[3] for r in kept], dtype=float),
            recorded_at_s=np.array([r[0] for r in kept], dtype=float),
            seq=np.array([r[1] for r in kept], dtype=np.int64),
            dropped=dropped[target],
            source=np.array([r[4] for r in kept], dtype=object),
            estimate_ms=None if estimate is None else np.asarray(estimate.predict(target, x), dtype=float),
            estimate_name=None if estimate is None else f"profile:{estimate.name}",
        )
    return PreparedSamples(fetched=len(samples), by_target=by_target, dropped_unknown_target=unknown)


def _number(v) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return float(v)


def _raw_features(s: Mapping) -> dict | None:
    """The sample's raw feature fields plus role, or None when any is unusable."""
    feats = s.get("features")
    role = s.get("role")
    if not isinstance(feats, Mapping) or role not in ROLE_CODE:
        return None
    out = {}
    for name in RAW_FIELDS:
        v = _number(feats.get(name))
        if v is None or not math.isfinite(v) or v < 0:
            return None
        out[name] = v
    out["role"] = role
    return out


# -- split ------------------------------------------------------------------


@dataclass(frozen=True)
class Split:
    """Index ranges of a time-ordered split: train < calibration < holdout (most recent)."""

    train: slice
    calibration: slice
    holdout: slice

    def sizes(self) -> tuple[int, int, int]:
        return tuple(s.stop - s.start for s in (self.train, self.calibration, self.holdout))


def time_split(n: int, *, holdout_frac: float, calibration_frac: float) -> Split:
    """Split n time-ordered rows: the last ceil(n * holdout_frac) are held out, the
    ceil(n * calibration_frac) before them calibrate, the rest train."""
    if n < 0:
        raise ValueError(f"time_split: n must be >= 0, got {n}")
    n_hold = min(n, math.ceil(n * holdout_frac))
    n_cal = min(n - n_hold, math.ceil(n * calibration_frac))
    n_train = n - n_hold - n_cal
    return Split(slice(0, n_train), slice(n_train, n_train + n_cal), slice(n_train + n_cal, n))


def holdout_rows(data: TargetData, split: Split, *, max_source_frac: float) -> np.ndarray:
    """Row indices of the held-out slice that are evaluated (ascending): each source's most
    recent rows, as many as keep its share of the rows kept at most
    max(max_source_frac, 1/k, its share of the rows before the slice) (k: sources in the slice).

    A source that was as dominant before (an endpoint that simply serves more) keeps its
    rows; one that floods the most recent samples is cut back to its earlier share.
    """
    rows = np.arange(split.holdout.start, split.holdout.stop)
    if data.source is None or rows.size == 0:
        return rows
    names, inverse, counts = np.unique(data.source[rows].astype(str), return_inverse=True, return_counts=True)
    before = data.source[: split.holdout.start].astype(str)
    prior = np.array([np.mean(before == name) if before.size else 0.0 for name in names])
    allowed = np.maximum(max(max_source_frac, 1.0 / names.size), prior)
    kept = counts.copy()
    while True:
        # share <= a  <=>  count <= a / (1 - a) x (the others' rows); counts only fall, so this ends.
        others = kept.sum() - kept
        limit = np.where(allowed < 1, np.floor(allowed / np.maximum(1 - allowed, 1e-12) * others + 1e-9), kept)
        new = np.minimum(kept, limit).astype(kept.dtype)
        if np.array_equal(new, kept):
            break
        kept = new
    keep = np.zeros(rows.size, dtype=bool)
    for k in range(names.size):
        mine = np.flatnonzero(inverse == k)
        keep[mine[mine.size - kept[k]:]] = True
    return rows[keep]


def check_sample_counts(prepared: PreparedSamples, cfg: TrainingConfig) -> str | None:
    """Why there are too few samples to train and evaluate (None: enough)."""
    problems = []
    for target in TARGETS:
        data = prepared.by_target[target]
        n = data.n
        split = time_split(n, holdout_frac=cfg.holdout_frac, calibration_frac=cfg.calibration_frac)
        n_train = split.sizes()[0]
        n_hold = holdout_rows(data, split, max_source_frac=cfg.holdout_max_source_frac).size
        if n_train < cfg.min_train_samples or n_hold < cfg.min_holdout_samples:
            capped = split.sizes()[2] - n_hold
            problems.append(
                f"{target}: {n} usable samples give {n_train} to train (need {cfg.min_train_samples}) and "
                f"{n_hold} to hold out (need {cfg.min_holdout_samples}"
                + (f"; {capped} left out by holdout_max_source_frac" if capped else "") + ")"
            )
    return "too few samples: " + "; ".join(problems) if problems else None


# -- models -------------------------------------------------------------------


@dataclass
class TargetModels:
    """Fitted models of one target (on log latency) and how they were fitted.

    p90_log_offset: added to the p90 model's log prediction (calibration; with
    per-bucket calibration, the global shift, used by buckets with too few rows).
    p90_bucket_offsets: per load bucket (BUCKET_EDGES[target]), the shift used
    instead of p90_log_offset; None: one global shift.
    feature_set: the routing.features set the models were fitted on; columns:
    its columns in the full FEATURES[target] rows.
    base: the estimate's name when the models predict ratios to it (None: ms).
    p90_kind: "flat" when the p90 is the estimate times the calibration (no trees);
    p90_selection / relative_selection: the calibration-slice losses the choices were made on.
    """

    target: Target
    mean: object
    p90: object
    p90_log_offset: float
    n_train: int
    n_calibration: int
    iterations: dict[str, int] = field(default_factory=dict)
    fit_s: float = 0.0
    feature_set: int = FEATURE_SET_VERSION
    columns: np.ndarray | None = None
    p90_bucket_offsets: tuple[float, ...] | None = None
    base: str | None = None
    p90_kind: Literal["trees", "flat"] = "trees"
    p90_selection: dict[str, float] = field(default_factory=dict)
    relative_selection: dict[str, float] = field(default_factory=dict)

    def predict(self, x: np.ndarray, estimate_ms: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(mean, p90) latency, ms, straight from the scikit-learn models (x: full FEATURES[target] rows;
        estimate_ms: the estimate of each row, needed when `base` is set)."""
        shift = self.p90_shift(x)
        if self.base is not None and estimate_ms is None:
            raise ValueError(f"{self.target} models are relative to {self.base}: give estimate_ms")
        log_base = 0.0 if self.base is None else log_estimate(estimate_ms)
        if self.columns is not None:
            x = x[:, self.columns]
        return np.exp(self.mean.predict(x) + log_base), np.exp(self.p90.predict(x) + shift + log_base)

    def p90_shift(self, x: np.ndarray) -> np.ndarray | float:
        """The calibration shift (log space) of each row of x (full FEATURES[target] rows)."""
        if self.p90_bucket_offsets is None:
            return self.p90_log_offset
        return np.asarray(self.p90_bucket_offsets)[bucket_of(self.target, x)]


def log_estimate(estimate_ms: np.ndarray) -> np.ndarray:
    """log of the estimate, ms, floored at 1 us (the estimate's TPOT of a prefill row is 0)."""
    return np.log(np.maximum(np.asarray(estimate_ms, dtype=float), 1e-3))


def fit_target(data: TargetData, split: Split, cfg: TrainingConfig) -> TargetModels:
    """Fit the mean and p90 models of one target on the split's training rows.

    The calibration rows, when there are any, drive early stopping and the p90
    calibration offset; the holdout rows are not touched. With the samples'
    estimate (data.estimate_ms) and cfg.relative_to_estimate "always" (or
    "select" and a lower calibration MAPE of the relative point model), the
    models fit log(latency / estimate) and are relative to it; with "select",
    both point models are fitted (one more fit).
    """
    from sklearn.ensemble import HistGradientBoostingRegressor
    from threadpoolctl import threadpool_limits

    columns = columns_of(FEATURE_SETS[cfg.feature_set][data.target], data.target)
    candidates = [False]
    if data.estimate_ms is not None and cfg.relative_to_estimate != "never":
        has_calibration = split.calibration.stop > split.calibration.start
        candidates = [True, False] if cfg.relative_to_estimate == "select" and has_calibration else [True]
    log_est = log_estimate(data.estimate_ms) if data.estimate_ms is not None else 0.0
    x_tr, x_cal = data.x[split.train][:, columns], data.x[split.calibration][:, columns]
    if x_tr.shape[0] < 2:
        raise ValueError(f"fit_target {data.target}: need at least 2 training rows, got {x_tr.shape[0]}")
    common = dict(
        max_iter=cfg.max_iter,
        learning_rate=cfg.learning_rate,
        max_leaf_nodes=cfg.max_leaf_nodes,
        min_samples_leaf=cfg.min_samples_leaf,
        l2_regularization=cfg.l2_regularization,
        max_bins=cfg.max_bins,
        random_state=cfg.seed,
    )
    # Early stopping on the calibration slice: the most recent rows before the
    # holdout, never a random subset of the (older) training rows.
    early = (dict(early_stopping=True, n_iter_no_change=cfg.n_iter_no_change) if x_cal.shape[0]
             else dict(early_stopping=False))
    t0 = time.perf_counter()
    # A busy machine makes OpenMP's spinning threads far slower than one thread.
    with threadpool_limits(limits=cfg.n_threads, user_api="openmp"):
        fits, relative_mape = {}, {}
        for relative in candidates:
            log_y = np.log(data.y_ms) - (log_est if relative else 0.0)
            y_tr, y_cal = log_y[split.train], log_y[split.calibration]
            val = dict(X_val=x_cal, y_val=y_cal) if y_cal.size else {}
            fits[relative] = (y_tr, y_cal, val, HistGradientBoostingRegressor(
                loss=cfg.point_loss, **common, **early).fit(x_tr, y_tr, **val))
            if len(candidates) > 1:
                # MAPE in ms on the calibration slice (the relative prediction times the estimate).
                pred = fits[relative][3].predict(x_cal) - y_cal
                relative_mape["relative" if relative else "absolute"] = float(np.mean(np.abs(np.exp(pred) - 1)))
        relative = candidates[0] if len(candidates) == 1 else relative_mape["relative"] <= relative_mape["absolute"]
        y_tr, y_cal, val, mean = fits[relative]
        p90 = HistGradientBoostingRegressor(loss="quantile", quantile=QUANTILE, **common, **early).fit(x_tr, y_tr, **val)
        offset, by_bucket, kind, selection = 0.0, None, "trees", {}
        if cfg.calibrate_p90 and y_cal.size:
            x_cal_full = data.x[split.calibration]
            if relative and cfg.p90_select:
                log_base = log_estimate(data.estimate_ms[split.calibration])
                selection = {k: p90_half_loss(data.target, x_cal_full, y_cal, pred, log_base, cfg)
                             for k, pred in (("trees", p90.predict(x_cal)), ("flat", np.zeros(y_cal.size)))}
                if selection["flat"] < selection["trees"]:
                    p90, kind = FlatModel(), "flat"
            residuals = y_cal - p90.predict(x_cal)
            offset, by_bucket = calibration_offsets(data.target, x_cal_full, residuals, cfg)
    return TargetModels(
        target=data.target,
        mean=mean,
        p90=p90,
        p90_log_offset=offset,
        n_train=int(y_tr.size),
        n_calibration=int(y_cal.size),
        iterations={"mean": int(mean.n_iter_), "p90": int(p90.n_iter_)},
        fit_s=time.perf_counter() - t0,
        feature_set=cfg.feature_set,
        columns=columns,
        p90_bucket_offsets=by_bucket,
        base=data.estimate_name if relative else None,
        p90_kind=kind,
        p90_selection=selection,
        relative_selection=relative_mape,
    )


class FlatModel:
    """A p90 'model' with no trees: 0 in log-ratio space, so the p90 is the estimate times the calibration."""

    n_iter_ = 0

    def predict(self, x: np.ndarray) -> np.ndarray:
        return np.zeros(len(x))


def calibration_offsets(target: Target, x: np.ndarray, residuals: np.ndarray,
                        cfg: TrainingConfig) -> tuple[float, tuple[float, ...] | None]:
    """(global conformal offset, per-bucket offsets or None) of calibration rows x (full FEATURES[target]
    rows) with log residuals observed - p90 prediction, as cfg.p90_calibration says for the target."""
    offset = conformal_offset(residuals, quantile=QUANTILE)
    if cfg.p90_calibration[target] != "load_bucket":
        return offset, None
    return offset, bucket_offsets(target, x, residuals, global_offset=offset,
                                  min_samples=cfg.calibration_min_bucket_samples)


def p90_half_loss(target: Target, x: np.ndarray, log_y: np.ndarray, pred: np.ndarray, log_base: np.ndarray,
                  cfg: TrainingConfig) -> float:
    """Relative p90 (pinball) loss on the newer half of calibration rows of a p90 prediction (log space,
    before calibration) calibrated on the older half; log_base: log estimate, added to both."""
    half = log_y.size // 2
    if half < 1:
        return math.inf
    old, new = slice(0, half), slice(half, None)
    offset, by_bucket = calibration_offsets(target, x[old], log_y[old] - pred[old], cfg)
    shift = offset if by_bucket is None else np.asarray(by_bucket)[bucket_of(target, x[new])]
    y_ms = np.exp(log_y[new] + log_base[new])
    p90_ms = np.exp(pred[new] + shift + log_base[new])
    return float(latency_metrics(y_ms, p90_ms, p90_ms)["p90_loss"])


def bucket_offsets(
    target: Target, x: np.ndarray, residuals: np.ndarray, *, global_offset: float, min_samples: int
) -> tuple[float, ...]:
    """Conformal p90 shift per load bucket (BUCKET_EDGES[target]) of calibration rows x.

    A bucket with at least min_samples rows gets the conformal offset of its own
    residuals (log space), so the p90 covers 90% in each load level the
    calibration slice saw; the others keep global_offset. The p90 model's
    errors grow with load, and one global shift covers light-load rows too
    well and heavy-load rows too little.
    """
    b = bucket_of(target, x)
    out = []
    for k in range(len(BUCKET_EDGES[target][1])):
        r = residuals[b == k]
        out.append(conformal_offset(r, quantile=QUANTILE) if r.size >= min_samples else global_offset)
    return tuple(out)


def conformal_offset(residuals: np.ndarray, *, quantile: float) -> float:
    """The smallest shift c with at least `quantile` of residuals <= c (finite-sample corrected).

    residuals: observed - predicted, in the model's (log) space. With n
    residuals the rank is ceil((n + 1) * quantile), capped at n.
    """
    r = np.sort(np.asarray(residuals, dtype=float))
    if r.size == 0:
        raise ValueError("conformal_offset: no residuals")
    k = min(r.size, math.ceil((r.size + 1) * quantile))
    return float(r[k - 1])


def export_target(models: TargetModels) -> tuple[dict, dict]:
    """(mean, p90) as REG dicts of the safe format: trees on log latency, link "log"."""
    mean = export_hist_gradient_boosting(models.mean)
    if models.p90_kind == "flat":
        # No trees: one all-zero tree (the format needs one) under the calibration below.
        zero = bucket_tree(0, (0.0,), (0.0,))
        p90 = {"kind": "hist_gradient_boosting", "link": "identity", "baseline": 0.0, "trees": [zero]}
    else:
        p90 = export_hist_gradient_boosting(models.p90)
    for reg in (mean, p90):
        if reg["link"] != "identity":
            raise ValueError(f"export_target {models.target}: expected an identity-link model, got {reg['link']}")
        reg["link"] = "log"  # trained on log(latency): the router exponentiates
    if models.p90_bucket_offsets is None:
        p90["baseline"] += models.p90_log_offset
    else:
        names = FEATURE_SETS[models.feature_set][models.target]
        p90["trees"].append(bucket_tree(names.index(BUCKET_EDGES[models.target][0]),
                                        BUCKET_EDGES[models.target][1], models.p90_bucket_offsets))
    return mean, p90


def bucket_tree(feature: int, edges: Sequence[float], values: Sequence[float]) -> dict:
    """A tree (format node arrays) answering values[k] for rows in load bucket k.

    Bucket k holds edges[k] <= x < edges[k + 1] (the last is open), as
    bucket_of counts; the split "x <= threshold goes left" uses the largest
    float below each edge, so the tree decides exactly like bucket_of.
    Internal node i tests edges[i + 1]: left is the leaf of bucket i, right the
    next test (the last right child is the leaf of the last bucket).
    """
    k = len(edges)
    if len(values) != k:
        raise ValueError(f"bucket_tree: {k} buckets but {len(values)} values")
    n_splits = k - 1
    # Nodes: splits 0..n_splits-1, then leaves n_splits..n_splits+k-1.
    leaf = [n_splits + i for i in range(k)]
    feature_, threshold, left, right, value, is_leaf = [], [], [], [], [], []
    for i in range(n_splits):
        feature_.append(feature)
        threshold.append(float(np.nextafter(float(edges[i + 1]), -np.inf)))
        left.append(leaf[i])
        right.append(i + 1 if i + 1 < n_splits else leaf[k - 1])
        value.append(0.0)
        is_leaf.append(False)
    for i in range(k):
        feature_.append(0)
        threshold.append(0.0)
        left.append(0)
        right.append(0)
        value.append(float(values[i]))
        is_leaf.append(True)
    return {"feature": feature_, "threshold": threshold, "left": left, "right": right, "value": value,
            "is_leaf": is_leaf}


def to_document(
    models: Mapping[Target, TargetModels],
    *,
    version: str,
    metrics: Mapping[str, float],
    created_at_s: float | None = None,
    notes: str = "",
) -> dict:
    """A publishable model document (routing.models format) for both targets."""
    feature_set = models["ttft"].feature_set
    if models["tpot"].feature_set != feature_set:
        raise ValueError(f"to_document: TTFT models use feature set {feature_set}, TPOT models "
                         f"{models['tpot'].feature_set}")
    bases = {m.base for m in models.values() if m.base is not None}
    if len(bases) > 1:
        raise ValueError(f"to_document: targets are relative to different estimates {sorted(bases)}")
    ttft_mean, ttft_p90 = export_target(models["ttft"])
    tpot_mean, tpot_p90 = export_target(models["tpot"])
    return model_document(
        version=version,
        ttft_mean=ttft_mean,
        ttft_p90=ttft_p90,
        tpot_mean=tpot_mean,
        tpot_p90=tpot_p90,
        metrics={k: float(v) for k, v in metrics.items() if v is not None and math.isfinite(v)},
        created_at_s=created_at_s,
        notes=notes,
        feature_set=feature_set,
        base=bases.pop() if bases else None,
        relative=tuple(t for t in TARGETS if models[t].base is not None),
    )


# -- evaluation ----------------------------------------------------------------


def bucket_labels(target: Target) -> list[str]:
    feature, edges = BUCKET_EDGES[target]
    labels = []
    for i, lo in enumerate(edges):
        hi = edges[i + 1] if i + 1 < len(edges) else None
        if hi is None:
            labels.append(f"{feature} >= {lo:g}")
        elif hi - lo == 1:
            labels.append(f"{feature} = {lo:g}")
        else:
            labels.append(f"{feature} {lo:g}-{hi - 1:g}")
    return labels


def bucket_of(target: Target, x: np.ndarray) -> np.ndarray:
    """Load-bucket index (0..len(edges)-1) of each feature row."""
    feature, edges = BUCKET_EDGES[target]
    col = x[:, FEATURES[target].index(feature)]
    return np.searchsorted(np.asarray(edges[1:], dtype=float), col, side="right")


def latency_metrics(y_ms: np.ndarray, mean_ms: np.ndarray, p90_ms: np.ndarray) -> dict:
    """{"n", "mape", "p90_coverage", "p90_loss"} of point and p90 predictions (None when n = 0).

    mape: mean |mean - y| / y. p90_coverage: share of y <= p90. p90_loss: the
    pinball loss at 0.9 relative to y, mean of max(0.9 (y - p90), -0.1 (y - p90)) / y,
    which is lowest for the true 90th percentile.
    """
    y = np.asarray(y_ms, dtype=float)
    out = {"n": int(y.size), "mape": None, "p90_coverage": None, "p90_loss": None}
    if y.size:
        q = np.asarray(p90_ms, dtype=float)
        diff = y - q
        out["mape"] = float(np.mean(np.abs(np.asarray(mean_ms) - y) / y))
        out["p90_coverage"] = float(np.mean(y <= q))
        out["p90_loss"] = float(np.mean(np.maximum(QUANTILE * diff, (QUANTILE - 1) * diff) / y))
    return out


def evaluate(target: Target, x: np.ndarray, y_ms: np.ndarray, mean_ms: np.ndarray, p90_ms: np.ndarray) -> dict:
    """Overall metrics plus one entry per load bucket (see BUCKET_EDGES) and one per stratum (STRATA)."""
    mean_ms, p90_ms = np.asarray(mean_ms), np.asarray(p90_ms)
    out = latency_metrics(y_ms, mean_ms, p90_ms)
    b = bucket_of(target, x)
    out["buckets"] = []
    for k, label in enumerate(bucket_labels(target)):
        sel = b == k
        out["buckets"].append({"bucket": label, **latency_metrics(y_ms[sel], mean_ms[sel], p90_ms[sel])})
    out["strata"] = []
    for stratum in STRATA:
        sel = stratum.select(target, x)
        out["strata"].append({"name": stratum.name, **latency_metrics(y_ms[sel], mean_ms[sel], p90_ms[sel])})
    return out


def document_predictions(document: dict, target: Target, x: np.ndarray, estimate=None) -> tuple[np.ndarray, np.ndarray]:
    """(mean, p90) of a published document, ms, exactly as the router computes them
    (a document without a p90 model answers p90 with its mean, as the router does; a
    relative one is multiplied by `estimate`, which must be the one it names)."""
    model = parse_model_document(document)
    return (model.predict_ms(target, x, quantile="mean", estimate=estimate),
            model.predict_ms(target, x, quantile="p90", estimate=estimate))


# -- probe grid --------------------------------------------------------------------


# Features that measure work ahead of a request (tokens, ms): probed together at none, the most
# seen in training and the cap, so the grid stays small (3 levels, not 3^5 combinations).
_WORK_TOKEN_FEATURES = ("prefill_tokens_in_flight", "decode_tokens_in_flight", "prefill_batch_tokens",
                        "prefill_queued_tokens")


@dataclass(frozen=True)
class ProbeResult:
    """One target's model (mean or p90) over the probe grid.

    ceiling_ms: predictions above it are out of range (ceiling_basis: how it
    was set, with its numbers); min_ms / max_ms: the
    extremes of the grid's predictions (inf when one overflowed); bad_rows:
    grid rows out of range (not finite, <= 0 or above the ceiling); first_bad:
    the worst of them, described ("" when none).
    """

    target: Target
    quantile: str
    rows: int
    ceiling_ms: float
    ceiling_basis: str
    min_ms: float
    max_ms: float
    bad_rows: int
    first_bad: str = ""

    @property
    def ok(self) -> bool:
        return self.bad_rows == 0


@dataclass(frozen=True)
class ProbeReport:
    """Every target's and quantile's probe result; `failure` is the first one-line refusal."""

    results: tuple[ProbeResult, ...]

    def failure(self) -> str | None:
        bad = [r for r in self.results if not r.ok]
        if not bad:
            return None
        r = bad[0]
        also = f"; also {', '.join(f'{b.target} {b.quantile}' for b in bad[1:])}" if len(bad) > 1 else ""
        return (f"probe grid: {r.target} {r.quantile} {r.first_bad}; {r.bad_rows} of {r.rows} probe rows out of "
                f"range (ceiling {r.ceiling_ms:.0f} ms: {r.ceiling_basis}){also}")


def probe_grid(target: Target, x_train: np.ndarray, cfg: TrainingConfig) -> np.ndarray:
    """Feature rows (full FEATURES[target] columns) spanning what serving may meet.

    Per feature: none, the most seen in training and a cap: prompts (and
    tokens generated) up to cfg.probe_context_tokens, queue and batch up to
    cfg.probe_max_requests, KV usage 0 / 0.5 / 1, prefix hits 0 / 1, work in
    flight up to context x max requests tokens (together, at one of the three
    levels); crossed with each role. Units as in routing.features.
    """
    names = FEATURES[target]
    seen = {n: float(x_train[:, j].max()) if x_train.size else 0.0 for j, n in enumerate(names)}
    ctx, reqs = float(cfg.probe_context_tokens), float(cfg.probe_max_requests)

    def levels(name: str, cap: float, low: float = 0.0) -> list[dict[str, float]]:
        return [{name: v} for v in sorted({low, min(seen[name], cap), cap})]

    work_cap = ctx * reqs
    elapsed_cap = cfg.max_latency_ms("ttft")
    axes = [
        levels("input_tokens", ctx, low=1.0),
        [{"prefix_cache_hit_frac": 0.0}, {"prefix_cache_hit_frac": 1.0}],
        [{"kv_usage_frac": v} for v in (0.0, 0.5, 1.0)],
        levels("waiting_requests", reqs),
        levels("running_requests", reqs),
        [{**{f: 0.0 for f in _WORK_TOKEN_FEATURES}, "prefill_batch_elapsed_ms": 0.0},
         {**{f: min(seen[f], work_cap) for f in _WORK_TOKEN_FEATURES},
          "prefill_batch_elapsed_ms": min(seen["prefill_batch_elapsed_ms"], elapsed_cap)},
         {**{f: work_cap for f in _WORK_TOKEN_FEATURES}, "prefill_batch_elapsed_ms": elapsed_cap}],
        [{f"role_{r}": 1.0} for r in ROLE_CODE],
    ]
    if target == "tpot":
        axes.append(levels("tokens_generated", ctx))
    rows = []
    for combo in itertools.product(*axes):
        row = dict.fromkeys(names, 0.0)
        for part in combo:
            row.update(part)
        rows.append([row[n] for n in names])
    return np.array(rows, dtype=float)


def describe_row(target: Target, row: np.ndarray) -> str:
    """The probe row's request and load, e.g. 'input_tokens=131072 waiting_requests=1024 role=prefill'."""
    names = FEATURES[target]
    role = next((n[len("role_"):] for n, v in zip(names, row) if n.startswith("role_") and v), "?")
    shown = [f"{n}={v:g}" for n, v in zip(names, row)
             if not n.startswith("role_") and n not in _WORK_TOKEN_FEATURES + ("prefill_batch_elapsed_ms",)]
    work = row[names.index("decode_tokens_in_flight")]
    return " ".join(shown + [f"work_in_flight_tokens={work:g}", f"role={role}"])


def probe_document(document: dict, prepared: PreparedSamples, cfg: TrainingConfig, *, estimate=None) -> ProbeReport:
    """Predict every probe-grid row with the document, as the router would, and check each prediction.

    Out of range: not finite (exp() overflowed), <= 0 ms (a negative raw
    prediction the router clips to 0), or above the ceiling: the smaller of
    cfg.probe_ceiling_factor x the largest latency of the target's training
    rows and cfg.max_<target>_ms (what counts as absurd in a sample), ms. A
    relative model (multiplied by `estimate`, which the router serves without
    a model) may also go up to cfg.probe_ceiling_factor x the estimate of the
    row: a prompt queued behind 10^8 tokens legitimately waits hours.
    """
    relative = parse_model_document(document).relative
    splits = splits_for(prepared, cfg)
    results = []
    for t in TARGETS:
        d = prepared.by_target[t]
        train = splits[t].train
        grid = probe_grid(t, d.x[train], cfg)
        train_max = float(d.y_ms[train].max()) if d.y_ms[train].size else cfg.max_latency_ms(t)
        limit = cfg.max_latency_ms(t)
        ceiling = min(cfg.probe_ceiling_factor * train_max, limit)
        basis = (f"{cfg.probe_ceiling_factor:g} x the largest training {t.upper()} {train_max:.4g} ms"
                 if ceiling < limit else f"max_{t}_ms {limit:g}")
        row_ceiling, may_be_zero = ceiling, False
        if t in relative:
            est = np.asarray(estimate.predict(t, grid), dtype=float)
            row_ceiling = np.maximum(ceiling, cfg.probe_ceiling_factor * est)
            # Where the estimate itself is 0 (TPOT of a prefill endpoint, which the router never asks), so is
            # the relative model, as the estimate serves it.
            may_be_zero = est <= 0
            basis += f", or {cfg.probe_ceiling_factor:g} x the profile estimate of the row"
        with np.errstate(over="ignore", invalid="ignore"):
            mean, p90 = document_predictions(document, t, grid, estimate)
        for quantile, pred in (("mean", mean), ("p90", p90)):
            finite = np.isfinite(pred)
            bad = ~finite | ((pred <= 0) & ~may_be_zero) | (pred > row_ceiling)
            first_bad = ""
            if bad.any():
                # The worst row: an overflow first, then the largest, then a zero.
                key = np.where(~finite, np.inf, np.where(pred <= 0, -1.0, pred))
                i = int(np.argmax(np.where(bad, key, -np.inf)))
                what = ("not finite (overflow)" if not finite[i] else "<= 0" if pred[i] <= 0
                        else "above the ceiling")
                first_bad = f"predicts {pred[i]:.4g} ms, {what}, at {describe_row(t, grid[i])}"
            results.append(ProbeResult(
                target=t, quantile=quantile, rows=int(grid.shape[0]), ceiling_ms=ceiling, ceiling_basis=basis,
                min_ms=float(np.min(pred)), max_ms=float(np.max(pred)), bad_rows=int(bad.sum()),
                first_bad=first_bad))
    return ProbeReport(tuple(results))


# -- gate ------------------------------------------------------------------------


@dataclass(frozen=True)
class GateDecision:
    """publish: whether to publish; code: publish, publish_forced, refused_probe, refused_estimate,
    refused_current, skipped; reason: the numbers behind it."""

    publish: bool
    code: str
    reason: str


GATE_METRICS = ("mape", "p90_loss")


def score(metrics: Mapping[Target, Mapping]) -> float:
    """One number to rank models: the mean of MAPE and relative p90 loss over both targets."""
    return float(np.mean([metrics[t][k] for t in TARGETS for k in GATE_METRICS]))


def gate(
    candidate: Mapping[Target, Mapping],
    *,
    estimate: Mapping[Target, Mapping],
    current: Mapping[Target, Mapping] | None,
    current_version: str | None,
    force: bool,
    cfg: TrainingConfig,
) -> GateDecision:
    """Decide whether the candidate replaces the published model.

    Each mapping holds a target's held-out metrics (`mape`, `p90_loss`), all
    on the same rows; the estimate's p90 is its point estimate, which is what
    the router uses when no model is published. Checked in order:
    1. never worse than the profile estimate, on either metric of either
       target, even when forced;
    2. unless forced, better than the current model (when there is one): the
       score (mean of the four metrics) lower by min_improvement_frac, and none
       of the four above the current one's by more than max_regression_frac;
    3. unless forced, in every stratum (`strata` of each target's metrics, see
       STRATA) with at least stratum_min_samples rows, neither metric above the
       current one's by more than stratum_max_regression_frac: a model better
       on average, because idle requests dominate, may be worse where the
       queue is deep.
    """
    for t in TARGETS:
        for k in GATE_METRICS:
            c, e = candidate[t][k], estimate[t][k]
            if c > e:
                return GateDecision(False, "refused_estimate",
                                    f"{t} {_NAMES[k]} {c:.2%} is worse than the profile estimate's {e:.2%}")
    summary = _summary(candidate)
    if current is None:
        return GateDecision(True, "publish", f"no model published yet; candidate ({summary}) beats the profile estimate")
    if force:
        return GateDecision(True, "publish_forced",
                            f"forced: candidate ({summary}); current {current_version} ({_summary(current)})")
    cand, cur = score(candidate), score(current)
    needed = cur * (1 - cfg.min_improvement_frac)
    if not cand < needed:
        return GateDecision(False, "refused_current",
                            f"score {cand:.2%} is not below the current model {current_version}'s {cur:.2%}"
                            + (f" minus {cfg.min_improvement_frac:.0%}" if cfg.min_improvement_frac else "")
                            + f" (candidate {summary}; current {_summary(current)})")
    for t in TARGETS:
        for k in GATE_METRICS:
            limit = current[t][k] * (1 + cfg.max_regression_frac)
            if candidate[t][k] > limit:
                return GateDecision(False, "refused_current",
                                    f"{t} {_NAMES[k]} {candidate[t][k]:.2%} regresses past the current model "
                                    f"{current_version}'s {current[t][k]:.2%} (+{cfg.max_regression_frac:.0%} allowed)")
    regression = stratum_regression(candidate, current, cfg)
    if regression is not None:
        return GateDecision(False, "refused_current", f"{regression} (current model {current_version}; score "
                                                      f"{cand:.2%} vs {cur:.2%} on average)")
    return GateDecision(True, "publish",
                        f"score {cand:.2%} beats current {current_version}'s {cur:.2%} "
                        f"(candidate {summary}; current {_summary(current)})")


_NAMES = {"mape": "MAPE", "p90_loss": "p90 loss"}


def stratum_regression(candidate: Mapping[Target, Mapping], current: Mapping[Target, Mapping],
                       cfg: TrainingConfig) -> str | None:
    """The first stratum where the candidate is worse than the current model past the margin (None: none).

    Only strata where both were scored on at least cfg.stratum_min_samples
    rows count (fewer rows: too noisy to refuse on). Metrics of a stratum
    missing from either side are skipped.
    """
    for t in TARGETS:
        current_strata = {s["name"]: s for s in current[t].get("strata", ())}
        for c in candidate[t].get("strata", ()):
            k_ = current_strata.get(c["name"])
            if k_ is None or min(c["n"], k_["n"]) < cfg.stratum_min_samples:
                continue
            for k in GATE_METRICS:
                if c[k] is None or k_[k] is None:
                    continue
                limit = k_[k] * (1 + cfg.stratum_max_regression_frac)
                if c[k] > limit:
                    return (f"{t} stratum {c['name']} (n={c['n']}): {_NAMES[k]} {c[k]:.2%} regresses past the "
                            f"current model's {k_[k]:.2%} (+{cfg.stratum_max_regression_frac:.0%} allowed)")
    return None


def _summary(metrics: Mapping[Target, Mapping]) -> str:
    return ", ".join(f"{t} MAPE {metrics[t]['mape']:.2%} p90 loss {metrics[t]['p90_loss']:.2%}" for t in TARGETS)


# -- one run ---------------------------------------------------------------------


def splits_for(prepared: PreparedSamples, cfg: TrainingConfig) -> dict[Target, Split]:
    """The time-ordered split of each target's samples."""
    return {
        t: time_split(prepared.by_target[t].n, holdout_frac=cfg.holdout_frac, calibration_frac=cfg.calibration_frac)
        for t in TARGETS
    }


def fit_all(prepared: PreparedSamples, cfg: TrainingConfig) -> dict[Target, TargetModels]:
    """Fit both targets' models on their time-ordered training rows."""
    splits = splits_for(prepared, cfg)
    return {t: fit_target(prepared.by_target[t], splits[t], cfg) for t in TARGETS}


@dataclass(frozen=True)
class Evaluation:
    """Held-out metrics (see `evaluate`) of the candidate, the current model and the estimate.

    holdout: per target {"n", "from_s", "to_s", "sources", "left_out_by_source_cap"}: the rows every
    model was scored on (holdout_rows).
    probe: the candidate over the probe grid (probe_document); None until probed.
    current: None when no model is published. points: per target (observed,
    candidate mean, candidate p90, estimate) on the held-out rows, for plots.
    """

    holdout: dict[Target, dict]
    candidate: dict[Target, dict]
    estimate: dict[Target, dict]
    current: dict[Target, dict] | None
    points: dict[Target, tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]
    probe: ProbeReport | None = None

    def metrics(self) -> dict[str, float]:
        """Flat finite metrics for the published document (name -> number)."""
        out: dict[str, float] = {}
        for t in TARGETS:
            out[f"{t}_holdout_samples"] = float(self.holdout[t]["n"])
            for name, block in (("", self.candidate), ("estimate_", self.estimate)):
                for key in ("mape", "p90_coverage", "p90_loss"):
                    v = block[t].get(key)
                    if v is not None:
                        out[f"{t}_{name}{key}"] = float(v)
        return out


def evaluate_all(
    prepared: PreparedSamples,
    cfg: TrainingConfig,
    *,
    candidate_document: dict,
    current_document: dict | None,
    estimate,
) -> Evaluation:
    """Score candidate, current model and profile estimate on the same most recent held-out rows.

    The candidate is scored through its exported document, so what is measured
    is what the router will serve. estimate: has predict(target, x) -> ms
    (routing.predictor.ProfileEstimator).
    """
    splits = splits_for(prepared, cfg)
    holdout, cand, est, cur, points = {}, {}, {}, {} if current_document is not None else None, {}
    for t in TARGETS:
        d = prepared.by_target[t]
        h = holdout_rows(d, splits[t], max_source_frac=cfg.holdout_max_source_frac)
        x, y = d.x[h], d.y_ms[h]
        holdout[t] = {"n": int(y.size), "from_s": float(d.recorded_at_s[h][0]) if y.size else None,
                      "to_s": float(d.recorded_at_s[h][-1]) if y.size else None,
                      "sources": int(np.unique(d.source[h].astype(str)).size) if d.source is not None else None,
                      "left_out_by_source_cap": splits[t].sizes()[2] - int(y.size)}
        c_mean, c_p90 = document_predictions(candidate_document, t, x, estimate)
        cand[t] = evaluate(t, x, y, c_mean, c_p90)
        e_mean = np.asarray(estimate.predict(t, x), dtype=float)
        # The router answers p90 with the estimate's one value when no model is published.
        est[t] = evaluate(t, x, y, e_mean, e_mean)
        if current_document is not None:
            k_mean, k_p90 = document_predictions(current_document, t, x, estimate)
            cur[t] = evaluate(t, x, y, k_mean, k_p90)
        points[t] = (y, c_mean, c_p90, e_mean)
    return Evaluation(holdout=holdout, candidate=cand, estimate=est, current=cur, points=points)


def decide_publish(
    document: dict,
    evaluation: Evaluation,
    prepared: PreparedSamples,
    cfg: TrainingConfig,
    *,
    current_version: str | None,
    force: bool,
    estimate=None,
) -> tuple[GateDecision, Evaluation]:
    """The publish decision for a candidate document: the probe grid first (never forced past), then `gate`.

    estimate: the profile estimate a relative document is multiplied by.
    Returns the decision and the evaluation with its probe report.
    """
    report = probe_document(document, prepared, cfg, estimate=estimate)
    evaluation = replace(evaluation, probe=report)
    failure = report.failure()
    if failure is not None:
        return GateDecision(False, "refused_probe", failure), evaluation
    decision = gate(evaluation.candidate, estimate=evaluation.estimate, current=evaluation.current,
                    current_version=current_version, force=force, cfg=cfg)
    return decision, evaluation
