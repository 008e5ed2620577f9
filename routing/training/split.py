"""The time-ordered split of a target's samples: oldest train, then calibrate, most recent held out."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from routing.features import TARGETS, Target
from routing.training.config import TrainingConfig
from routing.training.data import PreparedSamples, TargetData


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


def splits_for(prepared: PreparedSamples, cfg: TrainingConfig) -> dict[Target, Split]:
    """The time-ordered split of each target's samples."""
    return {
        t: time_split(prepared.by_target[t].n, holdout_frac=cfg.holdout_frac, calibration_frac=cfg.calibration_frac)
        for t in TARGETS
    }
