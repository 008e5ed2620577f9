"""HPA-style scale-down stabilization over the recommendations the connectors record.

Each planner run here is what the flow does, on a brand-new connector
instance (a rescheduled run keeps nothing in memory): read the fleet, decide
with the real core, apply (which records the recommendation whether or not
the targets change), and let the deployment environment catch up. The same
table runs against the local JSON file, a real etcd and the fake Kubernetes
API, with expectations computed by hand from the window rule: a run at t
scales down only to the highest recommendation stamped after t - window.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest

from connectors.base import Connector
from connectors.config import KubernetesConnectorConfig, LocalConnectorConfig, VirtualConnectorConfig
from connectors.kubernetes import KubernetesConnector
from connectors.local import LocalConnector
from connectors.virtual import VirtualConnector
from planner.config import DecisionConfig
from planner.decide import decide
from planner.types import Decision, DecisionRecord, Observation, PoolSizing
from tests.fixtures_etcd import etcd, etcd_namespace, etcd_server  # noqa: F401  (fixtures)
from tests.fixtures_prefect import prefect_harness  # noqa: F401  (fixture)
from tests.k8s_fake_server import dgd_manifest, fake_k8s_api, k8s_namespace, kube_api_client, seed_dgd  # noqa: F401

T0_S = 1_700_000_000.0
INTERVAL_S = 60.0


@dataclass
class Backend:
    """A connector factory (a fresh instance per run) and the environment that carries decisions out."""

    name: str
    new_connector: Callable[[], Connector]
    carry_out: Callable[[DecisionRecord], None]


@pytest.fixture(params=["local", "virtual", "kubernetes"])
def backend(request, tmp_path: Path) -> Backend:
    """Every backend starts at prefill 1, decode 1 with nothing recorded."""
    if request.param == "local":
        cfg = LocalConnectorConfig(state_path=str(tmp_path / "fleet.json"))
        return Backend("local", lambda: LocalConnector(cfg), lambda record: None)
    if request.param == "virtual":
        server = request.getfixturevalue("etcd")
        namespace = request.getfixturevalue("etcd_namespace")
        cfg = VirtualConnectorConfig(etcd_url=server.url, namespace=namespace)

        def confirm(record: DecisionRecord) -> None:
            # The environment reports it scaled (Dynamo's scaled_decision_id).
            from etcd3gw.client import Etcd3Client

            client = Etcd3Client(host="127.0.0.1", port=server.client_port, timeout=5)
            client.put(f"/{namespace}/planner/scaled_decision_id", str(record.decision_id))

        return Backend("virtual", lambda: VirtualConnector(cfg), confirm)
    api = request.getfixturevalue("fake_k8s_api")
    namespace = request.getfixturevalue("k8s_namespace")
    obj = seed_dgd(api, request.getfixturevalue("dgd_manifest"), namespace=namespace)
    name = obj["metadata"]["name"]
    cfg = KubernetesConnectorConfig(dgd_name=name, namespace=namespace)
    return Backend(
        "kubernetes",
        lambda: KubernetesConnector(cfg, api_client=kube_api_client(api)),
        lambda record: api.reconcile(namespace, name),  # the operator rolls the replicas out
    )


def observation(now_s: float) -> Observation:
    """Fresh, complete load data, so only sizing and stabilization shape the decision."""
    return Observation(
        taken_at_s=now_s, interval_s=INTERVAL_S, num_requests=600.0, avg_isl_tokens=1000.0,
        avg_osl_tokens=150.0, avg_ttft_ms=None, avg_itl_ms=None,
    )


def planner_run(backend: Backend, *, now_s: float, prefill: int, decode: int, window_s: float):
    """One run as the flow does it: read, decide (sizing says prefill/decode), apply, environment catches up."""
    conn = backend.new_connector()
    fleet = conn.read_fleet(now_s=now_s)
    decision = decide(
        sizing={"prefill": PoolSizing("prefill", prefill), "decode": PoolSizing("decode", decode)},
        saturation=None,
        fleet=fleet,
        obs=observation(now_s),
        cfg=DecisionConfig(scale_down_stabilization_s=window_s),
        now_s=now_s,
    )
    record = conn.apply(decision, now_s=now_s)
    if record is not None:
        backend.carry_out(record)
    return decision, record


def runs(start_s: float, stop_s: float, *, rec: tuple[int, int], want: tuple[int, int]) -> list[tuple]:
    """Rows for runs every 60 s from start_s to stop_s inclusive: (t_s, recommended, expected targets)."""
    n = int((stop_s - start_s) // INTERVAL_S) + 1
    return [(start_s + INTERVAL_S * k, rec, want) for k in range(n)]


# (window_s, rows, changes): rows are (t_s since T0, sizing (prefill, decode), expected targets);
# `changes` is the number of runs whose targets differ from the previous run's (new decision ids).
CASES = [
    pytest.param(
        300.0,
        runs(0, 60, rec=(6, 2), want=(6, 2))
        + runs(120, 300, rec=(3, 2), want=(6, 2))
        + [(359.0, (3, 2), (6, 2)), (360.0, (3, 2), (3, 2))],
        2,
        id="6@0 6@60 then 3: held at 6 while 6@60 is in the window (t - 300 < 60), 3 at t = 360",
    ),
    pytest.param(
        300.0,
        runs(0, 1200, rec=(6, 2), want=(6, 2))
        + runs(1260, 1440, rec=(3, 2), want=(6, 2))
        + runs(1500, 1560, rec=(3, 2), want=(3, 2)),
        2,
        id="quiet 20 min at 6 (nothing applied after t = 0), dip to 3 at 1260: held until 1500 = 1200 + 300",
    ),
    pytest.param(
        300.0,
        runs(0, 60, rec=(2, 2), want=(2, 2))
        + [(120.0, (8, 2), (8, 2))]
        + runs(180, 360, rec=(2, 2), want=(8, 2))
        + [(420.0, (2, 2), (2, 2))],
        3,
        id="spike to 8 at 120 goes up at once; back to 2 only at 420 = 120 + 300",
    ),
    pytest.param(
        300.0,
        [(0.0, (6, 2), (6, 2)), (60.0, (3, 4), (6, 4))]
        + runs(120, 240, rec=(3, 1), want=(6, 4))
        + [(300.0, (3, 1), (3, 4)), (360.0, (3, 1), (3, 1))],
        4,
        id="pools apart: prefill's 6@0 leaves the window at 300 = 0 + 300, decode's 4@60 at 360 = 60 + 300",
    ),
    pytest.param(
        0.0,
        runs(0, 60, rec=(6, 2), want=(6, 2)) + [(120.0, (3, 1), (3, 1))],
        2,
        id="window 0: the dip applies at once",
    ),
]


@pytest.mark.parametrize("window_s, rows, changes", CASES)
def test_dip_after_quiet_window_is_held_by_recorded_recommendations(backend, window_s, rows, changes):
    got, ids = [], []
    for t_s, (rec_p, rec_d), _ in rows:
        decision, record = planner_run(backend, now_s=T0_S + t_s, prefill=rec_p, decode=rec_d, window_s=window_s)
        got.append((decision.prefill_replicas, decision.decode_replicas))
        if record is not None:
            ids.append(record.decision_id)

    assert got == [want for _, _, want in rows]
    # A new decision id only when the targets change, consecutive from 1, across instances.
    assert ids == list(range(1, changes + 1))
    fleet = backend.new_connector().read_fleet(now_s=T0_S + rows[-1][0])
    assert fleet.last_decision.decision_id == changes
    assert (fleet.prefill.current_replicas, fleet.decode.current_replicas) == rows[-1][2]
    # Every run recorded its recommendation (the default 32 newest kept), oldest first.
    expected = [(T0_S + t_s, rec[0], rec[1]) for t_s, rec, _ in rows][-32:]
    assert list(fleet.recent_targets) == expected


def test_restart_mid_window_keeps_the_hold(backend):
    """A recommendation recorded by one process holds a dip decided by another."""
    planner_run(backend, now_s=T0_S, prefill=6, decode=2, window_s=300.0)
    planner_run(backend, now_s=T0_S + 240, prefill=6, decode=2, window_s=300.0)  # quiet: nothing applied
    decision, record = planner_run(backend, now_s=T0_S + 480, prefill=3, decode=2, window_s=300.0)
    # 480 - 300 = 180 < 240: the 6 recommended at 240 is in the window.
    assert (decision.prefill_replicas, record) == (6, None)
    assert "stabilization_window" in decision.codes()
    assert decision.recommended_prefill_replicas == 3


# -- the flow: non-dry runs record, dry runs and what-ifs do not ----------------------------------


def _flow_observation(*, requests: float, taken_at_s: float) -> Observation:
    from planner.types import LoadHistory

    n = 30
    history = LoadHistory(
        t_s=tuple(taken_at_s - INTERVAL_S * (n - 1 - i) for i in range(n)),
        num_requests=(requests,) * n,
        avg_isl_tokens=(1000.0,) * n,
        avg_osl_tokens=(150.0,) * n,
        interval_s=INTERVAL_S,
    )
    return Observation(
        taken_at_s=taken_at_s, interval_s=INTERVAL_S, num_requests=requests, avg_isl_tokens=1000.0,
        avg_osl_tokens=150.0, avg_ttft_ms=60.0, avg_itl_ms=6.0, history=history,
    )


def test_flow_records_every_acting_run_and_no_dry_run(prefect_harness, tmp_path, h200_profile_dir):
    from flows.config import PlannerRunConfig, WhatIfParams
    from flows.planner_flow import planner_flow
    from planner.config import CorrectionConfig, PlannerConfig, ProfileConfig

    state = tmp_path / "fleet.json"
    # No latency correction: the same load sizes the same whatever the fleet, so run 2 changes nothing.
    planner = PlannerConfig(namespace="stabilization", profile=ProfileConfig(dir=str(h200_profile_dir)),
                            correction=CorrectionConfig(enabled=False))
    cfg = PlannerRunConfig(planner=planner, connector=LocalConnectorConfig(state_path=str(state)))

    # 6,000 requests/min of ISL 1000 = 100 rps: several H200 prefill replicas within a 200 ms TTFT.
    first = planner_flow(config=cfg, observation=_flow_observation(requests=6000.0, taken_at_s=1800.0), now_s=1800.0)
    second = planner_flow(config=cfg, observation=_flow_observation(requests=6000.0, taken_at_s=1860.0), now_s=1860.0)

    assert (first["applied"], first["decision_id"]) == (True, 1)
    assert (second["applied"], second["decision_id"]) == (False, None)  # same load: targets unchanged
    stored = json.loads(state.read_text())
    assert stored["decision_id"] == 1
    assert [e["t_s"] for e in stored["recommendations"]] == [1800.0, 1860.0]
    assert stored["recommendations"][1]["prefill"] == second["decision"]["recommended_prefill_replicas"]

    written = state.read_text()
    dry = planner_flow(config=cfg, observation=_flow_observation(requests=600.0, taken_at_s=1920.0),
                       dry_run=True, now_s=1920.0)
    what_if = planner_flow(config=cfg, observation=_flow_observation(requests=600.0, taken_at_s=1920.0),
                           what_if=WhatIfParams(load_multiplier=4.0), now_s=1920.0)
    assert dry["dry_run"] and what_if["dry_run"]
    assert state.read_text() == written  # neither recorded nor applied anything


# -- the run configuration refuses a history too short for the window -----------------------------


@pytest.mark.parametrize("connector, interval_s, window_s, message", [
    pytest.param({"history_max_age_s": 200.0}, 60.0, 300.0,
                 r"connector.history_max_age_s \(200 s\) is shorter than "
                 r"planner.decision.scale_down_stabilization_s \(300 s\)",
                 id="age cap 200 s < window 300 s"),
    pytest.param({"history_max_entries": 30}, 10.0, 300.0,
                 r"connector.history_max_entries \(30\) keeps fewer than the 31 .*ceil\(300 / 10\) \+ 1",
                 id="entries: ceil(300 / 10) + 1 = 31 > 30"),
])
def test_run_config_rejects_history_shorter_than_window(h200_profile_dir, connector, interval_s, window_s, message):
    from flows.config import PlannerRunConfig

    data = {
        "planner": {"adjustment_interval_s": interval_s, "profile": {"dir": str(h200_profile_dir)},
                    "decision": {"scale_down_stabilization_s": window_s}},
        "connector": {"kind": "local", **connector},
    }
    with pytest.raises(ValueError, match=message):
        PlannerRunConfig.model_validate(data)


@pytest.mark.parametrize("connector, interval_s, window_s", [
    pytest.param({"history_max_entries": 31}, 10.0, 300.0, id="entries: exactly ceil(300 / 10) + 1 = 31"),
    pytest.param({"history_max_age_s": 300.0}, 60.0, 300.0, id="age cap equal to the window"),
    pytest.param({"history_max_entries": 1, "history_max_age_s": 1.0}, 60.0, 0.0, id="window 0: nothing to keep"),
])
def test_run_config_accepts_history_covering_window(h200_profile_dir, connector, interval_s, window_s):
    from flows.config import PlannerRunConfig

    PlannerRunConfig.model_validate({
        "planner": {"adjustment_interval_s": interval_s, "profile": {"dir": str(h200_profile_dir)},
                    "decision": {"scale_down_stabilization_s": window_s}},
        "connector": {"kind": "local", **connector},
    })


def test_decision_without_recommendation_records_its_targets(tmp_path):
    conn = LocalConnector(LocalConnectorConfig(state_path=str(tmp_path / "fleet.json")))
    conn.apply(Decision(prefill_replicas=3, decode_replicas=2, apply=True, reasons=()), now_s=T0_S)
    conn.apply(Decision(prefill_replicas=3, decode_replicas=2, apply=False, reasons=(),
                        recommended_decode_replicas=1), now_s=T0_S + 60)
    # Recommended where set, else the target: (3, 2), then (3 from the target, 1 recommended).
    assert conn.read_fleet(now_s=T0_S + 60).recent_targets == ((T0_S, 3, 2), (T0_S + 60, 3, 1))
