"""Held-out evaluation: candidate, current model and profile estimate scored on the same rows, by stratum."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from routing.features import FEATURES, TARGETS, Target
from routing.models.validated import document_predictions
from routing.training.buckets import bucket_labels, bucket_of
from routing.training.config import TrainingConfig
from routing.training.data import PreparedSamples
from routing.training.online import served_p90
from routing.training.probe import ProbeReport
from routing.training.scores import latency_metrics
from routing.training.split import holdout_rows, splits_for


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


def evaluate(target: Target, x: np.ndarray, y_ms: np.ndarray, mean_ms: np.ndarray, p90_ms: np.ndarray,
             p90_served_ms: np.ndarray | None = None) -> dict:
    """Overall metrics plus one entry per load bucket (see BUCKET_EDGES) and one per stratum (STRATA).

    p90_served_ms: the p90 as the router serves it (online calibration, routing.training.online); its
    coverage and loss are added as "served" {"p90_coverage", "p90_loss"}, overall and per stratum.
    """
    mean_ms, p90_ms = np.asarray(mean_ms), np.asarray(p90_ms)
    out = latency_metrics(y_ms, mean_ms, p90_ms)
    if p90_served_ms is not None:
        out["served"] = _served(y_ms, mean_ms, p90_served_ms)
    b = bucket_of(target, x)
    out["buckets"] = []
    for k, label in enumerate(bucket_labels(target)):
        sel = b == k
        out["buckets"].append({"bucket": label, **latency_metrics(y_ms[sel], mean_ms[sel], p90_ms[sel])})
    out["strata"] = []
    for stratum in STRATA:
        sel = stratum.select(target, x)
        out["strata"].append({"name": stratum.name, **latency_metrics(y_ms[sel], mean_ms[sel], p90_ms[sel])})
        if p90_served_ms is not None:
            out["strata"][-1]["served"] = _served(y_ms[sel], mean_ms[sel], np.asarray(p90_served_ms)[sel])
    return out


def _served(y_ms: np.ndarray, mean_ms: np.ndarray, p90_ms: np.ndarray) -> dict:
    m = latency_metrics(y_ms, mean_ms, p90_ms)
    return {"p90_coverage": m["p90_coverage"], "p90_loss": m["p90_loss"]}


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
    candidate: dict[Target, dict]  # with "served": the p90 as served with online calibration
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
            served = self.candidate[t].get("served") or {}
            if served.get("p90_coverage") is not None:
                out[f"{t}_served_p90_coverage"] = float(served["p90_coverage"])
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
    (routing.models.predictor.ProfileEstimator).
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
        served = served_p90(t, x, c_p90, y, recorded_s=d.recorded_at_s[h], config=cfg.served_calibration,
                            dispatched_s=d.dispatched_s[h] if d.dispatched_s is not None else np.full(y.size, np.nan))
        cand[t] = evaluate(t, x, y, c_mean, c_p90, served)
        e_mean = np.asarray(estimate.predict(t, x), dtype=float)
        # The router answers p90 with the estimate's one value when no model is published.
        est[t] = evaluate(t, x, y, e_mean, e_mean)
        if current_document is not None:
            k_mean, k_p90 = document_predictions(current_document, t, x, estimate)
            cur[t] = evaluate(t, x, y, k_mean, k_p90)
        points[t] = (y, c_mean, c_p90, e_mean)
    return Evaluation(holdout=holdout, candidate=cand, estimate=est, current=cur, points=points)
