"""Topology-aware decode selection: fail/fallback, missing labels, unset level, soft scoring, label files.

Latency model as in test_routing_picker: TTFT = 50 + 0.01*input + 0.01*prefill
tokens in flight; TPOT = 5 + running requests (ms).
"""

from __future__ import annotations

import os

import pytest

from routing.config import RouterConfig
from routing.picking.picker import RouteRequest, TopologyError
from routing.service import RoutingService
from routing.fleet.topology import TopologyLabelError, read_domain_labels
from tests.support.fixtures_routing import PROFILE_DIR, fleet, h200_profile, occupy, picker

A = {"zone": "a", "rack": "a1"}
A2 = {"zone": "a", "rack": "a2"}
B = {"zone": "b", "rack": "b1"}


def req(rid="r", *, input_tokens=1000, ttft=300.0, tpot=None) -> RouteRequest:
    return RouteRequest(request_id=rid, input_tokens=input_tokens, ttft_ms=ttft, itl_ms=tpot)


def zone(policy="fail", **extra) -> dict:
    return {"topology": {"level": "zone", "policy": policy, **extra}, "slo": {"exploration_frac": 0.0}}


def test_fail_policy_errors_when_no_prefill_has_a_same_domain_decode():
    reg = fleet(("p_a", "prefill", A), ("d_b", "decode", B))
    with pytest.raises(TopologyError, match="no prefill endpoint shares a zone domain with a decode endpoint"):
        picker(zone("fail")).pick(req(), reg, 1.0)


def test_fallback_policy_routes_across_domains_and_says_so():
    reg = fleet(("p_a", "prefill", A), ("d_b", "decode", B))
    result = picker(zone("fallback")).pick(req(), reg, 1.0)
    assert result.routed and result.topology_fallback
    assert (result.prefill.endpoint_id, result.decode.endpoint_id) == ("p_a", "d_b")
    assert "fallback" in result.reason


def test_decode_stage_fail_names_the_domain():
    reg = fleet(("p_a", "prefill", A), ("d_b", "decode", B))
    with pytest.raises(TopologyError, match="no decode endpoint in zone 'a' of prefill p_a"):
        picker(zone("fail")).pick_decode(req(), reg, 1.0, prefill_id="p_a", prefill_ttft_ms=60.0)


def test_decode_candidates_stay_in_the_prefill_domain():
    reg = fleet(("p_a", "prefill", A), ("p_b", "prefill", B), ("d_a", "decode", A), ("d_b", "decode", B),
                ("d_b2", "decode", B))
    pk = picker({"topology": {"level": "zone"}, "slo": {"exploration_frac": 0.2}}, seed=1)
    for k in range(300):
        result = pk.pick(req(f"r{k}"), reg, 1.0)
        p, d = result.prefill.endpoint_id, result.decode.endpoint_id
        assert reg.get(p).domains["zone"] == reg.get(d).domains["zone"], (p, d)
        assert not result.topology_fallback


def test_decode_missing_label_excluded_but_eligible_as_fallback():
    labelled = fleet(("p_a", "prefill", A), ("d_a", "decode", A), ("d_x", "decode", {}))
    pk = picker(zone("fallback"), seed=2)
    assert {pk.pick(req(f"r{k}"), labelled, 1.0).decode.endpoint_id for k in range(200)} == {"d_a"}
    only_unlabelled = fleet(("p_a", "prefill", A), ("d_x", "decode", {}))
    result = picker(zone("fallback")).pick(req(), only_unlabelled, 1.0)
    assert result.decode.endpoint_id == "d_x" and result.topology_fallback
    with pytest.raises(TopologyError):
        picker(zone("fail")).pick(req(), only_unlabelled, 1.0)


def test_prefill_missing_label_never_matches_a_domain():
    reg = fleet(("p_x", "prefill", {}), ("p_a", "prefill", A), ("d_a", "decode", A))
    occupy(reg, "p_a", request_id="busy", input_tokens=20_000)  # p_x would be far faster
    pk = picker(zone("fail"), seed=4)
    assert {pk.pick(req(f"r{k}", ttft=1000.0), reg, 1.0).prefill.endpoint_id for k in range(100)} == {"p_a"}


def test_prefers_prefill_endpoints_with_a_local_decode():
    # p_b is idle and faster, but zone b has no decode endpoint.
    reg = fleet(("p_a", "prefill", A), ("p_b", "prefill", B), ("d_a", "decode", A))
    occupy(reg, "p_a", request_id="busy", input_tokens=10_000)
    pk = picker(zone("fallback"), seed=5)
    results = [pk.pick(req(f"r{k}"), reg, 1.0) for k in range(100)]
    assert {r.prefill.endpoint_id for r in results} == {"p_a"}
    assert not any(r.topology_fallback for r in results)


def test_level_unset_behaves_exactly_like_no_topology():
    specs = [("p_a", "prefill", A), ("p_b", "prefill", B), ("d_a", "decode", A), ("d_b", "decode", B)]

    def run(config):
        reg = fleet(*specs)
        pk = picker(config, seed=9)
        return [(r.prefill.endpoint_id, r.decode.endpoint_id, r.topology_fallback)
                for r in (pk.pick(req(f"r{k}"), reg, 1.0) for k in range(200))]

    unset = run({"topology": {"level": None, "policy": "fail"}})
    assert unset == run({})
    assert any(p[-1] != d[-1] for p, d, _ in unset)  # cross-zone pairs do occur


# kv_bytes = 1000 tokens * 131072 B = 131.072e6 B
#   rack: 0.2 + 131.072e6 / 50e9 * 1e3 = 2.82144 ms
#   zone: 1.0 + 131.072e6 / 25e9 * 1e3 = 6.24288 ms
#   none: 5.0 + 131.072e6 / 10e9 * 1e3 = 18.1072 ms (weight 1)
QOS = {
    "none": {"latency_ms": 5.0, "bandwidth_gbyte_per_s": 10.0},
    "zone": {"latency_ms": 1.0, "bandwidth_gbyte_per_s": 25.0},
    "rack": {"latency_ms": 0.2, "bandwidth_gbyte_per_s": 50.0},
    "host": {"latency_ms": 0.0, "bandwidth_gbyte_per_s": 400.0},
}
SOFT_FLEET = [("p", "prefill", A), ("d_rack", "decode", A), ("d_zone", "decode", A2), ("d_far", "decode", B)]


@pytest.mark.parametrize("level, ttft_slo_ms, expected_decodes", [
    # Prefill TTFT = 50 + 10 = 60 ms; decode TTFT headroom = SLO - 60 - cost.
    pytest.param(None, 65.0, {"d_rack"}, id="SLO 65: rack 65-60-2.82=+2.18; zone -1.24; far -13.1"),
    pytest.param(None, 70.0, {"d_rack", "d_zone"}, id="SLO 70: rack +7.18, zone +3.76, far -8.1"),
    pytest.param("zone", 90.0, {"d_rack", "d_zone"}, id="hard zone filter drops d_far, cost ranks the rest"),
])
def test_soft_scoring_spends_transfer_cost_from_ttft_budget(level, ttft_slo_ms, expected_decodes):
    reg = fleet(*SOFT_FLEET)
    # Weighted random among every endpoint with headroom (no margin), so each one with
    # headroom shows up: the default (`max`, margin 0.1) would always take d_rack.
    slo = {"exploration_frac": 0.0, "strategy": "least", "headroom_margin_frac": 0.0}
    cfg = {"topology": {"level": level, "qos": QOS, "kv_bytes_per_token": 131072}, "slo": slo}
    pk = picker(cfg, seed=6)
    results = [pk.pick(req(f"r{k}", ttft=ttft_slo_ms), reg, 1.0) for k in range(300)]
    assert {r.decode.endpoint_id for r in results} == expected_decodes
    by_id = {r.decode.endpoint_id: r.decode for r in results}
    assert by_id["d_rack"].transfer_cost_ms == pytest.approx(2.82144)
    assert by_id["d_rack"].shared_level == "rack"
    assert by_id["d_rack"].headroom_ttft_ms == pytest.approx(ttft_slo_ms - 60.0 - 2.82144)
    if "d_zone" in by_id:
        assert by_id["d_zone"].transfer_cost_ms == pytest.approx(6.24288)
        assert by_id["d_zone"].shared_level == "zone"


def test_soft_scoring_without_slo_routing_adds_cost_to_the_score():
    # TPOT equal (5 ms, idle): score = 5 * 128 + cost -> the rack neighbour wins.
    reg = fleet(*SOFT_FLEET)
    cfg = {"topology": {"qos": QOS, "kv_bytes_per_token": 131072},
           "slo": {"enabled": False, "exploration_frac": 0.0}}
    result = picker(cfg).pick(RouteRequest(request_id="r", input_tokens=1000), reg, 1.0)
    assert result.decode.endpoint_id == "d_rack"


def test_qos_table_must_cover_every_level():
    with pytest.raises(ValueError, match=r"missing \['host', 'none'\]"):
        picker({"topology": {"qos": {k: QOS[k] for k in ("zone", "rack")}}})


# -- label files (Downward API volume) -------------------------------------------


def test_read_domain_labels_through_downward_api_symlinks(tmp_path):
    data = tmp_path / "..2026_11_22_00_00_00.1"
    data.mkdir()
    (data / "zone").write_text("us-east-1a\n")
    (data / "rack").write_text("")  # empty: treated as missing
    os.symlink(data.name, tmp_path / "..data")
    for name in ("zone", "rack"):
        os.symlink(f"..data/{name}", tmp_path / name)
    labels = read_domain_labels(tmp_path, levels=("zone", "rack", "host"), required_level="zone", wait_s=0, poll_s=1)
    assert labels == {"zone": "us-east-1a"}


def test_read_domain_labels_waits_for_the_required_file(tmp_path):
    clock = [0.0]
    sleeps = []

    def sleep(s):
        sleeps.append(s)
        clock[0] += s
        if len(sleeps) == 2:
            (tmp_path / "rack").write_text("r7")

    labels = read_domain_labels(tmp_path, levels=("zone", "rack"), required_level="rack", wait_s=10, poll_s=0.5,
                                sleep=sleep, clock=lambda: clock[0])
    assert labels == {"rack": "r7"} and sleeps == [0.5, 0.5]


def test_missing_label_file_fails_after_the_retry_period(tmp_path):
    clock = [0.0]

    def sleep(s):
        clock[0] += s

    with pytest.raises(TopologyLabelError, match=rf"{tmp_path}/zone does not exist after waiting 3 s"):
        read_domain_labels(tmp_path, levels=("zone",), required_level="zone", wait_s=3, poll_s=1,
                           sleep=sleep, clock=lambda: clock[0])
    assert clock[0] == 3.0


def test_service_startup_fails_clearly_when_the_level_file_never_appears(tmp_path):
    cfg = RouterConfig.model_validate({
        "profile_dir": str(PROFILE_DIR),
        "picker": {"topology": {"level": "rack", "labels_wait_s": 0.2, "labels_poll_s": 0.05}},
        "endpoints": [{"id": "p0", "role": "prefill", "labels_dir": str(tmp_path)}],
    })
    (tmp_path / "zone").write_text("a")
    with pytest.raises(TopologyLabelError, match=rf"{tmp_path}/rack does not exist after waiting 0.2 s"):
        RoutingService(cfg, profile=h200_profile())
    (tmp_path / "rack").write_text("a1")
    svc = RoutingService(cfg, profile=h200_profile())
    assert svc.registry.get("p0").domains == {"zone": "a", "rack": "a1"}
