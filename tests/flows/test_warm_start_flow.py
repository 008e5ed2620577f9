"""A planner's first run reads the hour before from Prometheus and decides as one that had been running
(planner.steps.history_warm_start); with nothing before it in Prometheus it says it started cold.

An hour of Dynamo-frontend series is backfilled into a real Prometheus (promtool): 10 rps, a burst of
100 rps three minutes before the end, then 10 rps again. A planner that had been running (the pure core,
run by run over the last 25 minutes, each run collecting from that Prometheus at its own time and keeping
its recommendations as a connector does) still holds the burst's prefill replicas at the end: its
scale-down window holds them. The flow's first run at the end, on a fresh local connector whose fleet is
what the running planner had, reaches the same targets from the collected history alone; a deployment
whose Prometheus holds only the last interval starts cold, says so, and sizes for that interval.
"""

from __future__ import annotations

import pytest

from connectors.config import LocalConnectorConfig, MetricsConfig
from flows.config import PlannerRunConfig, ReplayInputs
from planner.config import PlannerConfig, ProfileConfig
from planner.types import FleetState, PoolState
from tests.support.fixtures_prometheus import (
    ANCHOR_S,
    FrontendInterval,
    OpenMetricsWriter,
    PrometheusServer,
    write_frontend_intervals,
)

INTERVAL_S = 60.0
N_INTERVALS = 60
END_S = ANCHOR_S + N_INTERVALS * INTERVAL_S
QUIET = FrontendInterval(600, 0.05, 0.006, 1000, 150)
BURST = FrontendInterval(6000, 0.05, 0.006, 1000, 150)


@pytest.fixture(scope="module")
def warm_data(tmp_path_factory) -> PrometheusServer:
    """A Prometheus of its own holding only this hour: in the full suite the session's server failed this test
    (it passed alone), so nothing other tests left there can stand in for the history."""
    prometheus_server = PrometheusServer(base_dir=tmp_path_factory.mktemp("warm-start-prometheus"))
    prometheus_server.start()
    w = OpenMetricsWriter()
    hour = [QUIET] * (N_INTERVALS - 3) + [BURST, QUIET, QUIET]
    write_frontend_intervals(w, labels={"namespace": "warm-start"}, start_s=ANCHOR_S, interval_s=INTERVAL_S,
                             intervals=hour)
    # A brand-new deployment: only the last interval, as quiet as the other's.
    write_frontend_intervals(w, labels={"namespace": "warm-start-new"}, start_s=END_S - INTERVAL_S,
                             interval_s=INTERVAL_S, intervals=[QUIET])
    prometheus_server.backfill(w.render())
    yield prometheus_server
    prometheus_server.stop()


def _planner(profile_dir) -> PlannerConfig:
    # Sized on the constant forecast's mean with no burst sizing and no latency correction, a running planner's
    # recommendation for an interval is exactly what the warm start sizes that interval for.
    p = PlannerConfig(namespace="test-ns", profile=ProfileConfig(dir=str(profile_dir)))
    return p.model_copy(update={
        "predictor": p.predictor.model_copy(update={"name": "constant", "size_on": "mean", "history_intervals": 60}),
        "sizing": p.sizing.model_copy(update={"burst_basis": "off", "independent_burst_basis": None}),
        "correction": p.correction.model_copy(update={"enabled": False}),
        "saturation": p.saturation.model_copy(update={"enabled": False}),
    })


def _metrics(server: PrometheusServer, namespace: str) -> MetricsConfig:
    return MetricsConfig(prometheus_url=server.url, frontend_selector=f'namespace="{namespace}"',
                         worker_selector=f'namespace="{namespace}"')


def _running_planner(server: PrometheusServer, cfg: PlannerConfig, profile) -> tuple[tuple[int, int], object]:
    """The pure core run every interval over the last 25 minutes, collecting from Prometheus at each run's time;
    (the fleet before the last run, the last run's decision)."""
    from connectors.prometheus import PrometheusCollector
    from planner.pipeline import plan_interval

    fleet, recent, plan = (1, 1), [], None
    with PrometheusCollector(_metrics(server, "warm-start")) as collector:
        for k in range(25, -1, -1):
            now_s = END_S - k * INTERVAL_S
            obs = collector.collect(now_s=now_s, interval_s=INTERVAL_S, history_intervals=60)
            before = fleet
            state = FleetState(prefill=PoolState(*(fleet[0],) * 2), decode=PoolState(*(fleet[1],) * 2),
                               recent_targets=tuple(recent))
            plan = plan_interval(obs, state, cfg, profile, now_s=now_s, predictor_cache={})
            d = plan.decision
            recent.append((now_s, d.recommended_prefill_replicas, d.recommended_decode_replicas))
            fleet = (d.prefill_replicas, d.decode_replicas)
    return before, plan


def _first_run(server: PrometheusServer, cfg: PlannerConfig, namespace: str, fleet: tuple[int, int], tmp_path):
    from flows.planner_flow import planner_flow

    connector = LocalConnectorConfig(state_path=str(tmp_path / f"{namespace}.json"),
                                     initial_prefill_replicas=fleet[0], initial_decode_replicas=fleet[1])
    run = PlannerRunConfig(planner=cfg, connector=connector, metrics=_metrics(server, namespace))
    state = planner_flow(config=run, replay=ReplayInputs(now_s=END_S), dry_run=True, return_state=True)
    return state.message, state.result()


def test_the_first_run_decides_as_a_running_planner_from_prometheus_history(warm_data, prefect_harness, tmp_path,
                                                                           h200_profile_dir):
    from connectors.profiles import load_profile_dir

    cfg = _planner(h200_profile_dir)
    fleet, running = _running_planner(warm_data, cfg, load_profile_dir(h200_profile_dir))
    # The running planner holds the burst's replicas three minutes on (its window), above the quiet load's need.
    sized_now = running.sizing["prefill"].replicas
    assert running.decision.prefill_replicas > sized_now, (running.decision, sized_now)

    message, warm = _first_run(warm_data, cfg, "warm-start", fleet, tmp_path)
    assert (warm["decision"]["prefill_replicas"], warm["decision"]["decode_replicas"]) == (
        running.decision.prefill_replicas, running.decision.decode_replicas)
    assert "(warm start)" in message, message
    floor = [r for r in warm["decision"]["reasons"] if r["code"] == "warmup_start_floor"]
    assert floor and all("the collected history's last" in r["message"] for r in floor), warm["decision"]["reasons"]
    # Recorded as the run's recommendation, the floor is what the next runs' window holds.
    assert warm["decision"]["recommended_prefill_replicas"] == running.decision.prefill_replicas

    # The same quiet last interval with nothing before it in Prometheus, on a fleet of one replica each: a cold
    # start, sized for that interval (a scale-down would wait for five intervals of history).
    message, cold = _first_run(warm_data, cfg, "warm-start-new", (1, 1), tmp_path)
    assert "(cold start)" in message, message
    assert not [r for r in cold["decision"]["reasons"] if r["code"] == "warmup_start_floor"]
    assert cold["decision"]["prefill_replicas"] == max(1, sized_now) < warm["decision"]["prefill_replicas"]
