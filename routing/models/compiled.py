"""Compiled regressors: a validated document's trees and linear models as flat arrays, evaluated over many rows at once."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from routing.models.format import TreesRegressor


@dataclass(frozen=True)
class CompiledTrees:
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
class BitvectorTrees:
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
              narrow: bool | None = None) -> "BitvectorTrees | None":
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
class CompiledLinear:
    coef: np.ndarray
    intercept: float
    log_link: bool

    def raw(self, x: np.ndarray) -> np.ndarray:
        return x @ self.coef + self.intercept


def levelwise_trees(checked: list, reg: TreesRegressor) -> CompiledTrees:
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
    return CompiledTrees(
        feature=np.concatenate(feats),
        threshold=np.concatenate(thrs),
        children=np.concatenate(kids),
        value=np.concatenate(vals),
        roots=np.array(roots, dtype=np.int64),
        active_trees=tuple(int((depths > level).sum()) for level in range(int(depths.max()))),
        baseline=float(reg.baseline),
        log_link=reg.link == "log",
    )
