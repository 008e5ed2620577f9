"""Training data assembly: stored samples in, per-target feature matrices out."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from routing.features import RAW_FIELDS, ROLE_CODE, TARGETS, Target, features_from_samples
from routing.training.config import TrainingConfig

DROP_REASONS = ("bad_target", "non_finite_latency", "negative_latency", "absurd_latency", "bad_features")


@dataclass(frozen=True)
class TargetData:
    """Usable samples of one target, oldest first.

    x: features (columns FEATURES[target]); y_ms: observed latency, ms;
    recorded_at_s: when each sample was recorded, s; seq: store sequence numbers.
    dropped: reason -> count of samples of this target left out.
    source: each sample's endpoint id (None: unknown, every row one source).
    estimate_ms: the profile estimate of each row, ms (None: not computed; models are then absolute).
    estimate_name: that estimate's name ("profile:<name>").
    dispatched_s: when each request was dispatched (its prediction served), s: a TTFT sample's
    recorded time less its TTFT; a TPOT sample's request's TTFT sample's (NaN: not among the samples).
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
    dispatched_s: np.ndarray | None = None

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

    estimate: the router's profile estimate (routing.models.predictor.ProfileEstimator: `name`,
    predict(target, x) -> ms); its prediction of each row is kept for relative models.

    Dropped with a reason: non-finite latency (NaN, inf, missing, not a number),
    negative latency, absurd latency (0, or above max_<target>_ms), bad
    features (a field missing, not finite, negative, or an unknown role).
    Kept samples are ordered by recorded_at_s, then seq.
    """
    rows: dict[Target, list[tuple[float, int, dict, float, str, str]]] = {t: [] for t in TARGETS}
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
                             endpoint if isinstance(endpoint, str) else "", str(s.get("request_id", ""))))
    # A TTFT is observed at first token: the request was dispatched (and predicted) that long before.
    dispatched = {r[5]: r[0] - r[3] / 1000.0 for r in rows["ttft"] if r[5]}
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
            dispatched_s=np.array([dispatched.get(r[5], np.nan) for r in kept], dtype=float),
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
