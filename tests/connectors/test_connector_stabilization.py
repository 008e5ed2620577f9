"""HPA-style scale-down stabilization over the recommendations the connectors record.

Each planner run here is what the flow does, on a brand-new connector
instance (a rescheduled run keeps nothing in memory): read the fleet, decide
with the real core, apply (which records the recommendation), and let the
deployment environment catch up. Expectations are computed by hand from the
window rule: a run at t scales down only to the highest recommendation
stamped after t - window.

The local file and etcd record every run's recommendation, stamped with its
run. The Kubernetes connector records only changes of the recommendation (so
a run that changes nothing writes nothing to the DGD) and stamps each with the
last time it was in effect: until the run that superseded it. Its releases
therefore come window_s after the superseding run rather than after the last
run that recommended the higher value, one interval later; it has its own
table.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest

from connectors.base import Connector, add_recommendation_change, changes_as_recent_targets
from connectors.config import KubernetesConnectorConfig, LocalConnectorConfig, VirtualConnectorConfig
from connectors.kubernetes import KubernetesConnector
from connectors.local import LocalConnector
from connectors.virtual import VirtualConnector
from planner.config import DecisionConfig
from planner.decision.decide import decide
from planner.types import Decision, DecisionRecord, Observation, PoolSizing
from tests.support.k8s_fake_server import kube_api_client, seed_dgd

T0_S = 1_700_000_000.0
INTERVAL_S = 60.0


@dataclass
class Backend:
    """A connector factory (a fresh instance per run) and the environment that carries decisions out."""

    name: str
    new_connector: Callable[[], Connector]
    carry_out: Callable[[DecisionRecord], None]


def make_backend(request, kind: str, tmp_path: Path) -> Backend:
    """A backend at prefill 1, decode 1 with nothing recorded."""
    if kind == "local":
        cfg = LocalConnectorConfig(state_path=str(tmp_path / "fleet.json"))
        return Backend("local", lambda: LocalConnector(cfg), lambda record: None)
    if kind == "virtual":
        server = request.getfixturevalue("etcd")
        namespace = request.getfixturevalue("etcd_namespace")
        cfg = VirtualConnectorConfig(etcd_url=server.url, namespace=namespace)

        def confirm(record: DecisionRecord) -> None:
            # The environment reports it scaled (Dynamo's scaled_decision_id).
            from etcd3gw.client import Etcd3Client

            client = Etcd3Client(host="127.0.0.1", port=server.client_port, timeout=5)
            client.put(f"v1/{namespace}/planner/scaled_decision_id", str(record.decision_id))

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


@pytest.fixture(params=["local", "virtual", "kubernetes"])
def backend(request, tmp_path: Path) -> Backend:
    return make_backend(request, request.param, tmp_path)


@pytest.fixture(params=["local", "virtual"])
def per_run_backend(request, tmp_path: Path) -> Backend:
    """The backends that record every run's recommendation."""
    return make_backend(request, request.param, tmp_path)


@pytest.fixture
def k8s_backend(request, tmp_path: Path) -> Backend:
    return make_backend(request, "kubernetes", tmp_path)


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
        cfg=DecisionConfig(scale_down_stabilization_s=window_s, scale_down_floor_s=None),  # HPA's window alone
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


def play(backend: Backend, window_s: float, rows: list[tuple], changes: int):
    """Run the rows; check targets and decision ids; the fleet as read after the last run."""
    got, ids = [], []
    for t_s, (rec_p, rec_d), _ in rows:
        decision, record = planner_run(backend, now_s=T0_S + t_s, prefill=rec_p, decode=rec_d, window_s=window_s)
        got.append((decision.prefill_replicas, decision.decode_replicas))
        if record is not None:
            ids.append(record.decision_id)

    assert got == [want for _, _, want in rows]
    # A new decision id only when the targets change, consecutive across instances, from 1
    # (the virtual connector from 0, as Dynamo's coordinator counts).
    first = 0 if backend.name == "virtual" else 1
    assert ids == list(range(first, first + changes))
    fleet = backend.new_connector().read_fleet(now_s=T0_S + rows[-1][0])
    assert fleet.last_decision.decision_id == first + changes - 1
    assert (fleet.prefill.current_replicas, fleet.decode.current_replicas) == rows[-1][2]
    return fleet


@pytest.mark.parametrize("window_s, rows, changes", CASES)
def test_dip_after_quiet_window_is_held_by_recorded_recommendations(per_run_backend, window_s, rows, changes):
    fleet = play(per_run_backend, window_s, rows, changes)
    # Every run recorded its recommendation (the default 32 newest kept), oldest first.
    expected = [(T0_S + t_s, rec[0], rec[1]) for t_s, rec, _ in rows][-32:]
    assert list(fleet.recent_targets) == expected


# The same scenarios for the change-only history: a recommendation holds until window_s after the
# run that superseded it. (window_s, rows, changes, recent_targets as read after the last run:
# each recommendation stamped with the time it was superseded, the current one with the last run.)
K8S_CASES = [
    pytest.param(
        300.0,
        runs(0, 60, rec=(6, 2), want=(6, 2))
        + runs(120, 360, rec=(3, 2), want=(6, 2))
        + [(419.0, (3, 2), (6, 2)), (420.0, (3, 2), (3, 2))],
        2,
        ((120.0, 6, 2), (420.0, 3, 2)),
        id="6@0 6@60 then 3 from 120: 6 superseded at 120 holds while t - 300 < 120, 3 at t = 420",
    ),
    pytest.param(
        300.0,
        runs(0, 1200, rec=(6, 2), want=(6, 2))
        + runs(1260, 1500, rec=(3, 2), want=(6, 2))
        + runs(1560, 1620, rec=(3, 2), want=(3, 2)),
        2,
        ((1260.0, 6, 2), (1620.0, 3, 2)),
        id="quiet 20 min at 6 (one record), dip to 3 at 1260: held until 1560 = 1260 + 300",
    ),
    pytest.param(
        300.0,
        runs(0, 60, rec=(2, 2), want=(2, 2))
        + [(120.0, (8, 2), (8, 2))]
        + runs(180, 420, rec=(2, 2), want=(8, 2))
        + [(480.0, (2, 2), (2, 2))],
        3,
        ((120.0, 2, 2), (180.0, 8, 2), (480.0, 2, 2)),
        id="spike to 8 at 120 goes up at once; superseded at 180, back to 2 at 480 = 180 + 300",
    ),
    pytest.param(
        300.0,
        [(0.0, (6, 2), (6, 2)), (60.0, (3, 4), (6, 4))]
        + runs(120, 300, rec=(3, 1), want=(6, 4))
        + [(360.0, (3, 1), (3, 4)), (420.0, (3, 1), (3, 1))],
        4,
        ((60.0, 6, 2), (120.0, 3, 4), (420.0, 3, 1)),
        id="pools apart: prefill's 6 superseded at 60 leaves at 360 = 60 + 300, decode's 4 (at 120) at 420",
    ),
    pytest.param(
        0.0,
        runs(0, 60, rec=(6, 2), want=(6, 2)) + [(120.0, (3, 1), (3, 1))],
        2,
        ((120.0, 6, 2), (120.0, 3, 1)),
        id="window 0: the dip applies at once",
    ),
]


@pytest.mark.parametrize("window_s, rows, changes, recorded", K8S_CASES)
def test_change_only_history_holds_until_window_after_superseded(k8s_backend, window_s, rows, changes, recorded):
    fleet = play(k8s_backend, window_s, rows, changes)
    assert fleet.recent_targets == tuple((T0_S + t_s, p, d) for t_s, p, d in recorded)


def test_k8s_quiet_runs_leave_the_dgd_alone_and_a_restart_keeps_the_hold(k8s_backend, fake_k8s_api, k8s_namespace):
    """Each run is a new connector (a restarted planner); only the runs that change something write."""
    name = "vllm-disagg"

    def resource_version() -> str:
        return fake_k8s_api.get(k8s_namespace, name)["metadata"]["resourceVersion"]

    def writes() -> int:
        return sum(r.method == "PATCH" for r in fake_k8s_api.requests)

    planner_run(k8s_backend, now_s=T0_S, prefill=6, decode=2, window_s=300.0)
    rv, before = resource_version(), writes()
    for k in range(1, 11):  # ten quiet runs, 60 s apart
        decision, record = planner_run(k8s_backend, now_s=T0_S + 60 * k, prefill=6, decode=2, window_s=300.0)
        assert (decision.prefill_replicas, record) == (6, None)
    assert (resource_version(), writes()) == (rv, before)

    # The dip: one write (the new recommendation), the targets held by the quiet stretch's 6.
    decision, record = planner_run(k8s_backend, now_s=T0_S + 660, prefill=3, decode=2, window_s=300.0)
    assert (decision.prefill_replicas, record, writes()) == (6, None, before + 1)
    assert "stabilization_window" in decision.codes()
    # Still held at 900 (660 + 300 > 900), without writing; released at 960 = 660 + 300 with one write.
    decision, _ = planner_run(k8s_backend, now_s=T0_S + 900, prefill=3, decode=2, window_s=300.0)
    assert (decision.prefill_replicas, writes()) == (6, before + 1)
    decision, record = planner_run(k8s_backend, now_s=T0_S + 960, prefill=3, decode=2, window_s=300.0)
    assert (decision.prefill_replicas, record.decision_id, writes()) == (3, 2, before + 2)


@pytest.mark.parametrize("changes, entry, expected", [
    pytest.param([], (0, 6, 2), [(0, 6, 2)], id="first record"),
    pytest.param([(0, 6, 2)], (60, 6, 2), None, id="unchanged: nothing to write"),
    pytest.param([(0, 6, 2), (60, 3, 2)], (60, 3, 2), None, id="retried run: nothing to write"),
    pytest.param([(0, 6, 2)], (60, 3, 2), [(0, 6, 2), (60, 3, 2)], id="changed: appended"),
    pytest.param([(0, 6, 2), (60, 3, 2)], (60, 4, 2), [(0, 6, 2), (60, 4, 2)], id="same t_s, other value: replaced"),
    pytest.param([(0, 6, 2), (60, 3, 2)], (60, 6, 2), [(0, 6, 2)], id="same t_s, back to the one before: dropped"),
    pytest.param([(0, 1, 1), (50, 2, 2), (150, 3, 3)], (300, 4, 4), [(150, 3, 3), (300, 4, 4)],
                 id="age 100 at 300: cut 200; 1 (superseded at 50) and 2 (at 150) go, 3 (until 300) stays"),
    pytest.param([(0, 1, 1), (10, 2, 2), (20, 3, 3)], (30, 4, 4), [(10, 2, 2), (20, 3, 3), (30, 4, 4)],
                 id="3 entries kept: the newest 3 of 4"),
])
def test_add_recommendation_change(changes, entry, expected):
    def as_dicts(rows):
        return [{"t_s": float(t), "prefill": p, "decode": d} for t, p, d in rows]

    got = add_recommendation_change(as_dicts(changes), as_dicts([entry])[0], max_entries=3, max_age_s=100.0)
    assert got == (None if expected is None else as_dicts(expected))


@pytest.mark.parametrize("changes, now_s, expected", [
    pytest.param([], 100.0, (), id="nothing recorded"),
    pytest.param([(0, 6, 2)], 100.0, ((100.0, 6, 2),), id="one: in effect until now"),
    pytest.param([(0, 6, 2), (60, 3, 2)], 100.0, ((60.0, 6, 2), (100.0, 3, 2)), id="6 until 60, 3 until now"),
    pytest.param([(0, 6, 2)], -5.0, ((0.0, 6, 2),), id="recorded after now (clock skew): its own time"),
])
def test_changes_as_recent_targets(changes, now_s, expected):
    rows = [{"t_s": float(t), "prefill": p, "decode": d} for t, p, d in changes]
    assert changes_as_recent_targets(rows, now_s=now_s) == expected


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
    from flows.config import PlannerRunConfig, ReplayInputs
    from flows.planner_flow import planner_flow
    from planner.config import CorrectionConfig, PlannerConfig, ProfileConfig
    from planner.whatif import WhatIf

    state = tmp_path / "fleet.json"
    # No latency correction: the same load sizes the same whatever the fleet, so run 2 changes nothing.
    planner = PlannerConfig(namespace="stabilization", profile=ProfileConfig(dir=str(h200_profile_dir)),
                            correction=CorrectionConfig(enabled=False))
    cfg = PlannerRunConfig(planner=planner, connector=LocalConnectorConfig(state_path=str(state)))

    def replay(requests: float, t_s: float) -> ReplayInputs:
        return ReplayInputs(observation=_flow_observation(requests=requests, taken_at_s=t_s), now_s=t_s)

    # 6,000 requests/min of ISL 1000 = 100 rps: several H200 prefill replicas within a 200 ms TTFT.
    first = planner_flow(config=cfg, replay=replay(6000.0, 1800.0))
    second = planner_flow(config=cfg, replay=replay(6000.0, 1860.0))

    assert (first["applied"], first["decision_id"]) == (True, 1)
    assert (second["applied"], second["decision_id"]) == (False, None)  # same load: targets unchanged
    stored = json.loads(state.read_text())
    assert stored["decision_id"] == 1
    assert [e["t_s"] for e in stored["recommendations"]] == [1800.0, 1860.0]
    assert stored["recommendations"][1]["prefill"] == second["decision"]["recommended_prefill_replicas"]

    written = state.read_text()
    dry = planner_flow(config=cfg, replay=replay(600.0, 1920.0), dry_run=True)
    what_if = planner_flow(config=cfg, replay=replay(600.0, 1920.0), what_if=WhatIf(load_multiplier=4.0))
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
    pytest.param({"history_max_age_s": 300.0}, 60.0, {"independent_stabilization_s": 360.0},
                 r"connector.history_max_age_s \(300 s\) is shorter than "
                 r"planner.decision.independent_stabilization_s \(360 s\)",
                 id="the recurrence hold's 360 s window is the longer one"),
    pytest.param({"history_max_entries": 60}, 60.0, {"scale_down_floor_s": 3600.0},
                 r"connector.history_max_entries \(60\) keeps fewer than the 61 recommendations "
                 r"planner.decision.scale_down_floor_s \(3600 s\) holds .*ceil\(3600 / 60\) \+ 1",
                 id="the scale-down floor's hour at one run a minute: 61 entries > 60 set"),
])
def test_run_config_rejects_history_shorter_than_window(h200_profile_dir, connector, interval_s, window_s, message):
    from flows.config import PlannerRunConfig

    data = {
        "planner": {"adjustment_interval_s": interval_s, "profile": {"dir": str(h200_profile_dir)},
                    "decision": {"scale_down_floor_s": None,  # the case's window alone, unless it names the floor
                                 **(window_s if isinstance(window_s, dict) else {"scale_down_stabilization_s": window_s})}},
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
                    "decision": {"scale_down_stabilization_s": window_s, "scale_down_floor_s": None}},
        "connector": {"kind": "local", **connector},
    })


@pytest.mark.parametrize("connector, interval_s, decision, entries, age_s", [
    pytest.param({}, 10.0, {"scale_down_floor_s": 3600.0}, 361, 3600.0,
                 id="unset: an hour's floor at one run every 10 s keeps ceil(3600 / 10) + 1 = 361"),
    pytest.param({}, 60.0, {"scale_down_stabilization_s": 7200.0}, 121, 7200.0,
                 id="unset: a two-hour window raises the age cap too"),
    pytest.param({}, 60.0, {"scale_down_stabilization_s": 300.0, "scale_down_floor_s": None}, 32, 3600.0,
                 id="unset: the defaults already hold HPA's 300 s"),
    pytest.param({}, 60.0, {}, 61, 3600.0,
                 id="unset: the default floor's hour at one run a minute keeps ceil(3600 / 60) + 1 = 61"),
    pytest.param({"history_max_entries": 400}, 10.0, {"scale_down_floor_s": 3600.0}, 400, 3600.0,
                 id="set: kept when it holds the window"),
])
def test_run_config_sizes_an_unset_history_to_the_window(h200_profile_dir, connector, interval_s, decision,
                                                         entries, age_s):
    from flows.config import PlannerRunConfig

    for kind in ("local", "virtual"):
        cfg = PlannerRunConfig.model_validate({
            "planner": {"adjustment_interval_s": interval_s, "profile": {"dir": str(h200_profile_dir)},
                        "decision": decision},
            "connector": {"kind": kind, **connector},
        })
        assert (cfg.connector.history_max_entries, cfg.connector.history_max_age_s) == (entries, age_s)


def test_decision_without_recommendation_records_its_targets(tmp_path):
    conn = LocalConnector(LocalConnectorConfig(state_path=str(tmp_path / "fleet.json")))
    conn.apply(Decision(prefill_replicas=3, decode_replicas=2, apply=True, reasons=()), now_s=T0_S)
    conn.apply(Decision(prefill_replicas=3, decode_replicas=2, apply=False, reasons=(),
                        recommended_decode_replicas=1), now_s=T0_S + 60)
    # Recommended where set, else the target: (3, 2), then (3 from the target, 1 recommended).
    assert conn.read_fleet(now_s=T0_S + 60).recent_targets == ((T0_S, 3, 2), (T0_S + 60, 3, 1))
