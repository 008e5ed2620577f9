"""The fast path on the simulated clock: the watcher's trigger and the observation its run collects.

Between planner intervals the replay polls the workers' queue and KV-cache use
every `poll_s`, as the watcher polls Prometheus; when the saturation signal
fires (planner.saturation.fast_path) and the trigger has not fired within `cooldown_s`
(the watcher's own limit and the deployment trigger's `within`), a fast-path
run decides `dispatch_s` later (Prefect creating the run, a worker starting
it). That run collects what Prometheus would return at that moment: windows of
one adjustment interval ending then, not on the scheduled runs' grid.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from planner.types import LoadHistory, Observation, PodMetrics


@dataclass(frozen=True)
class FastPathEvent:
    """One firing of the trigger and what came of it; times on the simulated clock, s.

    onset_s: the poll at which the signal turned true (the start of the
        saturated stretch the event fired in).
    fired_s: the poll at which the trigger fired (after onset_s while it cooled down).
    decided_s: the fast-path run's decision.
    ready_s: when the last replica it added served; None when it added none or
        one was cancelled before serving.
    code: the decision's first reason code (fast_path_scale_up, fast_path_cooldown, ...).
    """

    onset_s: float
    fired_s: float
    decided_s: float
    code: str
    from_replicas: tuple[int, int]
    to_replicas: tuple[int, int]
    applied: bool
    ready_s: float | None
    signal: str

    def as_dict(self) -> dict:
        return {
            "onset_s": self.onset_s, "fired_s": self.fired_s, "decided_s": self.decided_s, "code": self.code,
            "from_replicas": list(self.from_replicas), "to_replicas": list(self.to_replicas),
            "applied": self.applied, "ready_s": self.ready_s, "signal": self.signal,
        }


class Trigger:
    """The watcher and the deployment trigger: when the signal fires, a run `dispatch_s` later.

    poll_s, cooldown_s, dispatch_s: seconds. Fires at most once per cooldown_s;
    onset is the first poll of the current saturated stretch.
    """

    def __init__(self, *, poll_s: float, cooldown_s: float, dispatch_s: float):
        if not poll_s > 0 or cooldown_s < 0 or dispatch_s < 0:
            raise ValueError(f"fast path: need poll_s > 0, cooldown_s >= 0, dispatch_s >= 0, got "
                             f"{poll_s}, {cooldown_s}, {dispatch_s}")
        self.poll_s = poll_s
        self.cooldown_s = cooldown_s
        self.dispatch_s = dispatch_s
        self.next_poll_s = poll_s
        self.onset_s: float | None = None
        self.last_fired_s: float | None = None
        # (run at, onset, fired, signal message) of the run dispatched and not yet decided
        self.pending: tuple[float, float, float, str] | None = None

    def next_time_s(self) -> float:
        return min(self.next_poll_s, math.inf if self.pending is None else self.pending[0])

    def poll(self, t_s: float, *, fire: bool, message: str) -> None:
        """The signal's value at poll t_s; dispatches a run when it fires outside the cooldown."""
        self.next_poll_s = t_s + self.poll_s
        if not fire:
            self.onset_s = None
            return
        if self.onset_s is None:
            self.onset_s = t_s
        cooled = self.last_fired_s is None or t_s - self.last_fired_s >= self.cooldown_s
        if cooled and self.pending is None:
            self.last_fired_s = t_s
            self.pending = (t_s + self.dispatch_s, self.onset_s, t_s, message)

    def take_due(self, t_s: float) -> tuple[float, float, str] | None:
        """(onset, fired, message) of the run due at t_s, if any (and forget it)."""
        if self.pending is None or self.pending[0] > t_s:
            return None
        _, onset, fired, message = self.pending
        self.pending = None
        return onset, fired, message


class ArrivalWindows:
    """Frontend series of a trace over windows ending anywhere, as Prometheus range queries read them."""

    def __init__(self, arrival_s: np.ndarray, isl_tokens: np.ndarray, osl_tokens: np.ndarray):
        self.arrival_s = np.asarray(arrival_s, dtype=float)
        self._isl = np.concatenate(([0.0], np.cumsum(np.asarray(isl_tokens, dtype=float))))
        self._osl = np.concatenate(([0.0], np.cumsum(np.asarray(osl_tokens, dtype=float))))

    def observation(
        self,
        *,
        now_s: float,
        interval_s: float,
        history_intervals: int,
        peak_window_s: float | None,
        peak_step_s: float,
        pods: tuple[PodMetrics, ...],
        avg_ttft_ms: float | None,
        avg_itl_ms: float | None,
    ) -> Observation:
        """The observation a run collecting at now_s reads: windows (now - k * interval - interval, now - k * interval].

        Lengths are the means of the requests that arrived in each window (the
        scheduled runs' grid counts output lengths at completion; close enough
        for one run). avg_ttft_ms / avg_itl_ms: carried from the last scheduled
        interval. peak: max over each window, every peak_step_s, of the rate over
        the last peak_window_s (None: not measured).
        """
        n = max(1, min(history_intervals, int(now_s // interval_s)))
        ends = now_s - interval_s * np.arange(n - 1, -1, -1, dtype=float)
        hi = np.searchsorted(self.arrival_s, ends, side="right")
        lo = np.searchsorted(self.arrival_s, ends - interval_s, side="right")
        counts = (hi - lo).astype(float)
        with np.errstate(invalid="ignore", divide="ignore"):
            isl = np.where(counts > 0, (self._isl[hi] - self._isl[lo]) / counts, np.nan)
            osl = np.where(counts > 0, (self._osl[hi] - self._osl[lo]) / counts, np.nan)
        peaks = None
        if peak_window_s is not None:
            steps = max(1, round(interval_s / peak_step_s))
            sub = ends[:, None] - interval_s + peak_step_s * np.arange(1, steps + 1)[None, :]
            in_window = (np.searchsorted(self.arrival_s, sub, side="right")
                         - np.searchsorted(self.arrival_s, sub - peak_window_s, side="right"))
            peaks = in_window.max(axis=1) / peak_window_s
        history = LoadHistory(
            t_s=tuple(float(x) for x in ends),
            num_requests=tuple(float(x) for x in counts),
            avg_isl_tokens=tuple(float(x) for x in isl),
            avg_osl_tokens=tuple(float(x) for x in osl),
            interval_s=interval_s,
            peak_rps=None if peaks is None else tuple(float(x) for x in peaks),
            peak_window_s=peak_window_s,
        )
        last_isl, last_osl = float(isl[-1]), float(osl[-1])
        return Observation(
            taken_at_s=now_s,
            interval_s=interval_s,
            num_requests=float(counts[-1]),
            avg_isl_tokens=None if math.isnan(last_isl) else last_isl,
            avg_osl_tokens=None if math.isnan(last_osl) else last_osl,
            avg_ttft_ms=avg_ttft_ms,
            avg_itl_ms=avg_itl_ms,
            history=history,
            pods=pods,
            peak_rps=None if peaks is None else float(peaks[-1]),
            peak_window_s=peak_window_s,
        )


__all__ = ["ArrivalWindows", "FastPathEvent", "Trigger"]
