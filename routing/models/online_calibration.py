"""Online p90 calibration: the served p90 kept at 90% coverage while load drifts between retrains.

A published model's p90 is calibrated once, on the samples just before its
holdout. Load drifts after that, and the fixed shift then covers too much or
too little: on the retrain benchmark's newest samples the azure_conv x8 TPOT
p90 covered 87.3% and the loaded fleet's TTFT p90 97.6%. So the service keeps
re-calibrating the active model's p90 on what it has just seen, per cell of
queue depth (the endpoint's waiting requests) x prompt length: the shift of a
cell is the split-conformal 90% quantile of log(observed / model p90) over the
cell's last `window` outcomes (rolling-window conformal prediction), once it has
`min_samples` of them. Outcomes are the samples the service records, each
scored against the p90 the active model gives its features (without any
shift); they are taken in batches of `batch`, so the prediction is one
vectorised call per batch.

Measured on the retrain benchmark (benchmarks/results/retrain.json, held-out
rows replayed in time order): the p90 as served covers 88-92% in every
stratum of Azure x4, x8 and Mooncake x4, where the fixed shift was off the band
in 11 places, and its pinball loss is no worse than the fixed one's. Adaptive
conformal inference (a shift moved by +-step per outcome) reached the band too
but, in the loaded fleet whose outcomes arrive seconds after the predictions,
kept climbing through each queue build-up and served p90s up to 7x too high
(pinball loss x12).
"""

from __future__ import annotations

import math
import threading
from collections import deque

import numpy as np

from planner.conformal import conformal_offset
from routing.features import FEATURES, QUANTILE, TARGETS, Target

# Cell columns: the same index in the TTFT and TPOT rows.
_WAIT_COL = FEATURES["ttft"].index("waiting_requests")
_ISL_COL = FEATURES["ttft"].index("input_tokens")
assert FEATURES["tpot"].index("waiting_requests") == _WAIT_COL and FEATURES["tpot"].index("input_tokens") == _ISL_COL


class OnlineCalibration:
    """Per-cell log shifts on the active model's p90 from its recent outcomes (see the module docstring).

    batch: how many outcomes the callers score against the model at once (they pass them to `add`).
    queue_edges / prompt_edges: the cell edges on waiting requests and prompt tokens (cell k of a
    value v: the number of edges <= v). Thread-safe: an update replaces a target's shift array, so
    a reader holding the old one keeps a consistent view.
    """

    def __init__(self, *, window: int, min_samples: int, max_shift: float, queue_edges: tuple[float, ...],
                 prompt_edges: tuple[float, ...], batch: int = 1):
        if not 1 <= min_samples <= window:
            raise ValueError(f"online calibration: need 1 <= min_samples <= window, got {min_samples}, {window}")
        if batch < 1:
            raise ValueError(f"online calibration: batch must be >= 1, got {batch}")
        if not max_shift > 0:
            raise ValueError(f"online calibration: max_shift must be > 0, got {max_shift}")
        for name, edges in (("queue_edges", queue_edges), ("prompt_edges", prompt_edges)):
            if list(edges) != sorted(set(edges)) or any(not math.isfinite(e) for e in edges):
                raise ValueError(f"online calibration: {name} must be increasing finite numbers, got {list(edges)}")
        self.window = int(window)
        self.batch = int(batch)  # outcomes its callers score together
        self.min_samples = int(min_samples)
        self.max_shift = float(max_shift)
        self._queue = np.asarray(queue_edges, dtype=float)
        self._prompt = np.asarray(prompt_edges, dtype=float)
        self.n_cells = (len(queue_edges) + 1) * (len(prompt_edges) + 1)
        self._lock = threading.Lock()
        self._start(None)

    def _start(self, version: str | None) -> None:
        self.version = version
        self._shift: dict[Target, np.ndarray] = {t: np.zeros(self.n_cells) for t in TARGETS}
        self._recent = {t: [deque(maxlen=self.window) for _ in range(self.n_cells)] for t in TARGETS}
        self._counts = {t: np.zeros(self.n_cells, dtype=np.int64) for t in TARGETS}

    def cells(self, x: np.ndarray) -> np.ndarray:
        """Cell index of each feature row (FEATURES[target] columns, either target)."""
        q = np.searchsorted(self._queue, x[:, _WAIT_COL], side="right")
        p = np.searchsorted(self._prompt, x[:, _ISL_COL], side="right")
        return q * (self._prompt.size + 1) + p

    def shifts(self, version: str) -> dict[Target, np.ndarray] | None:
        """The current log shift per cell of each target for model `version` (None: none yet for it).

        A version other than the one being calibrated starts again with no outcomes.
        """
        with self._lock:
            if version != self.version:
                self._start(version)
                return None
            return self._shift

    def add(self, target: Target, cells: np.ndarray, log_ratios: np.ndarray, *, version: str) -> int:
        """Count outcomes of model `version`: log(observed / its p90 without shift) in each cell.

        Non-finite ratios are skipped; returns how many counted (0 for another model's outcomes).
        """
        with self._lock:
            if version != self.version:
                return 0
            recent, touched, n = self._recent[target], set(), 0
            for cell, r in zip(np.asarray(cells).tolist(), np.asarray(log_ratios, dtype=float).tolist()):
                if math.isfinite(r):
                    recent[cell].append(r)
                    touched.add(cell)
                    self._counts[target][cell] += 1
                    n += 1
            if touched:
                shift = self._shift[target].copy()
                for cell in touched:
                    if len(recent[cell]) >= self.min_samples:
                        c = conformal_offset(np.fromiter(recent[cell], dtype=float), quantile=QUANTILE)
                        shift[cell] = min(self.max_shift, max(-self.max_shift, c))
                self._shift = {**self._shift, target: shift}
            return n

    def state(self) -> dict:
        """What GET /v1/models reports: the model calibrated, and per target the factor and counts per cell."""
        with self._lock:
            return {
                "version": self.version, "window": self.window, "min_samples": self.min_samples, "batch": self.batch,
                "max_shift": self.max_shift, "queue_edges": self._queue.tolist(),
                "prompt_edges": self._prompt.tolist(),
                "targets": {t: {"factor": np.round(np.exp(self._shift[t]), 4).tolist(),
                                "samples": self._counts[t].tolist()} for t in TARGETS},
            }


def online_calibration(config) -> OnlineCalibration | None:
    """The calibration routing.config.OnlineCalibrationConfig describes (None: disabled)."""
    if not config.enabled:
        return None
    return OnlineCalibration(window=config.window, min_samples=config.min_samples, max_shift=config.max_shift,
                             queue_edges=tuple(config.queue_edges), prompt_edges=tuple(config.prompt_edges),
                             batch=config.batch)


def served_factor(shifts: dict[Target, np.ndarray] | None, calibration: OnlineCalibration, target: Target,
                  x: np.ndarray) -> np.ndarray | float:
    """The factor on a p90 prediction of rows x from a shifts snapshot (1.0: none)."""
    if shifts is None:
        return 1.0
    return np.exp(shifts[target][calibration.cells(x)])
