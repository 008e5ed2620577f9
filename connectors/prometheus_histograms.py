"""The collector's histogram signals: the length spread over a trailing window, TTFT and ITL histograms per interval.

Mixed into connectors.prometheus.PrometheusCollector (it supplies `cfg`,
`_instant` and `_instant_one`). Both signals are optional: an empty query, or
one that returns no series, leaves the observation without them and says why;
a query Prometheus rejects still fails, and so does one whose series were not
aggregated over frontends (the error names the query).
"""

from __future__ import annotations

from planner.signals.histograms import cumulative_buckets
from planner.signals.length_shape import histogram_from_buckets
from planner.types import LatencyHistogram, LatencyWindow, LengthHistogram


class HistogramReads:
    """Histogram reads of the collect step (see the module docstring)."""

    def _buckets(self, name: str, *, now_s: float, interval_s: float) -> dict:
        """queries.<name> at now_s as `le` text -> value; raises ValueError when an `le` has several series."""
        series = self._instant(name, now_s=now_s, interval_s=interval_s)
        buckets = {s.labels.get("le"): s.value for s in series}
        if len(buckets) < len(series):
            raise ValueError(
                f"metrics.queries.{name}: {len(series)} series for {len(buckets)} `le` bounds "
                f"(labels {[s.labels for s in series[:3]]}...); aggregate it, e.g. sum by (le) (...)"
            )
        return buckets

    def _length_histogram(self, kind: str, *, now_s: float, interval_s: float,
                          notes: list[str]) -> LengthHistogram | None:
        """queries.<kind>_buckets over the length window as a LengthHistogram; None, with a note, when unread.

        Optional signal, as the peak rate: no series leaves the configured length CVs.
        """
        name = f"{kind}_buckets"
        if not getattr(self.cfg.queries, name).strip():
            notes.append(f"{name}: query empty; configured length CVs used")
            return None
        buckets = self._buckets(name, now_s=now_s, interval_s=interval_s)
        total = None
        if getattr(self.cfg.queries, f"{kind}_window_sum").strip():
            sums = self._instant_one(f"{kind}_window_sum", now_s=now_s, interval_s=interval_s)
            total = sums[0].value if sums else None
        try:
            return histogram_from_buckets(buckets, sum_tokens=total, window_s=self.cfg.length_window_s)
        except ValueError as exc:
            notes.append(f"{name}: {exc} at t={now_s:.0f}; configured length CVs used")
            return None

    def _latency_histogram(self, name: str, *, now_s: float,
                           interval_s: float) -> tuple[LatencyHistogram | None, str | None]:
        """queries.<name> (ttft_buckets, itl_buckets) over the interval: (histogram, None), or (None, why not read)."""
        if not getattr(self.cfg.queries, name).strip():
            return None, f"{name}: query empty"
        buckets = self._buckets(name, now_s=now_s, interval_s=interval_s)
        try:
            return LatencyHistogram(*cumulative_buckets(buckets)), None
        except ValueError as exc:
            return None, f"{name}: {exc} at t={now_s:.0f}"

    def _latency_window(self, *, now_s: float, interval_s: float) -> LatencyWindow | None:
        """queries.ttft_window_buckets / itl_window_buckets over metrics.slo_window_s; None when both are empty."""
        names = ("ttft_window_buckets", "itl_window_buckets")
        if not any(getattr(self.cfg.queries, n).strip() for n in names):
            return None
        (ttft, n1), (itl, n2) = (self._latency_histogram(n, now_s=now_s, interval_s=interval_s) for n in names)
        return LatencyWindow(self.cfg.slo_window_s, ttft, itl, tuple(n for n in (n1, n2) if n))
