"""The collect step's source: Dynamo frontend and vLLM worker metrics from Prometheus.

One `collect` call evaluates the configured PromQL (see connectors.config) at
`now_s` and returns an `Observation`:

- interval averages (TTFT, ITL, ISL, OSL) as increase(_sum) / increase(_count)
  over the last interval, and the request count as the increase of the
  frontend's requests_started_total (arrivals, as Dynamo 1.6.1's planner counts
  them), or, with a note in the run, of requests_total (completions) from a
  frontend that lacks it; seconds become milliseconds here, once
- the load history the predictors need, from range queries with step =
  interval, so a run needs nothing from the previous one
- per-pod KV-cache usage and queue length for the saturation guardrail,
  attributed to prefill/decode by pod name or label
- optionally, the interval's peak arrival rate over a short window (and its
  history), for sub-interval bursts; without it the planner assumes flat
  arrivals within an interval and the observation says so in `notes`
- optionally, the frontend's prompt and output length histograms over a
  trailing window (metrics.length_window_s), from which sizing measures how
  spread lengths are (planner.signals.length_shape); without them, the configured CVs;
  and its TTFT histogram over the interval, from which the run reports the
  share of requests that met the TTFT target (planner.signals.slo_attainment)
- coverage: how many frontend scrape targets are up of how many Prometheus
  knows (or knew within a lookback), and how many pods of each pool report
  worker series of how many the fleet has ready; frontend metrics are sums
  over frontends, so a missing one makes the load look smaller

Each value says what it is: None where Prometheus had no data (or 0/0 for an
interval without requests), and `stale_reasons` explaining series that are
missing or too old. Prometheus unreachable raises `PrometheusUnavailableError`
(a ConnectionError naming the URL) for the task's retries; a query Prometheus
rejects raises ValueError naming the config field.
"""

from __future__ import annotations

import logging
import math
import re
import string
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import requests
from prometheus_api_client import PrometheusApiClientException, PrometheusConnect
from urllib3.util.retry import Retry

from connectors.base import unreachable_cause
from connectors.config import MetricsConfig
from planner.signals.histograms import cumulative_buckets
from planner.signals.length_shape import histogram_from_buckets
from planner.types import (
    POOLS, LatencyHistogram, LatencyWindow, LengthHistogram, LoadHistory, Observation, PodMetrics, Pool, ScrapeCoverage,
)

log = logging.getLogger(__name__)

# Prometheus refuses range queries of more than 11,000 points per series.
MAX_POINTS_PER_RANGE_QUERY = 10_000
_FRONTEND_SCALARS = ("num_requests", "avg_ttft_s", "avg_itl_s", "avg_isl_tokens", "avg_osl_tokens")
_HISTORY_QUERIES = ("num_requests", "avg_isl_tokens", "avg_osl_tokens")


class PrometheusUnavailableError(ConnectionError):
    """Prometheus could not be reached or answered 5xx; retrying may help."""


def promql_duration(seconds: float) -> str:
    """A PromQL duration for seconds: 60 -> '60s', 1.5 -> '1500ms' (rounded to ms)."""
    ms = round(seconds * 1000)
    if ms <= 0:
        raise ValueError(f"interval must be at least 1 ms, got {seconds} s")
    return f"{ms // 1000}s" if ms % 1000 == 0 else f"{ms}ms"


@dataclass(frozen=True)
class _Sample:
    labels: dict
    t_s: float
    value: float | None  # None for NaN / inf


class PrometheusCollector:
    """Reads one interval's observation and the load history from Prometheus."""

    def __init__(self, cfg: MetricsConfig):
        self.cfg = cfg
        headers = None
        if cfg.bearer_token_file:
            try:
                token = Path(cfg.bearer_token_file).read_text().strip()
            except OSError as exc:
                raise ValueError(f"metrics.bearer_token_file: cannot read {cfg.bearer_token_file}: {exc}") from None
            headers = {"Authorization": f"Bearer {token}"}
        # No retries inside the HTTP client: the Prefect task retries with backoff,
        # and stacked retries would multiply the wait before a visible failure.
        self._prom = PrometheusConnect(
            url=cfg.prometheus_url,
            headers=headers,
            disable_ssl=not cfg.verify_tls,
            retry=Retry(total=0, raise_on_status=False),
            timeout=cfg.request_timeout_s,
        )
        self._prefill_re = re.compile(cfg.pools.prefill_pod_regex)
        self._decode_re = re.compile(cfg.pools.decode_pod_regex)

    def close(self) -> None:
        self._prom.close()

    def __enter__(self) -> "PrometheusCollector":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def collect(
        self, *, now_s: float, interval_s: float, history_intervals: int,
        expected_workers: Mapping[Pool, int] | None = None,
    ) -> Observation:
        """Observation for the interval ending at now_s.

        now_s: evaluation time, Unix seconds.
        interval_s: adjustment interval, seconds (the averaging window and history step).
        history_intervals: how many intervals of history to read back (>= 1).
        expected_workers: per pool, the replicas that should report worker
            series (the fleet's ready replicas); None: worker coverage not checked.
        """
        if not interval_s > 0:
            raise ValueError(f"collect: interval_s must be > 0, got {interval_s}")
        if history_intervals < 1:
            raise ValueError(f"collect: history_intervals must be >= 1, got {history_intervals}")
        stale: list[str] = []
        notes: list[str] = [self.cfg.source_note()]
        values: dict[str, float | None] = {}
        arrivals = self._arrivals_query(now_s=now_s, interval_s=interval_s, notes=notes)
        for name in _FRONTEND_SCALARS:
            query = arrivals if name == "num_requests" else name
            values[name] = self._scalar(query, now_s=now_s, interval_s=interval_s, stale=stale)
        self._check_age(now_s=now_s, interval_s=interval_s, stale=stale)
        pods = self._pods(now_s=now_s, interval_s=interval_s, stale=stale)
        peak_rps = self._peak(now_s=now_s, interval_s=interval_s, notes=notes)
        length_notes: list[str] = []
        isl_histogram = self._length_histogram("isl", now_s=now_s, interval_s=interval_s, notes=length_notes)
        osl_histogram = self._length_histogram("osl", now_s=now_s, interval_s=interval_s, notes=length_notes) \
            if isl_histogram is not None else None
        ttft_histogram, ttft_note = self._latency_histogram("ttft_buckets", now_s=now_s, interval_s=interval_s)
        itl_histogram, itl_note = self._latency_histogram("itl_buckets", now_s=now_s, interval_s=interval_s)
        slo_window = self._latency_window(now_s=now_s, interval_s=interval_s)
        history = self._history(now_s=now_s, interval_s=interval_s, n=history_intervals, arrivals=arrivals)
        coverage = (self._frontend_coverage(now_s=now_s, interval_s=interval_s),
                    *self._worker_coverage(pods, expected_workers))
        return Observation(
            coverage=coverage,
            peak_rps=peak_rps,
            peak_window_s=self.cfg.peak_window_s if self.cfg.queries.peak_rps.strip() else None,
            notes=tuple(notes),
            taken_at_s=float(now_s),
            interval_s=float(interval_s),
            num_requests=values["num_requests"],
            avg_isl_tokens=values["avg_isl_tokens"],
            avg_osl_tokens=values["avg_osl_tokens"],
            avg_ttft_ms=_ms(values["avg_ttft_s"]),
            avg_itl_ms=_ms(values["avg_itl_s"]),
            history=history,
            pods=pods,
            stale_reasons=tuple(stale),
            isl_histogram=isl_histogram,
            osl_histogram=osl_histogram,
            length_notes=tuple(length_notes),
            ttft_histogram=ttft_histogram,
            ttft_note=ttft_note,
            itl_histogram=itl_histogram,
            itl_note=itl_note,
            slo_window=slo_window,
        )

    def saturation_inputs(
        self, *, now_s: float, interval_s: float
    ) -> tuple[tuple[PodMetrics, ...], float | None, tuple[str, ...]]:
        """What the fast path's watcher reads at now_s: (per-pod KV/queue, requests shed, problems).

        now_s: evaluation time, Unix seconds; interval_s: the adjustment interval,
        seconds (for queries that use ${interval}). Requests shed: the sum of
        queries.shed_requests; None when the query is empty or returns no series.
        """
        stale: list[str] = []
        pods = self._pods(now_s=now_s, interval_s=interval_s, stale=stale)
        shed = None
        if self.cfg.queries.shed_requests.strip():
            values = [s.value for s in self._instant("shed_requests", now_s=now_s, interval_s=interval_s)
                      if s.value is not None]
            shed = sum(values) if values else None
        return pods, shed, tuple(stale)

    def ready_history(self, *, now_s: float, window_s: float, step_s: float = 5.0,
                      interval_s: float = 60.0) -> tuple[tuple[float, int, int], ...]:
        """(t_s, prefill, decode) workers whose scrape answers (queries.ready_workers), every step_s over the last
        window_s up to now_s (Unix seconds), only where the counts change: the ready counts a pool's startup time
        is measured from (planner.signals.startup_time). An aggregated engine counts in both pools. An empty
        query: ()."""
        if not self.cfg.queries.ready_workers.strip():
            return ()
        step_s = max(step_s, window_s / MAX_POINTS_PER_RANGE_QUERY)  # one range query: Prometheus caps its points
        n = max(1, int(window_s // step_s))
        start_s = now_s - (n - 1) * step_s
        query = self.render("ready_workers", interval_s=interval_s)
        result = self._run("ready_workers", query, lambda: self._prom.custom_query_range(
            query, start_time=datetime.fromtimestamp(start_s, tz=timezone.utc),
            end_time=datetime.fromtimestamp(now_s, tz=timezone.utc), step=repr(float(step_s)),
            params={"start": repr(start_s), "end": repr(now_s)}))
        counts: dict[int, list[int]] = {}  # by step index: Prometheus returns its grid in whole milliseconds
        for series in result:
            labels = series.get("metric", {})
            pod = labels.get(self.cfg.pools.pod_label)
            in_pools = POOLS if self._aggregated(labels) else (self._pool_of(pod or "", labels),)
            if not pod or in_pools == (None,):
                continue
            for t, _ in series.get("values", ()):
                row = counts.setdefault(round((float(t) - start_s) / step_s), [0, 0])
                for pool in in_pools:
                    row[POOLS.index(pool)] += 1
        out: list[tuple[float, int, int]] = []
        for k in range(n):
            p, d = counts.get(k, (0, 0))
            if not out or (out[-1][1], out[-1][2]) != (p, d):
                out.append((start_s + k * step_s, p, d))
        return tuple(out)

    def wake_requests(self, *, now_s: float, interval_s: float) -> float | None:
        """Requests waiting for a pool at zero at now_s (queries.wake_requests, summed); None: the query is empty
        or returns no series. now_s: Unix seconds; interval_s: for ${interval}."""
        if not self.cfg.queries.wake_requests.strip():
            return None
        values = [s.value for s in self._instant("wake_requests", now_s=now_s, interval_s=interval_s)
                  if s.value is not None]
        return sum(values) if values else None

    # -- queries -------------------------------------------------------------

    def render(self, name: str, *, interval_s: float) -> str:
        """The PromQL text of queries.<name> with the placeholders filled in."""
        template = string.Template(getattr(self.cfg.queries, name))
        return template.substitute(
            frontend_selector=self.cfg.frontend_selector,
            worker_selector=self.cfg.worker_selector,
            interval=promql_duration(interval_s),
            pod_group_by=", ".join(self.cfg.pools.group_by_labels()),
            peak_window=promql_duration(self.cfg.peak_window_s),
            peak_step=promql_duration(self.cfg.peak_step_s),
            frontend_targets_selector=self.cfg.frontend_targets_selector,
            targets_lookback=promql_duration(self.cfg.frontend_targets_lookback_s),
            length_window=promql_duration(self.cfg.length_window_s),
            slo_window=promql_duration(self.cfg.slo_window_s),
        )

    def _run(self, name: str, query: str, call):
        """call() with Prometheus' failures named: name is the query's config field below metrics.queries,
        or a whole field path when it holds a dot (advisory.prefill_query)."""
        where = f"Prometheus at {self.cfg.prometheus_url}"
        field, running = (name, name) if "." in name else (f"metrics.queries.{name}", f"queries.{name}")
        try:
            return call()
        except (requests.exceptions.ConnectionError, requests.exceptions.Timeout) as exc:
            raise PrometheusUnavailableError(
                f"{where} unreachable while running {running}: {unreachable_cause(exc)}"
            ) from exc
        except PrometheusApiClientException as exc:
            match = re.search(r"HTTP Status Code (\d+)", str(exc))
            code = int(match.group(1)) if match else 0
            detail = _error_detail(str(exc))
            if code >= 500 or code in (0, 429):
                raise PrometheusUnavailableError(f"{where} failed {running} (HTTP {code}): {detail}") from exc
            raise ValueError(f"{field}: {where} rejected the query (HTTP {code}): {detail}; query: {query}") from None

    def _instant(self, name: str, *, now_s: float, interval_s: float) -> list[_Sample]:
        query = self.render(name, interval_s=interval_s)
        result = self._run(name, query, lambda: self._prom.custom_query(query, params={"time": repr(float(now_s))}))
        return [_Sample(item.get("metric", {}), float(item["value"][0]), _number(item["value"][1])) for item in result]

    def _arrivals_query(self, *, now_s: float, interval_s: float, notes: list[str]) -> str:
        """queries.num_requests, or num_requests_fallback (noted) when the former has no series."""
        if self._instant("num_requests", now_s=now_s, interval_s=interval_s) \
                or not self.cfg.queries.num_requests_fallback.strip():
            return "num_requests"
        if not self._instant("num_requests_fallback", now_s=now_s, interval_s=interval_s):
            return "num_requests"  # neither has data: reported stale under the primary's name
        notes.append(
            f"num_requests: queries.num_requests returned no series (metrics source {self.cfg.source}: is its "
            "arrival counter scraped?); arrivals counted from queries.num_requests_fallback (requests finished, "
            "errors included), which lags arrivals while requests queue"
        )
        return "num_requests_fallback"

    def _instant_one(self, name: str, *, now_s: float, interval_s: float) -> list[_Sample]:
        """queries.<name> at now_s; raises ValueError naming the query when it returns several series."""
        samples = self._instant(name, now_s=now_s, interval_s=interval_s)
        if len(samples) > 1:
            raise ValueError(
                f"metrics.queries.{name}: expected at most one series, got {len(samples)} "
                f"(labels {[s.labels for s in samples[:3]]}...); aggregate it, e.g. sum(...)"
            )
        return samples

    def _scalar(self, name: str, *, now_s: float, interval_s: float, stale: list[str]) -> float | None:
        samples = self._instant_one(name, now_s=now_s, interval_s=interval_s)
        if not samples:
            stale.append(
                f"prometheus: queries.{name} returned no series at t={now_s:.0f} "
                f"(frontend_selector {self.cfg.frontend_selector!r})"
            )
            return None
        return samples[0].value

    def _peak(self, *, now_s: float, interval_s: float, notes: list[str]) -> float | None:
        """The interval's peak arrival rate, requests/s; None, with a note, when not available.

        Optional signal: an empty query or no series (an older frontend, a scrape
        interval too long for the window) leaves the planner's flat-arrival model,
        never a stale observation. A query Prometheus rejects still fails.
        """
        if not self.cfg.queries.peak_rps.strip():
            notes.append("peak_rps: queries.peak_rps is empty; sub-interval bursts not measured")
            return None
        samples = self._instant_one("peak_rps", now_s=now_s, interval_s=interval_s)
        if not samples or samples[0].value is None:
            notes.append(
                f"peak_rps: queries.peak_rps returned no value at t={now_s:.0f} (is metrics.peak_window_s "
                f"{self.cfg.peak_window_s:g} s at least twice the scrape interval?); arrivals treated as flat"
            )
            return None
        return samples[0].value

    def _frontend_coverage(self, *, now_s: float, interval_s: float) -> ScrapeCoverage:
        """Frontend scrape targets up now, of the most Prometheus knew at once within the lookback.

        `up` exists on a raw scrape and a relabelled one alike (a target that
        fails its scrape reads 0); a target service discovery dropped has no
        `up` at all, hence the lookback. No matching target: expected 0 (not
        checked), and `detail` says why.
        """
        what = "frontend targets"
        if not self.cfg.frontend_targets_selector or not self.cfg.queries.frontend_targets.strip():
            return ScrapeCoverage(what, 0, 0, "not checked: metrics.frontend_targets_selector or "
                                              "queries.frontend_targets is empty")
        targets = self._instant("frontend_targets", now_s=now_s, interval_s=interval_s)
        seen = 0
        if self.cfg.queries.frontend_targets_seen.strip():
            samples = self._instant("frontend_targets_seen", now_s=now_s, interval_s=interval_s)
            seen = int(max((s.value for s in samples if s.value is not None), default=0))
        expected = max(len(targets), seen)
        if expected == 0:
            return ScrapeCoverage(what, 0, 0, f"not checked: no up series match "
                                              f"metrics.frontend_targets_selector {self.cfg.frontend_targets_selector!r}")
        down = sorted(_target_name(s.labels) for s in targets if s.value != 1)
        parts = [f"down: {', '.join(down)}"] if down else []
        if seen > len(targets):
            parts.append(f"{seen - len(targets)} no longer discovered (seen within "
                         f"{self.cfg.frontend_targets_lookback_s:g} s)")
        return ScrapeCoverage(what, expected, len(targets) - len(down), "; ".join(parts))

    def _worker_coverage(
        self, pods: tuple[PodMetrics, ...], expected: Mapping[Pool, int] | None
    ) -> tuple[ScrapeCoverage, ...]:
        """Per pool with ready replicas: pods reporting worker series of the replicas the fleet has ready.

        A pool none of whose pods reports them is "not checked": its engines export no such series (a
        pool whose every worker scrape failed also lands here; the stale and saturation checks still apply).
        """
        if expected is None or not self.cfg.expect_worker_metrics:
            return ()
        out = []
        for pool in POOLS:
            n = int(expected.get(pool, 0))
            if n <= 0:
                continue
            present = sum(p.pool == pool for p in pods)
            if present == 0:
                # No pod of the pool exports these series (engines without vllm metrics, e.g. Dynamo's
                # mocker prefill workers, SGLang): nothing to compare with, as for a frontend selector
                # that matches nothing.
                out.append(ScrapeCoverage(f"{pool} workers", 0, 0, f"not checked: no {pool} pod reports the worker "
                                                                   "queries' series (kv_usage_frac, queue_length)"))
                continue
            out.append(ScrapeCoverage(f"{pool} workers", n, present,
                                      f"{present} pods report worker series, the fleet has {n} ready"))
        return tuple(out)

    def _check_age(self, *, now_s: float, interval_s: float, stale: list[str]) -> None:
        samples = self._instant("newest_sample_s", now_s=now_s, interval_s=interval_s)
        newest_s = max((s.value for s in samples if s.value is not None), default=None)
        if newest_s is None:
            stale.append(
                f"prometheus: no frontend samples within the lookback before t={now_s:.0f} "
                f"(queries.newest_sample_s empty)"
            )
        elif now_s - newest_s > self.cfg.stale_after_s:
            stale.append(
                f"prometheus: newest frontend sample is {now_s - newest_s:.0f} s old "
                f"(stale_after_s {self.cfg.stale_after_s:g})"
            )

    def _pods(self, *, now_s: float, interval_s: float, stale: list[str]) -> tuple[PodMetrics, ...]:
        pools = self.cfg.pools
        seen: dict[str, dict] = {}
        unmatched: set[str] = set()
        for name, field in (("kv_usage_frac", "kv"), ("queue_length", "queue")):
            for sample in self._instant(name, now_s=now_s, interval_s=interval_s):
                pod = sample.labels.get(pools.pod_label)
                if not pod:
                    stale.append(f"prometheus: queries.{name} returned a series without label {pools.pod_label!r}: "
                                 f"{sample.labels}")
                    continue
                value = sample.value
                if field == "kv" and value is not None and not (0.0 <= value <= 1.0):
                    stale.append(f"prometheus: pod {pod} KV-cache usage {value:g} is outside 0..1 "
                                 f"(does queries.kv_usage_frac return percent?)")
                    value = None
                # An aggregated engine is both pools' capacity: it reports in each.
                in_pools = POOLS if self._aggregated(sample.labels) else (self._pool_of(pod, sample.labels),)
                if in_pools == (None,):
                    unmatched.add(pod)
                    continue
                for pool in in_pools:
                    entry = seen.setdefault((pod, pool), {"kv": None, "queue": None, "variant": "default"})
                    if pools.variant_label and sample.labels.get(pools.variant_label):
                        entry["variant"] = sample.labels[pools.variant_label]
                    entry[field] = value
        if unmatched:
            log.warning("worker pods matching neither pool were ignored (metrics.pools, by=%s): %s",
                        pools.by, sorted(unmatched))
        return tuple(
            PodMetrics(pod=pod, pool=pool, kv_usage_frac=e["kv"], queue_length=e["queue"], variant=e["variant"])
            for (pod, pool), e in sorted(seen.items())
        )

    def _aggregated(self, labels: dict) -> bool:
        pools = self.cfg.pools
        return pools.by == "label" and labels.get(pools.pool_label) in pools.aggregated_label_values

    def _pool_of(self, pod: str, labels: dict) -> Pool | None:
        pools = self.cfg.pools
        if pools.by == "label":
            value = labels.get(pools.pool_label)
            if value in pools.prefill_label_values:
                return "prefill"
            if value in pools.decode_label_values:
                return "decode"
            return None
        # Prefill first: a pod named like "...-prefill-decode-..." is rare, but
        # checking one order keeps the mapping deterministic.
        if self._prefill_re.search(pod):
            return "prefill"
        if self._decode_re.search(pod):
            return "decode"
        return None

    def _range(self, name: str, *, end_s: float, interval_s: float, n: int) -> dict[float, float | None]:
        return self.range_points(name, self.render(name, interval_s=interval_s), end_s=end_s, interval_s=interval_s,
                                 n=n)

    def range_points(self, name: str, query: str, *, end_s: float, interval_s: float,
                     n: int) -> dict[float, float | None]:
        """{t_s: value} of a one-series PromQL query at n steps of interval_s (seconds) ending at end_s.

        name: the query's config field, for errors (as _run takes it). No series: {}; more than one: ValueError.
        """
        points: dict[float, float | None] = {}
        # Oldest chunk first; each chunk holds at most MAX_POINTS_PER_RANGE_QUERY steps.
        for chunk_end_index in range(0, n, MAX_POINTS_PER_RANGE_QUERY):
            count = min(MAX_POINTS_PER_RANGE_QUERY, n - chunk_end_index)
            chunk_end_s = end_s - (n - chunk_end_index - count) * interval_s
            chunk_start_s = chunk_end_s - (count - 1) * interval_s
            result = self._run(name, query, lambda: self._prom.custom_query_range(
                query,
                start_time=datetime.fromtimestamp(chunk_start_s, tz=timezone.utc),
                end_time=datetime.fromtimestamp(chunk_end_s, tz=timezone.utc),
                step=repr(float(interval_s)),
                # The client rounds start/end to whole seconds; send them exact so
                # the grid ends at now_s for any interval.
                params={"start": repr(chunk_start_s), "end": repr(chunk_end_s)},
            ))
            if len(result) > 1:
                raise ValueError(
                    f"{name if '.' in name else 'metrics.queries.' + name}: expected at most one series in the "
                    f"history range query, "
                    f"got {len(result)}; aggregate it, e.g. sum(...)"
                )
            for item in result:
                for t, v in item.get("values", []):
                    points[float(t)] = _number(v)
        return points

    def _history(self, *, now_s: float, interval_s: float, n: int, arrivals: str = "num_requests") -> LoadHistory:
        end_s = float(now_s)
        series = {name: self._range(arrivals if name == "num_requests" else name, end_s=end_s,
                                    interval_s=interval_s, n=n) for name in _HISTORY_QUERIES}
        # Optional: intervals without a peak rate are NaN, and the planner falls back to flat arrivals.
        with_peak = bool(self.cfg.queries.peak_rps.strip())
        if with_peak:
            series["peak_rps"] = self._range("peak_rps", end_s=end_s, interval_s=interval_s, n=n)
        # Intervals without a request count are unknown (not zero): leave them out,
        # the t_s gaps show where they were.
        times = sorted(t for t, v in series["num_requests"].items() if v is not None)
        nan = float("nan")

        def at(name: str, t: float) -> float:
            v = series[name].get(t)
            return nan if v is None else v

        return LoadHistory(
            t_s=tuple(times),
            num_requests=tuple(series["num_requests"][t] for t in times),
            avg_isl_tokens=tuple(at("avg_isl_tokens", t) for t in times),
            avg_osl_tokens=tuple(at("avg_osl_tokens", t) for t in times),
            interval_s=float(interval_s),
            peak_rps=tuple(at("peak_rps", t) for t in times) if with_peak else None,
            peak_window_s=self.cfg.peak_window_s if with_peak else None,
        )

    # -- histogram signals: the length spread over a trailing window, TTFT and ITL histograms per interval.
    # Both are optional: an empty query, or one that returns no series, leaves the observation without them
    # and says why; a query Prometheus rejects still fails, and so does one whose series were not aggregated
    # over frontends (the error names the query).

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


def _number(text) -> float | None:
    value = float(text)
    return value if math.isfinite(value) else None


def _target_name(labels: dict) -> str:
    """A scrape target as people know it: its pod, else its instance, else all its labels."""
    return labels.get("pod") or labels.get("instance") or str(labels)


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000.0


def _error_detail(message: str) -> str:
    match = re.search(r'"error"\s*:\s*"((?:[^"\\]|\\.)*)"', message)
    return match.group(1) if match else message[:300]
