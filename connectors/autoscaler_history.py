"""Advisory mode's read-back from Prometheus: the replicas the running autoscaler set, and the advisory's own.

An advisory run (planner.mode advisory) writes nothing to the cluster, so what it compares with and
what it remembers come from Prometheus history, read afresh each run (nothing is kept between runs):

- the running autoscaler's replicas per pool over the window (advisory.autoscaler's PromQL,
  connectors.queries.AUTOSCALER_QUERIES: Dynamo's planner gauges, an HPA's or KEDA's desired replicas,
  a Deployment's or LeaderWorkerSet's replicas from kube-state-metrics)
- the advisory's own targets (sla_planner_advisory_replicas) over the window, the chart's line
- its own recommendations (sla_planner_recommended_replicas) over the scale-down windows, which an
  applying run keeps in the connector's ledger and an advisory run cannot write there

Each series is one point per adjustment interval ending at the run; gauges become whole replicas here.
"""

from __future__ import annotations

import string
from dataclasses import dataclass

from connectors.config import AdvisoryConfig, MetricsConfig
from connectors.prometheus import PrometheusCollector
from connectors.queries import ADVISORY_OWN_QUERIES
from planner.advisory import ReplicaRow
from planner.types import POOLS


@dataclass(frozen=True)
class AdvisoryHistory:
    """What an advisory run read back, rows (t_s, prefill, decode) oldest first, None where a pool had no point.

    autoscaler: the running autoscaler's replicas over the window. advisory: the advisory's published
    targets over the window. recommended: its published recommendations over the scale-down windows.
    queries: (what, PromQL) of the autoscaler's series, for the run's table.
    """

    autoscaler: tuple[ReplicaRow, ...]
    advisory: tuple[ReplicaRow, ...]
    recommended: tuple[ReplicaRow, ...]
    queries: tuple[tuple[str, str], ...]


def read_advisory_history(
    metrics: MetricsConfig, advisory: AdvisoryConfig, *, namespace: str, model_id: str, now_s: float,
    interval_s: float, recommendation_window_s: float,
) -> AdvisoryHistory:
    """Read the three histories at one point per interval_s (seconds) ending at now_s (Unix seconds).

    The autoscaler's and the advisory's cover advisory.window_s; the recommendations
    recommendation_window_s (the longest scale-down window, s; 0: none are read).
    """
    n_window = max(1, int(advisory.window_s // interval_s))
    n_recommended = int(recommendation_window_s // interval_s) + 1 if recommendation_window_s > 0 else 0
    autoscaler_queries = {p: advisory.query(p, namespace=namespace) for p in POOLS}

    def own(name: str, pool: str) -> str:
        return string.Template(ADVISORY_OWN_QUERIES[name]).substitute(namespace=namespace, model=model_id, pool=pool)

    with PrometheusCollector(metrics) as prom:
        def rows(queries: dict[str, tuple[str, str]], n: int) -> tuple[ReplicaRow, ...]:
            if n == 0:
                return ()
            series = {p: prom.range_points(field, query, end_s=now_s, interval_s=interval_s, n=n)
                      for p, (field, query) in queries.items()}
            times = sorted(set().union(*(s.keys() for s in series.values())))
            return tuple((t, *(_replicas(series[p].get(t)) for p in POOLS)) for t in times)

        autoscaler = rows({p: (f"advisory.{p}_query", q) for p, q in autoscaler_queries.items()}, n_window)
        ours = rows({p: ("advisory.own sla_planner_advisory_replicas", own("advisory_replicas", p))
                     for p in POOLS}, n_window)
        recommended = rows({p: ("advisory.own sla_planner_recommended_replicas",
                                own("recommended_replicas", p)) for p in POOLS}, n_recommended)
    return AdvisoryHistory(autoscaler=autoscaler, advisory=ours, recommended=recommended,
                           queries=tuple((f"{advisory.name} {p}", q) for p, q in autoscaler_queries.items()))


def _replicas(value: float | None) -> int | None:
    return None if value is None else max(0, int(round(value)))
