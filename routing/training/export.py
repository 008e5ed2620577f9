"""Export of fitted models to the safe JSON format: scikit-learn estimators in, a publishable document out."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Literal

import numpy as np

from routing.features import FEATURE_SET_VERSION, FEATURE_SETS, TARGETS, Target
from routing.models.format import FORMAT, FORMAT_VERSION
from routing.training.buckets import BUCKET_EDGES
from routing.training.fit import TargetModels

# Exported in place of +-inf split thresholds (JSON has no infinity); for finite
# inputs "x <= 1.7e308" decides exactly like "x <= inf".
_FLOAT_MAX = float(np.finfo(float).max)


def export_hist_gradient_boosting(estimator) -> dict:
    """A fitted sklearn HistGradientBoostingRegressor as a REG dict (trees kind).

    Supports numeric features only (no categorical splits) and losses with an
    identity link (squared_error, absolute_error, quantile) or a log link
    (poisson, gamma). Reads the fitted node arrays; nothing is pickled.
    """
    predictors = getattr(estimator, "_predictors", None)
    if predictors is None:
        raise ValueError("export_hist_gradient_boosting: estimator is not fitted")
    if getattr(estimator, "is_categorical_", None) is not None and np.any(estimator.is_categorical_):
        raise ValueError("export_hist_gradient_boosting: categorical features are not supported")
    link_name = type(estimator._loss.link).__name__
    if link_name == "IdentityLink":
        link = "identity"
    elif link_name == "LogLink":
        link = "log"
    else:
        raise ValueError(f"export_hist_gradient_boosting: unsupported link {link_name}")
    trees = []
    for per_iteration in predictors:
        if len(per_iteration) != 1:
            raise ValueError("export_hist_gradient_boosting: multi-output models are not supported")
        nodes = per_iteration[0].nodes
        trees.append(
            {
                "feature": nodes["feature_idx"].astype(int).tolist(),
                "threshold": np.clip(nodes["num_threshold"], -_FLOAT_MAX, _FLOAT_MAX).tolist(),
                "left": nodes["left"].astype(int).tolist(),
                "right": nodes["right"].astype(int).tolist(),
                "value": nodes["value"].astype(float).tolist(),
                "is_leaf": nodes["is_leaf"].astype(bool).tolist(),
            }
        )
    return {
        "kind": "hist_gradient_boosting",
        "link": link,
        "baseline": float(np.ravel(estimator._baseline_prediction)[0]),
        "trees": trees,
    }


def export_linear(estimator, *, link: Literal["identity", "log"] = "identity") -> dict:
    """A fitted sklearn linear model (coef_, intercept_) as a REG dict (linear kind)."""
    if not hasattr(estimator, "coef_"):
        raise ValueError("export_linear: estimator is not fitted (no coef_)")
    return {
        "kind": "linear",
        "link": link,
        "intercept": float(np.ravel(estimator.intercept_)[0]),
        "coef": np.ravel(estimator.coef_).astype(float).tolist(),
    }


def model_document(
    *,
    version: str,
    ttft_mean: dict,
    tpot_mean: dict,
    ttft_p90: dict | None = None,
    tpot_p90: dict | None = None,
    metrics: dict[str, float] | None = None,
    created_at_s: float | None = None,
    notes: str = "",
    feature_set: int = FEATURE_SET_VERSION,
    base: str | None = None,
    relative: tuple[str, ...] = (),
) -> dict:
    """Assemble a publishable document from exported REG dicts (feature names of `feature_set` filled in).

    base: the estimate's name ("profile:<name>") the targets in `relative` predict ratios to.
    """
    if feature_set not in FEATURE_SETS:
        raise ValueError(f"model_document: feature_set must be one of {sorted(FEATURE_SETS)}, got {feature_set}")
    names = FEATURE_SETS[feature_set]
    return {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "feature_set": feature_set,
        "version": version,
        "created_at_s": created_at_s,
        "metrics": dict(metrics or {}),
        "notes": notes,
        **({"base": base} if base is not None else {}),
        "targets": {
            "ttft": {"feature_names": list(names["ttft"]), "mean": ttft_mean, "p90": ttft_p90,
                     **({"relative": True} if "ttft" in relative else {})},
            "tpot": {"feature_names": list(names["tpot"]), "mean": tpot_mean, "p90": tpot_p90,
                     **({"relative": True} if "tpot" in relative else {})},
        },
    }


def export_target(models: TargetModels) -> tuple[dict, dict]:
    """(mean, p90) as REG dicts of the safe format: trees on log latency, link "log"."""
    def flat(log_factor: float) -> dict:
        # No trees: one all-zero tree (the format needs one) under a constant log ratio.
        zero = bucket_tree(0, (0.0,), (0.0,))
        return {"kind": "hist_gradient_boosting", "link": "identity", "baseline": log_factor, "trees": [zero]}

    mean = flat(models.mean.log_factor) if models.mean_kind == "flat" else export_hist_gradient_boosting(models.mean)
    p90 = flat(0.0) if models.p90_kind == "flat" else export_hist_gradient_boosting(models.p90)
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
    """A publishable model document (routing.models.validated format) for both targets."""
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
