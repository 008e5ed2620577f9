"""Latency models in a safe, JSON-only format: schema, validation, evaluation, export.

The retrain flow publishes fitted models as a JSON document; the router never
unpickles anything. A document carries, for each target (TTFT and TPOT), a mean
model and optionally a p90 model, each either gradient-boosted trees (the node
arrays of scikit-learn's HistGradientBoostingRegressor) or a linear model. The
router validates a document completely before it can serve: schema, feature
names equal to a feature set routing.features knows for the target, array
shapes, child indices that form a tree (no cycles, bounded depth), finite
numbers, size limits, and finite non-negative predictions on probe rows.

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
(routing.predictor.ProfileEstimator) on the same row: the router multiplies the two, so the estimate carries what
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

Feature indices in a document refer to its own feature_names. A document of an
older feature set (fewer features) is compiled against the router's current
rows by mapping each index to the current column of the same name, so it is
served exactly as it was trained; a feature set the router does not know is
refused with the sets it does know.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Literal, Union

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from routing.features import FEATURE_SET_VERSION, FEATURE_SETS, FEATURES, TARGETS, Target, columns_of

FORMAT = "sla-planner/latency-model"
FORMAT_VERSION = 2
MAX_TREE_DEPTH = 64
# Bounds that keep one prediction call cheap and one document small.
DEFAULT_MAX_TREES = 2_000
DEFAULT_MAX_NODES = 500_000
# Exported in place of +-inf split thresholds (JSON has no infinity); for finite
# inputs "x <= 1.7e308" decides exactly like "x <= inf".
_FLOAT_MAX = float(np.finfo(float).max)
VERSION_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class TreeArrays(_Strict):
    """One regression tree as parallel node arrays; node 0 is the root."""

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


class TreesRegressor(_Strict):
    """Gradient-boosted trees (scikit-learn HistGradientBoostingRegressor node arrays)."""

    kind: Literal["hist_gradient_boosting"]
    link: Literal["identity", "log"] = Field("identity", description="log: prediction = exp(raw)")
    baseline: float = Field(description="raw prediction before the trees")
    trees: list[TreeArrays] = Field(min_length=1, description="trees, added to the baseline")


class LinearRegressor(_Strict):
    """Linear model: raw = intercept + sum(coef * x)."""

    kind: Literal["linear"]
    link: Literal["identity", "log"] = Field("identity", description="log: prediction = exp(raw)")
    intercept: float
    coef: list[float] = Field(min_length=1, description="one coefficient per feature, in feature order")


Regressor = Annotated[Union[TreesRegressor, LinearRegressor], Field(discriminator="kind")]


class TargetModels(_Strict):
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


class Targets(_Strict):
    ttft: TtftModels = Field(description="time to first token, ms")
    tpot: TpotModels = Field(description="time per output token, ms")


class ModelDocument(_Strict):
    """A published latency-model bundle (see module docstring)."""

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


@dataclass(frozen=True)
class _CompiledTrees:
    """All trees stacked into flat arrays, deepest tree first, leaves looping to themselves."""

    feature: np.ndarray  # int64, per global node
    threshold: np.ndarray  # float64
    children: np.ndarray  # int64, 2 per node: [left, right]
    value: np.ndarray  # float64
    roots: np.ndarray  # int64, per tree, deepest first
    active_trees: tuple[int, ...]  # per level: trees deeper than that level
    baseline: float
    log_link: bool

    @property
    def depth(self) -> int:
        return len(self.active_trees)

    def raw(self, x: np.ndarray) -> np.ndarray:
        n, n_features = x.shape
        # (tree, row) pairs, tree-major with the deepest trees first: the pairs
        # still descending at each level are a prefix, so shallow trees drop
        # out for free. A leaf points at itself, so no masking is needed.
        node = np.repeat(self.roots, n)
        row_base = np.tile(np.arange(n, dtype=np.int64) * n_features, self.roots.size)
        flat = x.ravel()
        for n_trees in self.active_trees:
            k = n_trees * n
            cur = node[:k]
            xv = flat.take(self.feature.take(cur) + row_base[:k])
            # "not <=" rather than ">": a NaN goes right, as in the bitvector evaluator.
            node[:k] = self.children.take(cur * 2 + ~(xv <= self.threshold.take(cur)))
        return self.value.take(node).reshape(self.roots.size, n).sum(axis=0) + self.baseline


_ALL = np.uint64(0xFFFFFFFFFFFFFFFF)
_CHUNK_ROWS = 128
_DEBRUIJN = np.uint64(0x03F79D71B4CB0A89)
_DEBRUIJN_TABLE = np.zeros(64, dtype=np.int64)
for _bit in range(64):
    _DEBRUIJN_TABLE[((0x03F79D71B4CB0A89 << _bit) & 0xFFFFFFFFFFFFFFFF) >> 58] = _bit
_MAX_LEAVES = 64
_NARROW_LEAVES = 32
_MAX_TABLE_BYTES = 64 * 1024 * 1024
# float64 exponent bias: a power of two 2**p converts to bits (1023 + p) << 52.
_EXP_BIAS = 1023


@dataclass(frozen=True)
class _BitvectorTrees:
    """Trees with <= 64 leaves each, evaluated by threshold bitvectors (QuickScorer).

    Leaves are numbered left to right; a split node whose test fails
    (x > threshold) rules out the leaves of its left subtree. Per feature, the
    AND of those masks over all thresholds below x is tabulated once for every
    distinct threshold (HistGradientBoosting has at most 255 per feature), so
    one row costs one searchsorted and one table row per used feature; the
    exit leaf of each tree is the leftmost leaf still set. Same results as
    walking the trees, without a per-level loop.

    Forests whose trees all have <= 32 leaves (the retrain flow's default of
    31) use 32-bit masks with the leftmost leaf in the highest bit: half the
    memory traffic, and the exit leaf is the exponent of the mask converted
    to float64 (exact for any 32-bit integer). Wider forests use 64-bit masks
    with the leftmost leaf in the lowest bit, found by a de Bruijn multiply.
    A feature that has one value in every row (the request's own size in a
    pick) is looked up once and broadcast.
    """

    features: tuple[int, ...]  # features used by any split
    thresholds: tuple[np.ndarray, ...]  # per used feature: sorted distinct thresholds
    tables: tuple[np.ndarray, ...]  # per used feature: (len(thresholds)+1, n_trees) uint32 or uint64
    leaf_values: np.ndarray  # (n_trees * slots,) float64, tree-major, indexed by bit position
    offsets: np.ndarray  # (n_trees,) int64: tree * slots (- the exponent bias when narrow)
    baseline: float
    log_link: bool
    narrow: bool = False  # 32-bit masks, leftmost leaf in the highest bit

    @classmethod
    def build(cls, checked: list, *, n_features: int, baseline: float, log_link: bool,
              narrow: bool | None = None) -> "_BitvectorTrees | None":
        """None when a tree has more than 64 leaves or the tables would be too large.

        narrow: None picks 32-bit masks when every tree fits; False forces 64-bit (tests compare the two).
        """
        n_trees = len(checked)
        orders = [_leaves_left_to_right(is_leaf, left, right) for _, _, is_leaf, _, left, right in checked]
        widest = max(len(order) for order in orders)
        if widest > _MAX_LEAVES:
            return None
        narrow = widest <= _NARROW_LEAVES if narrow is None else narrow and widest <= _NARROW_LEAVES
        slots = _NARROW_LEAVES if narrow else _MAX_LEAVES
        dtype = np.uint32 if narrow else np.uint64
        full = (1 << slots) - 1
        per_feature: dict[int, list[tuple[float, int, int]]] = {}
        leaf_values = np.zeros((n_trees, slots))
        for t, ((_, tree, is_leaf, feature, left, right), order) in enumerate(zip(checked, orders)):
            # Bit position of the leaf of rank r (0 = leftmost).
            pos = [slots - 1 - r for r in range(len(order))] if narrow else list(range(len(order)))
            leaf_values[t, pos] = np.array(tree.value, dtype=float)[order]
            rank = {node: i for i, node in enumerate(order)}
            for node, (lo, hi) in _left_leaf_spans(is_leaf, left, right, rank).items():
                shift = slots - hi if narrow else lo
                mask = full & ~(((1 << (hi - lo)) - 1) << shift)
                per_feature.setdefault(int(feature[node]), []).append((float(tree.threshold[node]), t, mask))
        features, thresholds, tables = [], [], []
        size = 0
        for f in sorted(per_feature):
            nodes = per_feature[f]
            thr = np.array([n[0] for n in nodes])
            uniq = np.unique(thr)
            size += (uniq.size + 1) * n_trees * np.dtype(dtype).itemsize
            if size > _MAX_TABLE_BYTES:
                return None
            table = np.full((uniq.size + 1, n_trees), full, dtype=dtype)
            rows = np.searchsorted(uniq, thr) + 1
            np.bitwise_and.at(table, (rows, np.array([n[1] for n in nodes])), np.array([n[2] for n in nodes], dtype=dtype))
            np.bitwise_and.accumulate(table, axis=0, out=table)
            features.append(f)
            thresholds.append(uniq)
            tables.append(table)
        offsets = np.arange(n_trees, dtype=np.int64) * slots - (_EXP_BIAS if narrow else 0)
        return cls(
            features=tuple(features), thresholds=tuple(thresholds), tables=tuple(tables),
            leaf_values=leaf_values.ravel(), offsets=offsets, baseline=baseline, log_link=log_link, narrow=narrow,
        )

    def raw(self, x: np.ndarray) -> np.ndarray:
        if x.shape[0] <= _CHUNK_ROWS:
            return self._raw(x)
        # Row blocks keep the (rows x trees) masks in cache.
        return np.concatenate([self._raw(x[i : i + _CHUNK_ROWS]) for i in range(0, x.shape[0], _CHUNK_ROWS)])

    def _raw(self, x: np.ndarray) -> np.ndarray:
        n = x.shape[0]
        n_trees = self.offsets.size
        if n == 0:
            return np.zeros(0)
        mask = None
        shared = None  # AND of the table rows of features with one value in every row
        for f, thr, table in zip(self.features, self.thresholds, self.tables):
            # Thresholds strictly below x: those splits send x right.
            k = np.searchsorted(thr, x[:, f], side="left")
            if n == 1 or (k == k[0]).all():
                row = table[k[0]]
                shared = row if shared is None else shared & row
                continue
            rows = table.take(k, axis=0)
            mask = rows if mask is None else np.bitwise_and(mask, rows, out=mask)
        if mask is None:
            # Every feature had one value (or the trees have no splits): one mask for all rows.
            full = np.uint32(0xFFFFFFFF) if self.narrow else _ALL
            mask = np.broadcast_to(full if shared is None else shared, (n, n_trees))
        elif shared is not None:
            np.bitwise_and(mask, shared, out=mask)
        if self.narrow:
            # Leftmost surviving leaf = highest set bit = the float64 exponent.
            leaf = mask.astype(np.float64).view(np.int64)
            np.right_shift(leaf, 52, out=leaf)
        else:
            lowest = mask & (~mask + np.uint64(1))
            # Index of the lowest set bit: de Bruijn multiply (wraps mod 2**64) and lookup.
            leaf = _DEBRUIJN_TABLE.take((lowest * _DEBRUIJN) >> np.uint64(58))
        leaf += self.offsets
        return self.leaf_values.take(leaf).sum(axis=1) + self.baseline


def _leaves_left_to_right(is_leaf: np.ndarray, left: np.ndarray, right: np.ndarray) -> list[int]:
    out, stack = [], [0]
    while stack:
        node = stack.pop()
        if is_leaf[node]:
            out.append(node)
        else:
            stack.append(int(right[node]))
            stack.append(int(left[node]))
    return out


def _left_leaf_spans(is_leaf, left, right, rank: dict[int, int]) -> dict[int, tuple[int, int]]:
    """For each internal node: the [first, last+1) ranks of the leaves under its left child."""
    span: dict[int, tuple[int, int]] = {}

    def leaves(node: int) -> tuple[int, int]:
        # Iterative post-order would be longer; depth is bounded (MAX_TREE_DEPTH).
        if is_leaf[node]:
            return rank[node], rank[node] + 1
        lo, mid = leaves(int(left[node]))
        _, hi = leaves(int(right[node]))
        span[node] = (lo, mid)
        return lo, hi

    leaves(0)
    return span


@dataclass(frozen=True)
class _CompiledLinear:
    coef: np.ndarray
    intercept: float
    log_link: bool

    def raw(self, x: np.ndarray) -> np.ndarray:
        return x @ self.coef + self.intercept


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

        estimate: has `name` and predict(target, x) -> ms (routing.predictor.ProfileEstimator); needed
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
                compiled = _CompiledLinear(coef, float(reg.intercept), reg.link == "log")
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
    fast = _BitvectorTrees.build(checked, n_features=int(columns.max()) + 1, baseline=float(reg.baseline),
                                 log_link=reg.link == "log")
    return fast if fast is not None else _levelwise(checked, reg)


def _levelwise(checked: list, reg: TreesRegressor) -> _CompiledTrees:
    checked = sorted(checked, key=lambda c: -c[0])
    feats, thrs, kids, vals, roots = [], [], [], [], []
    offset = 0
    for _, tree, is_leaf, feature, left, right in checked:
        n = is_leaf.size
        gidx = np.arange(n, dtype=np.int64) + offset
        feats.append(np.where(is_leaf, 0, feature))
        thrs.append(np.where(is_leaf, 0.0, np.array(tree.threshold, dtype=float)))
        kids.append(np.column_stack([np.where(is_leaf, gidx, left + offset), np.where(is_leaf, gidx, right + offset)]).ravel())
        vals.append(np.where(is_leaf, np.array(tree.value, dtype=float), 0.0))
        roots.append(offset)
        offset += n
    depths = np.array([c[0] for c in checked])
    return _CompiledTrees(
        feature=np.concatenate(feats),
        threshold=np.concatenate(thrs),
        children=np.concatenate(kids),
        value=np.concatenate(vals),
        roots=np.array(roots, dtype=np.int64),
        active_trees=tuple(int((depths > level).sum()) for level in range(int(depths.max()))),
        baseline=float(reg.baseline),
        log_link=reg.link == "log",
    )


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
        parts.append(f"{loc}: {err['msg']}")
    more = len(exc.errors()) - 5
    return "; ".join(parts) + (f" (+{more} more)" if more > 0 else "")


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
