"""The planner flow's correction divides the interval's load by the replicas that served it: a scale-up the
previous run applied, still starting through the interval, does not count (planner.latency.served)."""

from __future__ import annotations

import json
from pathlib import Path

from connectors.config import LocalConnectorConfig
from flows.config import PlannerRunConfig, ReplayInputs
from planner.config import PlannerConfig, ProfileConfig
from planner.types import LoadHistory, Observation, PodMetrics

INTERVAL_S = 60.0
NOW_S = 1800.0


def _observation() -> Observation:
    # 20 rps of ISL 1000 (~40 ms of H200 prefill each: 0.8 of one replica busy) and a 150 ms mean TTFT: what
    # one prefill replica shows at that load, far above what four would.
    n = 30
    hist = LoadHistory(t_s=tuple(INTERVAL_S * i for i in range(1, n + 1)), num_requests=(1200.0,) * n,
                       avg_isl_tokens=(1000.0,) * n, avg_osl_tokens=(150.0,) * n, interval_s=INTERVAL_S)
    return Observation(taken_at_s=NOW_S, interval_s=INTERVAL_S, num_requests=1200.0, avg_isl_tokens=1000.0,
                       avg_osl_tokens=150.0, avg_ttft_ms=150.0, avg_itl_ms=6.0, history=hist,
                       pods=(PodMetrics("worker-prefill-0", "prefill", 0.2, 0.0),
                             PodMetrics("worker-decode-0", "decode", 0.3, 0.0)))


def _config(tmp_path: Path, profile_dir: Path, replicas: str) -> PlannerRunConfig:
    # The fleet ran 1 x 1 until the previous run (one interval ago) scaled prefill to 4: those three
    # replicas turn ready (apply_delay_s 60) as this run starts.
    state = tmp_path / f"fleet-{replicas}.json"
    state.write_text(json.dumps({
        "version": 1, "prefill": 4, "decode": 1, "decision_id": 2, "decided_at_s": NOW_S - INTERVAL_S,
        "ready_before": [1, 1], "recommendations": [],
        "history": [{"id": 1, "t_s": 0.0, "prefill": 1, "decode": 1},
                    {"id": 2, "t_s": NOW_S - INTERVAL_S, "prefill": 4, "decode": 1}],
    }))
    planner = PlannerConfig(namespace="test-ns", profile=ProfileConfig(dir=str(profile_dir)))
    planner = planner.model_copy(update={"correction": planner.correction.model_copy(update={"replicas": replicas})})
    return PlannerRunConfig(planner=planner, connector=LocalConnectorConfig(state_path=str(state), apply_delay_s=60.0))


def test_the_flow_corrects_on_the_replicas_that_served_the_interval(prefect_harness, tmp_path, h200_profile_dir):
    from flows.planner_flow import planner_flow

    runs = {replicas: planner_flow(config=_config(tmp_path, h200_profile_dir, replicas), dry_run=True,
                                   replay=ReplayInputs(observation=_observation(), now_s=NOW_S))
            for replicas in ("served", "current")}
    served, current = runs["served"]["corrections"]["prefill"], runs["current"]["corrections"]["prefill"]
    # On the one replica that served it, 150 ms is mostly queueing: engines at about their profiled speed.
    # Divided by the four the fleet has now, the same 150 ms reads as engines 3x slow (the clamp).
    assert served < 1.5, served
    assert current >= 2.5, current
    assert runs["served"]["decision"]["prefill_replicas"] < runs["current"]["decision"]["prefill_replicas"]
