"""The p90 as the router serves it: held-out rows replayed in time order through its online calibration."""

from __future__ import annotations

import heapq

import numpy as np

from routing.features import Target
from routing.models.online_calibration import OnlineCalibration, online_calibration


def served_p90(target: Target, x: np.ndarray, p90_ms: np.ndarray, y_ms: np.ndarray, *, dispatched_s: np.ndarray,
               recorded_s: np.ndarray, config) -> np.ndarray | None:
    """Each row's p90 as a routing service with online calibration `config`
    (routing.config.OnlineCalibrationConfig) would have served it, the model published just before
    the first row (None: calibration disabled).

    Every row is served at its dispatch (the model's p90 times the cell's factor then) and counted
    at its recorded time, in batches of the calibration's `batch` as the service counts samples:
    outcomes still in flight, or waiting for their batch, at a dispatch do not move its shift. A
    row without a dispatch time (NaN, or after its record) is served at its record time.
    """
    calibration = online_calibration(config)
    if calibration is None:
        return None
    n = y_ms.size
    if not (x.shape[0] == p90_ms.size == n == dispatched_s.size == recorded_s.size):
        raise ValueError(f"served_p90 {target}: row counts differ")
    cells = calibration.cells(x) if n else np.zeros(0, dtype=np.int64)
    start = np.where(np.isfinite(dispatched_s) & (dispatched_s <= recorded_s), dispatched_s, recorded_s)
    # (time, 0 = serve | 1 = count, row): at one instant a row is served before anything is counted.
    events = [(float(start[i]), 0, i) for i in range(n)] + [(float(recorded_s[i]), 1, i) for i in range(n)]
    heapq.heapify(events)
    return _replay(calibration, target, events, cells, np.asarray(p90_ms, dtype=float), np.asarray(y_ms, dtype=float))


def _replay(calibration: OnlineCalibration, target: Target, events: list, cells: np.ndarray, p90_ms: np.ndarray,
            y_ms: np.ndarray) -> np.ndarray:
    served = p90_ms.copy()
    calibration.shifts("holdout")
    with np.errstate(divide="ignore", invalid="ignore"):
        log_ratio = np.log(y_ms / p90_ms)
    pending: list[int] = []
    while events:
        _, kind, i = heapq.heappop(events)
        if kind == 0:
            served[i] = p90_ms[i] * np.exp(calibration.shifts("holdout")[target][cells[i]])
            continue
        pending.append(i)
        if len(pending) >= calibration.batch:
            calibration.add(target, cells[pending], log_ratio[pending], version="holdout")
            pending = []
    return served
