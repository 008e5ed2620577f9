"""Online p90 calibration: the served p90 kept at 90% coverage while load drifts between retrains.

A published model's p90 is calibrated once, on the samples just before its
holdout. Load drifts after that, and the fixed shift then covers too much or
too little: on the retrain benchmark's newest samples the azure_conv x8 TPOT
p90 covered 87.3% and the loaded fleet's TTFT p90 97.6%. So the service keeps
adjusting a log shift on the active model's p90, one per cell of queue depth
(the endpoint's waiting requests) x prompt length, with every sample it records
(adaptive conformal inference, Gibbs & Candes 2021):

    shift[cell] += step x (1[observed > p90 served] - (1 - 0.9))

In each cell the share of requests slower than the p90 they were served
tends to 10% whatever the drift. A sample counts only when it was predicted
by the active model with its p90 (its model_version and a prediction); the
shifts start at 0 when another model becomes active and stay within
+-max_shift (log space: a factor e^max_shift either way).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Mapping

import numpy as np

from routing.features import FEATURES, TARGETS, Target

QUANTILE = 0.9
# Cell columns: the same index in the TTFT and TPOT rows.
_WAIT_COL = FEATURES["ttft"].index("waiting_requests")
_ISL_COL = FEATURES["ttft"].index("input_tokens")
assert FEATURES["tpot"].index("waiting_requests") == _WAIT_COL and FEATURES["tpot"].index("input_tokens") == _ISL_COL


class OnlineCalibration:
    """Per-cell log shifts on the active model's p90, updated by observed samples (see the module docstring).

    queue_edges / prompt_edges: the upper-open cell edges on waiting requests and prompt tokens
    (cell k of a value v: the number of edges <= v). Thread-safe: updates replace a target's
    shift array, so a reader holding the old array keeps a consistent view.
    """

    def __init__(self, *, step: float, max_shift: float, queue_edges: tuple[float, ...],
                 prompt_edges: tuple[float, ...]):
        if not step > 0 or not max_shift > 0:
            raise ValueError(f"online calibration: step and max_shift must be > 0, got {step}, {max_shift}")
        for name, edges in (("queue_edges", queue_edges), ("prompt_edges", prompt_edges)):
            if list(edges) != sorted(set(edges)) or any(not math.isfinite(e) for e in edges):
                raise ValueError(f"online calibration: {name} must be increasing finite numbers, got {list(edges)}")
        self.step = float(step)
        self.max_shift = float(max_shift)
        self._queue = np.asarray(queue_edges, dtype=float)
        self._prompt = np.asarray(prompt_edges, dtype=float)
        self.n_cells = (len(queue_edges) + 1) * (len(prompt_edges) + 1)
        self._lock = threading.Lock()
        self.version: str | None = None
        self._shift: dict[Target, np.ndarray] = {}
        self._counts: dict[Target, np.ndarray] = {}
        self._misses: dict[Target, np.ndarray] = {}
        self._start(None)

    def _start(self, version: str | None) -> None:
        self.version = version
        self._shift = {t: np.zeros(self.n_cells) for t in TARGETS}
        self._counts = {t: np.zeros(self.n_cells, dtype=np.int64) for t in TARGETS}
        self._misses = {t: np.zeros(self.n_cells, dtype=np.int64) for t in TARGETS}

    def cells(self, x: np.ndarray) -> np.ndarray:
        """Cell index of each feature row (FEATURES[target] columns, either target)."""
        q = np.searchsorted(self._queue, x[:, _WAIT_COL], side="right")
        p = np.searchsorted(self._prompt, x[:, _ISL_COL], side="right")
        return q * (self._prompt.size + 1) + p

    def cell_of(self, features: Mapping[str, float]) -> int:
        """Cell index of a sample's raw features (routing.features.RAW_FIELDS names)."""
        q = int(np.searchsorted(self._queue, float(features["waiting_requests"]), side="right"))
        p = int(np.searchsorted(self._prompt, float(features["input_tokens"]), side="right"))
        return q * (self._prompt.size + 1) + p

    def shifts(self, version: str) -> dict[Target, np.ndarray] | None:
        """The current log shift per cell of each target for model `version` (None: not yet any for it).

        A version other than the one being calibrated starts the shifts again at 0.
        """
        with self._lock:
            if version != self.version:
                self._start(version)
                return None
            return self._shift

    def observe(self, target: Target, cell: int, *, observed_ms: float, served_ms: float, version: str) -> bool:
        """Count one outcome: the latency observed against the p90 served for it by model `version`.

        Returns whether it moved a shift (False: another model's prediction, or not a finite positive one).
        """
        if not (math.isfinite(served_ms) and served_ms > 0 and math.isfinite(observed_ms)):
            return False
        with self._lock:
            if version != self.version:
                return False
            miss = observed_ms > served_ms
            shift = self._shift[target].copy()
            shift[cell] = min(self.max_shift, max(-self.max_shift,
                                                  shift[cell] + self.step * (float(miss) - (1.0 - QUANTILE))))
            self._shift = {**self._shift, target: shift}
            self._counts[target][cell] += 1
            self._misses[target][cell] += miss
            return True

    def state(self) -> dict:
        """What GET /v1/models reports: the model calibrated, and per target the factor and counts per cell."""
        with self._lock:
            return {
                "version": self.version, "step": self.step, "max_shift": self.max_shift,
                "queue_edges": self._queue.tolist(), "prompt_edges": self._prompt.tolist(),
                "targets": {t: {"factor": np.round(np.exp(self._shift[t]), 4).tolist(),
                                "samples": self._counts[t].tolist(), "misses": self._misses[t].tolist()}
                            for t in TARGETS},
            }


def online_calibration(config) -> OnlineCalibration | None:
    """The calibration routing.config.OnlineCalibrationConfig describes (None: disabled)."""
    if not config.enabled:
        return None
    return OnlineCalibration(step=config.step, max_shift=config.max_shift, queue_edges=tuple(config.queue_edges),
                             prompt_edges=tuple(config.prompt_edges))


def served_factor(shifts: dict[Target, np.ndarray] | None, calibration: OnlineCalibration, target: Target,
                  x: np.ndarray) -> np.ndarray | float:
    """The factor on a p90 prediction of rows x from a shifts snapshot (1.0: none)."""
    if shifts is None:
        return 1.0
    return np.exp(shifts[target][calibration.cells(x)])
