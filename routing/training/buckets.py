"""Load buckets: the queue depth (TTFT) or batch size (TPOT) level a feature row falls in."""

from __future__ import annotations

import numpy as np

from routing.features import FEATURES, Target

# Load buckets for per-bucket metrics: TTFT by the queue a request joins,
# TPOT by the batch it decodes in. Lower edges; the last bucket is open.
BUCKET_EDGES: dict[Target, tuple[str, tuple[float, ...]]] = {
    "ttft": ("waiting_requests", (0, 1, 2, 4, 8)),
    "tpot": ("running_requests", (0, 8, 16, 32, 64)),
}


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
