"""SLO-aware picking: headroom, strategies, exploration, shedding, criticality, determinism.

The latency model is a published linear model (the real safe format), so every
prediction is hand-computable:
  TTFT = 50 + 0.01 * input_tokens + 0.01 * prefill_tokens_in_flight   (ms)
  TPOT = 5 + 1 * running_requests                                      (ms)
"""

from __future__ import annotations

import numpy as np
import pytest

from routing.config import PickerConfig
from routing.picking.picker import MissingSloError, NoEndpointError, Picker, RouteRequest, dispatch_record
from routing.models import predictor as predictor_module
from routing.models.predictor import LatencyPredictor, ProfileEstimator
from tests.support.fixtures_routing import fleet, h200_profile, occupy, picker


def req(rid="r", *, input_tokens=1000, ttft=None, tpot=None, critical=False, **kw) -> RouteRequest:
    return RouteRequest(request_id=rid, input_tokens=input_tokens, ttft_ms=ttft, itl_ms=tpot,
                        critical=critical, **kw)


@pytest.mark.parametrize("running_tokens, running_slo_ms, new_slo_ms, expected_headroom_ms", [
    pytest.param(None, None, 100.0, 40.0, id="idle: 100 - (50 + 10) = 40"),
    pytest.param(2000, 100.0, 200.0, 20.0, id="strictest is the running one: 100 - (50+10+20) = 20"),
    pytest.param(2000, 300.0, 200.0, 120.0, id="strictest is the new one: 200 - 80 = 120"),
])
def test_ttft_headroom_is_against_the_strictest_slo(running_tokens, running_slo_ms, new_slo_ms, expected_headroom_ms):
    reg = fleet(("p0", "prefill"), ("d0", "decode"))
    if running_tokens:
        occupy(reg, "p0", request_id="old", input_tokens=running_tokens, ttft_ms=running_slo_ms)
    result = picker().pick(req(ttft=new_slo_ms), reg, 1.0)
    assert result.routed and result.tier == "headroom"
    assert result.prefill.endpoint_id == "p0"
    assert result.prefill.headroom_ttft_ms == pytest.approx(expected_headroom_ms)


@pytest.mark.parametrize("running, running_tpot_slo_ms, new_tpot_slo_ms, expected", [
    pytest.param(3, np.inf, 10.0, 2.0, id="10 - (5 + 3 running) = 2"),
    pytest.param(3, 9.0, 20.0, 1.0, id="running SLO 9 is stricter: 9 - 8 = 1"),
    pytest.param(3, 7.0, 20.0, None, id="running SLO 7 < predicted 8: no headroom -> shed"),
])
def test_tpot_headroom_on_decode(running, running_tpot_slo_ms, new_tpot_slo_ms, expected):
    reg = fleet(("p0", "prefill"), ("d0", "decode"))
    for k in range(running):
        occupy(reg, "d0", request_id=f"old{k}", itl_ms=running_tpot_slo_ms)
    result = picker().pick(req(tpot=new_tpot_slo_ms), reg, 1.0)
    if expected is None:
        assert result.outcome == "shed" and result.decode is None
        assert "d0" in result.reason and "ITL headroom -1.00 ms" in result.reason
    else:
        assert result.routed
        assert result.decode.predicted_tpot_ms == pytest.approx(8.0)
        assert result.decode.headroom_tpot_ms == pytest.approx(expected)


@pytest.mark.parametrize("strategy, favoured, expected_share", [
    # p0: TTFT 60 -> headroom 140 (rel 0.7); p1: tif 10000 -> TTFT 160, headroom 40 (rel 0.2).
    # Prefill has no TPOT, so blended = 0.5*rel + 0.5; min-max normalised: p0 1, p1 0.
    # least: weights p0 0+0.05, p1 1+0.05 -> P(p1) = 1.05/1.10 = 0.9545
    pytest.param("least", "p1", 1.05 / 1.10, id="least: just-enough headroom, P(p1)=1.05/1.1"),
    pytest.param("most", "p0", 1.05 / 1.10, id="most: spread, P(p0)=1.05/1.1"),
])
def test_strategy_weights_the_random_pick(strategy, favoured, expected_share):
    reg = fleet(("p0", "prefill"), ("p1", "prefill"), ("d0", "decode"))
    occupy(reg, "p1", request_id="old", input_tokens=10_000)
    pk = picker({"slo": {"strategy": strategy, "exploration_frac": 0.0, "weight_floor": 0.05}}, seed=7)
    n = 2000
    picks = [pk.pick(req(ttft=200.0), reg, 1.0).prefill.endpoint_id for _ in range(n)]
    share = picks.count(favoured) / n
    # binomial sd = sqrt(0.9545*0.0455/2000) = 0.0047
    assert share == pytest.approx(expected_share, abs=0.02)


def test_exploration_is_uniform_and_spares_critical_requests():
    reg = fleet(("p0", "prefill"), ("p1", "prefill"), ("p2", "prefill"), ("d0", "decode"))
    occupy(reg, "p1", request_id="a", input_tokens=10_000)
    occupy(reg, "p2", request_id="b", input_tokens=30_000)  # TTFT 360 > 200: no headroom
    pk = picker({"slo": {"exploration_frac": 1.0}}, seed=3)
    results = [pk.pick(req(ttft=200.0), reg, 1.0) for _ in range(900)]
    assert {r.tier for r in results} == {"explore"}
    counts = {e: sum(r.prefill.endpoint_id == e for r in results) for e in ("p0", "p1", "p2")}
    assert all(abs(c / 900 - 1 / 3) < 0.06 for c in counts.values()), counts
    critical = [pk.pick(req(ttft=200.0, critical=True), reg, 1.0) for _ in range(50)]
    assert all(r.tier == "headroom" and r.prefill.endpoint_id in ("p0", "p1") for r in critical)


def test_no_headroom_sheds_non_critical_with_reason():
    reg = fleet(("p0", "prefill"), ("p1", "prefill"), ("d0", "decode"))
    occupy(reg, "p0", request_id="a", input_tokens=5000)  # TTFT 50+10+50 = 110
    occupy(reg, "p1", request_id="b", input_tokens=9000)  # TTFT 150
    result = picker().pick(req(ttft=100.0), reg, 1.0)
    assert result.outcome == "shed" and result.tier == "shed"
    assert result.prefill is None and result.decode is None
    assert "no endpoint with headroom among 2" in result.reason
    assert "p0: TTFT headroom -10.0 ms" in result.reason  # 100 - 110


def test_critical_request_takes_least_negative_headroom():
    reg = fleet(("p0", "prefill"), ("p1", "prefill"), ("d0", "decode"))
    occupy(reg, "p0", request_id="a", input_tokens=5000)  # headroom 100-110 = -10
    occupy(reg, "p1", request_id="b", input_tokens=9000)  # headroom 100-150 = -50
    for seed in range(5):
        result = picker(seed=seed).pick(req(ttft=100.0, critical=True), reg, 1.0)
        assert result.routed and result.tier == "critical_negative"
        assert result.prefill.endpoint_id == "p0"
        assert result.prefill.headroom_ttft_ms == pytest.approx(-10.0)


def test_idle_endpoint_is_valid_even_with_negative_headroom():
    # input 20000: TTFT = 50 + 200 = 250 > 200 even when idle; p1 is busy (260).
    reg = fleet(("p0", "prefill"), ("p1", "prefill"), ("d0", "decode"))
    occupy(reg, "p1", request_id="b", input_tokens=1000)
    result = picker().pick(req(input_tokens=20_000, ttft=200.0), reg, 1.0)
    assert result.routed and result.tier == "idle"
    assert result.prefill.endpoint_id == "p0"
    assert result.prefill.headroom_ttft_ms == pytest.approx(-50.0)


def test_missing_slo_is_an_error_when_slo_routing_is_on():
    reg = fleet(("p0", "prefill"), ("d0", "decode"))
    with pytest.raises(MissingSloError, match="slo: SLO routing is on"):
        picker().pick(req(), reg, 1.0)


def test_slo_routing_off_takes_lowest_predicted_latency():
    reg = fleet(("p0", "prefill"), ("p1", "prefill"), ("d0", "decode"), ("d1", "decode"))
    occupy(reg, "p0", request_id="a", input_tokens=3000)  # TTFT 90 vs p1 60
    occupy(reg, "d1", request_id="b")  # TPOT 6 vs d0 5
    result = picker({"slo": {"enabled": False, "exploration_frac": 0.0}}).pick(req(), reg, 1.0)
    assert result.tier == "lowest_latency"
    assert (result.prefill.endpoint_id, result.decode.endpoint_id) == ("p1", "d0")


def test_aggregated_fleet_checks_both_slos_on_one_endpoint():
    reg = fleet(("a0", "aggregated"), ("a1", "aggregated"))
    for k in range(6):
        occupy(reg, "a0", request_id=f"x{k}")  # TPOT 5 + 6 = 11 > 10; a0 also holds prefill work
    result = picker().pick(req(ttft=500.0, tpot=10.0), reg, 1.0)
    assert result.mode == "aggregated" and result.prefill is None
    assert result.decode.endpoint_id == "a1"
    assert result.decode.predicted_ttft_ms == pytest.approx(60.0)  # 50 + 10
    assert result.decode.predicted_tpot_ms == pytest.approx(5.0)


def test_no_endpoints_is_a_clear_error():
    with pytest.raises(NoEndpointError, match="no decode endpoint"):
        picker().pick(req(ttft=100.0), fleet(("p0", "prefill")), 1.0)
    with pytest.raises(NoEndpointError, match="no prefill/decode or aggregated endpoint"):
        picker().pick(req(ttft=100.0), fleet(), 1.0)


def _sequence(seed: int) -> list[tuple[str, str]]:
    reg = fleet(*[(f"p{i}", "prefill") for i in range(5)], *[(f"d{i}", "decode") for i in range(5)])
    pk = picker({"slo": {"exploration_frac": 0.1}}, seed=seed)
    out = []
    for k in range(200):
        r = req(f"r{k}", input_tokens=500 + 37 * k % 3000, ttft=300.0, tpot=20.0)
        result = pk.pick(r, reg, float(k))
        if result.routed:
            reg.dispatched(dispatch_record(r, result, now_s=float(k)))
            out.append((result.prefill.endpoint_id, result.decode.endpoint_id))
        if k >= 20:
            done = f"r{k - 20}"
            if reg.in_flight(done):
                reg.completed(done, now_s=float(k), output_tokens=10)
    return out


def test_seeded_picks_are_reproducible():
    assert _sequence(11) == _sequence(11)
    assert _sequence(11) != _sequence(12)


def test_dispatch_record_carries_predictions_and_features():
    reg = fleet(("p0", "prefill"), ("d0", "decode"))
    r = req(ttft=200.0, tpot=20.0, prefix_cache_hit_frac=0.25)
    result = picker().pick(r, reg, 3.0)
    record = dispatch_record(r, result, now_s=3.0)
    assert record.prefill_id == "p0" and record.decode_id == "d0"
    assert record.uncached_tokens == pytest.approx(750.0)  # 1000 * (1 - 0.25)
    assert record.predicted_ttft_ms == pytest.approx(60.0)
    assert record.predicted_tpot_ms == pytest.approx(5.0)
    assert record.ttft_features["role"] == "prefill" and record.tpot_features["role"] == "decode"
    assert record.model_version == "lin-1"
    reg.dispatched(record)
    assert reg.load_of("p0", now_s=3.0)["prefill_tokens_in_flight"] == pytest.approx(750.0)
    assert reg.load_of("d0", now_s=3.0)["strictest_itl_ms"] == pytest.approx(20.0)


# -- robustness to estimate error: margin, strategy max, thin headroom -----------------------

@pytest.mark.parametrize("margin_frac, expected_tier, expected_shares", [
    # p0: TTFT 60 -> headroom 140 of 200 (70%); p1: tif 12000 -> TTFT 180, headroom 20 (10%).
    # margin 0: both valid, `least` favours p1 with P = 1.05/1.10 (see the strategy test).
    pytest.param(0.0, "headroom", {"p1": 1.05 / 1.10}, id="margin 0: p1's 20 ms counts, P(p1)=0.95"),
    # margin 0.15 needs 30 ms: p1's 20 ms is within the estimate's error, only p0 is valid.
    pytest.param(0.15, "headroom", {"p0": 1.0}, id="margin 0.15: 20 < 0.15*200=30, always p0"),
    # margin 0.75 needs 150 ms: neither; both predicted to meet it -> thin tier, the most headroom.
    pytest.param(0.75, "thin_headroom", {"p0": 1.0}, id="margin 0.75: 140 < 150, thin tier, p0"),
])
def test_headroom_margin_discounts_thin_headroom(margin_frac, expected_tier, expected_shares):
    reg = fleet(("p0", "prefill"), ("p1", "prefill"), ("d0", "decode"))
    occupy(reg, "p1", request_id="old", input_tokens=12_000)
    pk = picker({"slo": {"strategy": "least", "exploration_frac": 0.0, "headroom_margin_frac": margin_frac}}, seed=5)
    results = [pk.pick(req(ttft=200.0), reg, 1.0) for _ in range(1000)]
    assert {r.tier for r in results} == {expected_tier} and all(r.routed for r in results)
    for eid, share in expected_shares.items():
        # binomial sd = sqrt(0.95*0.05/1000) = 0.007
        assert sum(r.prefill.endpoint_id == eid for r in results) / 1000 == pytest.approx(share, abs=0.025)


def test_margin_never_sheds_a_request_predicted_to_meet_its_slo():
    # Both busy, headroom 20 and 10 ms of 200: inside a 0.5 margin, yet positive:
    # a non-critical request is routed (thin tier), not shed; shedding needs negative headroom.
    reg = fleet(("p0", "prefill"), ("p1", "prefill"), ("d0", "decode"))
    occupy(reg, "p0", request_id="a", input_tokens=12_000)  # 50 + 10 + 120 = 180
    occupy(reg, "p1", request_id="b", input_tokens=13_000)  # 190
    pk = picker({"slo": {"headroom_margin_frac": 0.5, "exploration_frac": 0.0}})
    result = pk.pick(req(ttft=200.0), reg, 1.0)
    assert result.routed and result.tier == "thin_headroom" and result.prefill.endpoint_id == "p0"
    occupy(reg, "p0", request_id="c", input_tokens=3_000)  # 180 + 30 = 210
    occupy(reg, "p1", request_id="d", input_tokens=2_000)  # 190 + 20 = 210: both -10 now
    shed = pk.pick(req(ttft=200.0), reg, 1.0)
    assert shed.outcome == "shed" and "TTFT headroom -10.0 ms" in shed.reason


@pytest.mark.parametrize("tif_p1, expected", [
    pytest.param(10_000, {"p0"}, id="p0 headroom 140 > p1 40: always p0"),
    pytest.param(0, {"p0", "p1"}, id="equal headroom 140: ties at random, both used"),
])
def test_strategy_max_takes_the_most_headroom(tif_p1, expected):
    reg = fleet(("p0", "prefill"), ("p1", "prefill"), ("d0", "decode"))
    if tif_p1:
        occupy(reg, "p1", request_id="old", input_tokens=tif_p1)
    pk = picker({"slo": {"strategy": "max", "exploration_frac": 0.0}}, seed=2)
    assert {pk.pick(req(ttft=200.0), reg, 1.0).prefill.endpoint_id for _ in range(200)} == expected


def test_decode_choice_follows_tpot_when_the_ttft_budget_is_spent_everywhere():
    # The prefill pick used up the TTFT budget (prefill_ttft_ms 250 > SLO 200), the same on
    # every decode endpoint: a critical request then goes to the decode endpoint with the
    # most ITL headroom (d1: 10 - 5 = 5 vs d0: 10 - 8 = 2), never by chance.
    reg = fleet(("p0", "prefill"), ("d0", "decode"), ("d1", "decode"))
    for k in range(3):
        occupy(reg, "d0", request_id=f"x{k}")
    pk = picker({"slo": {"exploration_frac": 0.0}}, seed=9)
    picks = {pk.pick_decode(req(ttft=200.0, tpot=10.0, critical=True), reg, 1.0, prefill_id="p0",
                            prefill_ttft_ms=250.0).decode.endpoint_id for _ in range(50)}
    assert picks == {"d1"}


# -- the profile-derived estimate ------------------------------------------------------------

@pytest.fixture(scope="module")
def estimate_picker():
    return Picker(PickerConfig(), LatencyPredictor(estimate=ProfileEstimator(h200_profile())), rng=0)


def _estimate_ttft(pk, *, input_tokens: int, ahead: tuple = (), waiting_by_metrics: float = 0.0) -> float:
    """Predicted TTFT on p0 at now 1.0 s; ahead: (prompt tokens, dispatched at s) already sent there."""
    reg = fleet(("p0", "prefill"), ("d0", "decode"))
    for k, (tokens, at_s) in enumerate(ahead):
        occupy(reg, "p0", request_id=f"ahead{k}", input_tokens=tokens, now_s=at_s)
    if waiting_by_metrics:
        reg.observe_metrics("p0", now_s=1.0, kv_usage_frac=0.0, waiting_requests=waiting_by_metrics,
                            running_requests=0.0)
    result = pk.pick_prefill(req(input_tokens=input_tokens, ttft=10_000.0), reg, 1.0)
    assert result.model_version is None  # the profile estimate served it
    return result.prefill.predicted_ttft_ms


def test_the_estimate_reads_the_running_batch():
    assert predictor_module._BATCH_PROGRESS, "the router's features lost prefill_batch_*: revisit the TTFT estimate"


# P(n) = the profile's TTFT at n prompt tokens: P(1000) = 37.07, P(2000) = 48.44 (not used),
# P(3000) = 60.87 ms (H200_TP1P_TP1D). The request is 1000 tokens, routed at 1.0 s.
@pytest.mark.parametrize("ahead, waiting, expected", [
    pytest.param((), 0.0, lambda P: P(1000), id="idle: P(1000)"),
    pytest.param(((3000, 1.0),), 0.0, lambda P: P(3000) + P(1000),
                 id="3000 just started: all of P(3000), then P(1000)"),
    pytest.param(((3000, 0.97),), 0.0, lambda P: P(3000) - 30 + P(1000),
                 id="3000 started 30 ms ago: P(3000) - 30 left, then P(1000)"),
    pytest.param(((3000, 0.99), (2000, 0.995)), 0.0, lambda P: P(3000) - 10 + P(2000 + 1000),
                 id="2000 queued behind the batch: batched with the request, P(3000) - 10 + P(3000)"),
    pytest.param(((3000, 0.0),), 0.0, lambda P: P(1000),
                 id="batch overdue (1000 ms > P(3000)): nothing left of it, P(1000)"),
    pytest.param((), 2.0, lambda P: P(3000),
                 id="no lifecycle counts, 2 waiting by metrics: 2x1000 + 1000 as one batch, P(3000)"),
])
def test_estimate_follows_the_running_batch_and_the_queue(estimate_picker, ahead, waiting, expected):
    profile = h200_profile()
    expected_ms = expected(lambda n: float(profile.prefill.ttft_ms_at(n)))
    got = _estimate_ttft(estimate_picker, input_tokens=1000, ahead=ahead, waiting_by_metrics=waiting)
    assert got == pytest.approx(expected_ms, rel=0.01)  # 256-point table vs the profile's own curve


def test_estimate_grows_linearly_beyond_the_longest_profiled_prompt(estimate_picker):
    hi = int(h200_profile().prefill.isl_range_tokens[1])  # 16372 tokens, over the 8192 budget
    at_hi = _estimate_ttft(estimate_picker, input_tokens=hi)
    # A prompt over the budget runs alone: 3x the longest profiled prompt takes 3x as long (the
    # throughput measured there), not the clamped TTFT at the longest.
    assert _estimate_ttft(estimate_picker, input_tokens=3 * hi) == pytest.approx(3 * at_hi, rel=1e-6)
    # Without a budget, the work ahead counts as one prompt: behind a batch of 2x that just started, 3x.
    blind = Picker(PickerConfig(), LatencyPredictor(estimate=ProfileEstimator(h200_profile(), prefill_token_budget=None)),
                   rng=0)
    assert _estimate_ttft(blind, input_tokens=hi, ahead=((2 * hi, 1.0),)) == pytest.approx(3 * at_hi, rel=1e-6)


# B = P(8192) = 169.86 ms, the time of one full batch of the budget; P(n) as above. Prompts averaging
# more than the budget (prefill_tokens_in_flight / waiting requests) run one at a time.
@pytest.mark.parametrize("ahead, input_tokens, expected", [
    pytest.param(((3000, 1.0),) * 4, 1000, lambda P: P(3000) + P(8192) + P(1808),
                 id="four 3000s, the first running: P(3000), then 9000 + 1000 in a full batch and P(1808)"),
    pytest.param(((3000, 1.0),) * 12, 1000, lambda P: P(3000) + 4 * P(8192) + P(1232),
                 id="twelve 3000s: P(3000), then 34000 in four full batches and P(1232)"),
    pytest.param(((20000, 1.0), (20000, 1.005)), 1000, lambda P: 2 * 20000 * P(16372) / 16372 + P(1000),
                 id="two 20000s, over the budget: each alone (linear beyond the profiled 16372), then P(1000)"),
    pytest.param(((3000, 1.0), (4000, 1.005)), 10000, lambda P: P(3000) + P(4000) + P(10000),
                 id="a 10000 prompt, over the budget, after a queued 4000: P(3000) + P(4000) + P(10000)"),
])
def test_estimate_drains_queued_work_in_batches_of_the_budget(estimate_picker, ahead, input_tokens, expected):
    assert estimate_picker.predictor.estimate.prefill_token_budget == 8192
    profile = h200_profile()
    expected_ms = expected(lambda n: float(profile.prefill.ttft_ms_at(n)))
    got = _estimate_ttft(estimate_picker, input_tokens=input_tokens, ahead=ahead)
    assert got == pytest.approx(expected_ms, rel=0.01)


def test_estimate_name_carries_the_budget():
    assert ProfileEstimator(h200_profile()).name == "H200_TP1P_TP1D;budget=8192"
    assert ProfileEstimator(h200_profile(), prefill_token_budget=2048).name == "H200_TP1P_TP1D;budget=2048"
    assert ProfileEstimator(h200_profile(), prefill_token_budget=None).name == "H200_TP1P_TP1D"
    with pytest.raises(ValueError, match="prefill_token_budget must be >= 1"):
        ProfileEstimator(h200_profile(), prefill_token_budget=0)


def test_topology_candidates_follow_registry_changes_between_picks():
    # The picker keeps each registry state's same-domain candidate sets; every
    # register/deregister must be seen by the next pick on the same picker.
    from routing.picking.picker import TopologyError
    from routing.fleet.registry import Endpoint

    qos = {lvl: {"latency_ms": ms, "bandwidth_gbyte_per_s": 10.0} for lvl, ms in (("none", 5.0), ("zone", 1.0))}
    pk = picker({"topology": {"level": "zone", "policy": "fail", "levels": ["zone"], "qos": qos},
                 "slo": {"exploration_frac": 0.0}})
    reg = fleet(("p_a", "prefill", {"zone": "a"}), ("p_b", "prefill", {"zone": "b"}),
                ("d_a", "decode", {"zone": "a"}), levels=("zone",))
    first = pk.pick(req("r1", ttft=500.0, tpot=50.0), reg, 1.0)
    # Only zone a has a decode endpoint: p_b is not a candidate.
    assert (first.prefill.endpoint_id, first.decode.endpoint_id) == ("p_a", "d_a")
    # Shared zone: weight 1 * (1 ms + 0 KV bytes / bandwidth) = 1 ms (kv_bytes_per_token defaults to 0).
    assert first.decode.shared_level == "zone" and first.decode.transfer_cost_ms == pytest.approx(1.0)
    occupy(reg, "p_a", request_id="busy", input_tokens=20_000)  # TTFT 50 + 10 + 200 on p_a: p_b would win
    assert pk.pick(req("r2", ttft=500.0, tpot=50.0), reg, 1.0).prefill.endpoint_id == "p_a"
    reg.register(Endpoint(id="d_b", role="decode", domains={"zone": "b"}))
    second = pk.pick(req("r3", ttft=500.0, tpot=50.0), reg, 1.0)
    assert (second.prefill.endpoint_id, second.decode.endpoint_id) == ("p_b", "d_b")
    reg.register(Endpoint(id="d_b", role="decode", domains={"zone": "c"}))  # relabelled in place
    assert pk.pick(req("r4", ttft=500.0, tpot=50.0), reg, 1.0).prefill.endpoint_id == "p_a"
    reg.deregister("d_a")
    with pytest.raises(TopologyError, match="no prefill endpoint shares a zone domain"):
        pk.pick(req("r5", ttft=500.0, tpot=50.0), reg, 1.0)
    with pytest.raises(TopologyError, match="no decode endpoint in zone 'a' of prefill p_a"):
        pk.pick_decode(req("r6", ttft=500.0, tpot=50.0), reg, 1.0, prefill_id="p_a")


def test_deprecated_slo_keywords_are_still_accepted():
    """ttft_slo_ms / tpot_slo_ms are the old spellings of ttft_ms / itl_ms (accepted for one release)."""
    old = RouteRequest(request_id="r", input_tokens=100, ttft_slo_ms=300.0, tpot_slo_ms=25.0)
    assert old == RouteRequest(request_id="r", input_tokens=100, ttft_ms=300.0, itl_ms=25.0)
