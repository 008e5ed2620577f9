"""Validated, ready-to-serve latency models: a decoded document checked completely, then compiled.

The router validates a document (routing.models.format) completely before it can serve: schema, feature
names equal to a feature set routing.features knows for the target, array
shapes, child indices that form a tree (no cycles, bounded depth), finite
numbers, size limits, and finite non-negative predictions on probe rows.

Feature indices in a document refer to its own feature_names. A document of an
older feature set (fewer features) is compiled against the router's current
rows by mapping each index to the current column of the same name, so it is
served exactly as it was trained; a feature set the router does not know is
refused with the sets it does know.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import numpy as np
from pydantic import ValidationError

from planner.strict import error_message
from routing.models.compiled import BitvectorTrees, CompiledLinear, levelwise_trees
from routing.features import FEATURE_SET_VERSION, FEATURE_SETS, FEATURES, TARGETS, Target, columns_of
from routing.models.format import ModelDocument, TargetModels, TreesRegressor

MAX_TREE_DEPTH = 64
# Bounds that keep one prediction call cheap and one document small.
DEFAULT_MAX_TREES = 2_000
DEFAULT_MAX_NODES = 500_000


@dataclass(frozen=True)
class LatencyModel:
    """A validated, ready-to-serve model bundle; immutable once built."""

    version: str
    document: dict
    metrics: dict[str, float]
    created_at_s: float | None
    feature_set: int
    _models: dict[tuple[str, str], object] = field(repr=False)
    base: str | None = None
    relative: frozenset[str] = frozenset()

    def has_quantile(self, target: Target, quantile: str) -> bool:
        return (target, quantile) in self._models

    def predict(self, target: Target, x: np.ndarray, *, quantile: Literal["mean", "p90"] = "mean") -> np.ndarray:
        """Predicted latency, ms (>= 0), one per row of x (the router's current FEATURES[target] columns,
        whatever feature set the model was trained on).

        quantile "p90" falls back to the mean model when no p90 model was published.
        For a relative target (in `relative`) this is the ratio to the `base` estimate;
        `predict_ms` gives milliseconds.
        """
        model = self._models.get((target, quantile)) or self._models[(target, "mean")]
        raw = model.raw(x)
        if model.log_link:
            raw = np.exp(raw)
        return np.maximum(raw, 0.0)

    def predict_ms(self, target: Target, x: np.ndarray, *, quantile: Literal["mean", "p90"] = "mean",
                   estimate=None) -> np.ndarray:
        """Predicted latency, ms: `predict`, times the estimate's prediction for a relative model.

        estimate: has `name` and predict(target, x) -> ms (routing.models.predictor.ProfileEstimator); needed
        only for a relative target, and must be the estimate named in `base` (ValueError otherwise).
        """
        pred = self.predict(target, x, quantile=quantile)
        if target not in self.relative:
            return pred
        name = None if estimate is None else f"profile:{estimate.name}"
        if name != self.base:
            raise ValueError(f"model {self.version}: predictions are relative to {self.base}, "
                             f"given {name or 'no estimate'}")
        return pred * estimate.predict(target, x)


def parse_model_document(data: dict, *, max_trees: int = DEFAULT_MAX_TREES, max_nodes: int = DEFAULT_MAX_NODES) -> LatencyModel:
    """Validate a decoded JSON document and compile it; ValueError names the field.

    max_trees / max_nodes: limits over the whole document (all targets).
    """
    try:
        doc = ModelDocument.model_validate(data)
    except ValidationError as exc:
        raise ValueError(_describe(exc)) from None
    models: dict[tuple[str, str], object] = {}
    total_trees = total_nodes = 0
    feature_set = doc.feature_set_version
    if feature_set not in FEATURE_SETS:
        raise ValueError(
            f"feature_set: {feature_set} is not known to this router (knows {sorted(FEATURE_SETS)}; "
            f"current {FEATURE_SET_VERSION}): retrain against this router's features"
        )
    for target in TARGETS:
        tm: TargetModels = getattr(doc.targets, target)
        expected = list(FEATURE_SETS[feature_set][target])
        if tm.feature_names != expected:
            raise ValueError(
                f"targets.{target}.feature_names: expected {expected} (routing.features feature set "
                f"{feature_set}), got {tm.feature_names}"
            )
        # Document column i is the router's column cols[i] (identity for the current set).
        cols = columns_of(expected, target)
        width = len(FEATURES[target])
        for quantile in ("mean", "p90"):
            reg = getattr(tm, quantile)
            if reg is None:
                continue
            where = f"targets.{target}.{quantile}"
            if isinstance(reg, TreesRegressor):
                total_trees += len(reg.trees)
                total_nodes += sum(len(t.is_leaf) for t in reg.trees)
                if total_trees > max_trees:
                    raise ValueError(f"{where}.trees: document has more than {max_trees} trees")
                if total_nodes > max_nodes:
                    raise ValueError(f"{where}.trees: document has more than {max_nodes} nodes")
                compiled = _compile_trees(reg, n_features=len(expected), where=where, columns=cols)
            else:
                if len(reg.coef) != len(expected):
                    raise ValueError(f"{where}.coef: expected {len(expected)} coefficients, got {len(reg.coef)}")
                coef = np.zeros(width)
                coef[cols] = reg.coef
                compiled = CompiledLinear(coef, float(reg.intercept), reg.link == "log")
            _probe(compiled, n_features=width, where=where)
            models[(target, quantile)] = compiled
    return LatencyModel(
        version=doc.version,
        document=doc.model_dump(mode="json"),
        metrics=dict(doc.metrics),
        created_at_s=doc.created_at_s,
        feature_set=feature_set,
        _models=models,
        base=doc.base,
        relative=frozenset(t for t in TARGETS if getattr(doc.targets, t).relative),
    )


def _compile_trees(reg: TreesRegressor, *, n_features: int, where: str, columns: np.ndarray):
    """Validate the trees against the document's n_features, then index the router's columns."""
    checked = []
    for t_idx, tree in enumerate(reg.trees):
        loc = f"{where}.trees[{t_idx}]"
        n = len(tree.is_leaf)
        is_leaf = np.array(tree.is_leaf, dtype=bool)
        feature = np.array(tree.feature, dtype=np.int64)
        left = np.array(tree.left, dtype=np.int64)
        right = np.array(tree.right, dtype=np.int64)
        internal = ~is_leaf
        if internal.any():
            bad = internal & ((feature < 0) | (feature >= n_features))
            if bad.any():
                i = int(np.argmax(bad))
                raise ValueError(f"{loc}.feature[{i}]: must be 0..{n_features - 1}, got {feature[i]}")
            for name, child in (("left", left), ("right", right)):
                bad = internal & ((child <= 0) | (child >= n))
                if bad.any():
                    i = int(np.argmax(bad))
                    raise ValueError(f"{loc}.{name}[{i}]: must be a node index 1..{n - 1}, got {child[i]}")
        depth = _tree_depth(is_leaf, left, right, loc=loc)
        feature = np.where(internal, columns[np.clip(feature, 0, n_features - 1)], 0)
        checked.append((depth, tree, is_leaf, feature, left, right))
    fast = BitvectorTrees.build(checked, n_features=int(columns.max()) + 1, baseline=float(reg.baseline),
                                 log_link=reg.link == "log")
    return fast if fast is not None else levelwise_trees(checked, reg)


def _tree_depth(is_leaf: np.ndarray, left: np.ndarray, right: np.ndarray, *, loc: str) -> int:
    """Depth of the tree from node 0; raises on cycles, shared nodes or excess depth."""
    seen = np.zeros(is_leaf.size, dtype=bool)
    frontier = [0]
    seen[0] = True
    depth = 0
    while True:
        nxt = []
        for node in frontier:
            if is_leaf[node]:
                continue
            for child in (int(left[node]), int(right[node])):
                if seen[child]:
                    raise ValueError(f"{loc}: node {child} is reached twice (children must form a tree)")
                seen[child] = True
                nxt.append(child)
        if not nxt:
            return depth
        depth += 1
        if depth > MAX_TREE_DEPTH:
            raise ValueError(f"{loc}: deeper than {MAX_TREE_DEPTH} levels")
        frontier = nxt


def _probe(model, *, n_features: int, where: str) -> None:
    # All-zero and large rows: a model whose sums overflow is refused up front,
    # not discovered on a live request.
    probe = np.array([np.zeros(n_features), np.full(n_features, 1e6)])
    with np.errstate(over="ignore", invalid="ignore"):
        raw = model.raw(probe)
        out = np.exp(raw) if model.log_link else raw
    if not np.isfinite(out).all():
        raise ValueError(f"{where}: predictions on probe rows are not finite ({out.tolist()})")


def _describe(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors()[:5]:
        loc = ".".join(str(p) for p in err["loc"]) or "(document)"
        parts.append(f"{loc}: {error_message(err)}")
    more = len(exc.errors()) - 5
    return "; ".join(parts) + (f" (+{more} more)" if more > 0 else "")


def document_predictions(document: dict, target: Target, x: np.ndarray, estimate=None) -> tuple[np.ndarray, np.ndarray]:
    """(mean, p90) of a published document, ms, exactly as the router computes them
    (a document without a p90 model answers p90 with its mean, as the router does; a
    relative one is multiplied by `estimate`, which must be the one it names)."""
    model = parse_model_document(document)
    return (model.predict_ms(target, x, quantile="mean", estimate=estimate),
            model.predict_ms(target, x, quantile="p90", estimate=estimate))
