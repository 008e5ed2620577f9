"""Endpoint registry: lifecycle load accounting, metrics freshness, SLO tracking, samples."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from routing.features import RAW_FIELDS, feature_matrix, features_from_samples
from routing.picking.picker import RouteRequest, dispatch_record
from routing.fleet.requests import InFlight
from routing.fleet.registry import Endpoint
from routing.fleet.errors import (
    DuplicateRequestError,
    RegistryError,
    UnknownEndpointError,
    UnknownRequestError,
)
from tests.support.fixtures_routing import fleet, occupy, picker


def inflight(rid, *, prefill=None, decode=None, input_tokens=1000, hit=0.0, ttft=np.inf, tpot=np.inf, t=0.0):
    return InFlight(request_id=rid, prefill_id=prefill, decode_id=decode, input_tokens=input_tokens,
                    uncached_tokens=input_tokens * (1 - hit), ttft_ms=ttft, itl_ms=tpot,
                    critical=False, dispatched_s=t)


def load(reg, eid, t=0.0):
    return reg.load_of(eid, now_s=t)


def test_aggregated_request_lifecycle_accounting():
    reg = fleet(("a0", "aggregated"))
    reg.dispatched(inflight("r", decode="a0", input_tokens=1000, hit=0.5))
    l0 = load(reg, "a0")
    # prefill work = 1000 * (1 - 0.5) = 500; context held = 1000; kv = 1000 / 100000
    assert (l0["prefill_tokens_in_flight"], l0["decode_tokens_in_flight"]) == (500, 1000)
    assert (l0["waiting_requests"], l0["running_requests"], l0["kv_usage_frac"]) == (1, 1, 0.01)
    reg.first_token("r", now_s=0.1)
    l1 = load(reg, "a0")
    assert (l1["prefill_tokens_in_flight"], l1["waiting_requests"], l1["running_requests"]) == (0, 0, 1)
    reg.progress("r", now_s=0.2, tokens_generated=10)
    assert load(reg, "a0")["decode_tokens_in_flight"] == 1010
    reg.completed("r", now_s=0.3, output_tokens=11)
    l3 = load(reg, "a0")
    assert (l3["decode_tokens_in_flight"], l3["running_requests"], l3["requests_in_flight"]) == (0, 0, 0)


def test_disaggregated_request_releases_prefill_at_first_token():
    reg = fleet(("p0", "prefill"), ("d0", "decode"))
    reg.dispatched(inflight("r", prefill="p0", decode="d0", input_tokens=2000))
    assert load(reg, "p0")["prefill_tokens_in_flight"] == 2000 and load(reg, "p0")["running_requests"] == 1
    assert load(reg, "d0")["decode_tokens_in_flight"] == 2000 and load(reg, "d0")["waiting_requests"] == 1
    reg.first_token("r", now_s=1.0)
    assert load(reg, "p0")["running_requests"] == 0 and load(reg, "p0")["prefill_tokens_in_flight"] == 0
    assert load(reg, "d0")["waiting_requests"] == 0 and load(reg, "d0")["running_requests"] == 1
    reg.completed("r", now_s=2.0, output_tokens=5)
    assert load(reg, "d0")["running_requests"] == 0


def test_completion_without_first_token_releases_everything_once():
    reg = fleet(("p0", "prefill"), ("d0", "decode"))
    reg.dispatched(inflight("r", prefill="p0", decode="d0"))
    reg.completed("r", now_s=1.0, output_tokens=0)
    for eid in ("p0", "d0"):
        l = load(reg, eid)
        assert (l["waiting_requests"], l["running_requests"], l["prefill_tokens_in_flight"],
                l["decode_tokens_in_flight"]) == (0, 0, 0, 0)


@pytest.mark.parametrize("age_s, expected_kv, expected_running", [
    pytest.param(5.0, 0.7, 12, id="metrics 5 s old (< 10 s max age): scraped values"),
    pytest.param(11.0, 0.01, 1, id="metrics 11 s old: lifecycle 1000/100000 = 0.01, 1 running"),
])
def test_fresh_metrics_take_precedence(age_s, expected_kv, expected_running):
    reg = fleet(("d0", "decode"))
    occupy(reg, "d0", request_id="r", input_tokens=1000)
    reg.observe_metrics("d0", now_s=100.0, kv_usage_frac=0.7, waiting_requests=3, running_requests=12)
    l = load(reg, "d0", t=100.0 + age_s)
    assert (l["kv_usage_frac"], l["running_requests"]) == (pytest.approx(expected_kv), expected_running)


def test_strictest_slo_tracks_requests_in_flight():
    reg = fleet(("p0", "prefill"), ("d0", "decode"))
    for rid, ttft, tpot in (("a", 300, 30), ("b", 100, 10), ("c", 200, 20)):
        reg.dispatched(inflight(rid, prefill="p0", decode="d0", ttft=ttft, tpot=tpot))
    assert load(reg, "p0")["strictest_ttft_ms"] == 100 and load(reg, "d0")["strictest_itl_ms"] == 10
    reg.first_token("b", now_s=1)  # b leaves the prefill endpoint, still decodes
    assert load(reg, "p0")["strictest_ttft_ms"] == 200 and load(reg, "d0")["strictest_itl_ms"] == 10
    reg.completed("b", now_s=2, output_tokens=3)
    assert load(reg, "d0")["strictest_itl_ms"] == 20
    # the deprecated names still carry the same values for a release
    assert load(reg, "d0")["strictest_tpot_slo_ms"] == 20 and load(reg, "p0")["strictest_ttft_slo_ms"] == 200
    for rid in ("a", "c"):
        reg.completed(rid, now_s=3, output_tokens=3)
    assert load(reg, "p0")["strictest_ttft_ms"] is None and load(reg, "d0")["strictest_itl_ms"] is None


def test_samples_hold_dispatch_features_and_observed_latency():
    reg = fleet(("p0", "prefill"), ("d0", "decode"))
    occupy(reg, "p0", request_id="other", input_tokens=3000)
    pk = picker()
    r = RouteRequest(request_id="r", input_tokens=1000, ttft_ms=500, itl_ms=50)
    result = pk.pick(r, reg, 10.0)
    reg.dispatched(dispatch_record(r, result, now_s=10.0))
    (ttft,) = reg.first_token("r", now_s=10.25)
    (tpot,) = reg.completed("r", now_s=11.25, output_tokens=101)
    # TTFT = (10.25 - 10.0) s = 250 ms; TPOT = (11.25 - 10.25) s / 100 tokens = 10 ms
    assert (ttft.target, ttft.endpoint_id, ttft.observed_ms) == ("ttft", "p0", pytest.approx(250.0))
    assert (tpot.target, tpot.endpoint_id, tpot.observed_ms) == ("tpot", "d0", pytest.approx(10.0))
    assert ttft.features["prefill_tokens_in_flight"] == 3000  # the other request, not this one
    assert ttft.predicted_ms == pytest.approx(50 + 10 + 30) and ttft.model_version == "lin-1"
    # The retrain flow's matrix from stored samples equals the row the picker predicted on.
    row = features_from_samples("ttft", [{**ttft.features, "role": ttft.role}])
    served = result.prefill.features
    expected = feature_matrix("ttft", role=served["role"], **{k: v for k, v in served.items() if k != "role"})
    np.testing.assert_array_equal(row, expected)


def test_observed_values_from_the_caller_win():
    reg = fleet(("a0", "aggregated"))
    reg.dispatched(InFlight(request_id="r", prefill_id=None, decode_id="a0", input_tokens=10, uncached_tokens=10,
                            ttft_ms=np.inf, itl_ms=np.inf, critical=False, dispatched_s=0.0,
                            ttft_features=reg.raw_features(0, input_tokens=10, prefix_cache_hit_frac=0, now_s=0),
                            tpot_features=reg.raw_features(0, input_tokens=10, prefix_cache_hit_frac=0, now_s=0)))
    samples = reg.completed("r", now_s=9.0, output_tokens=20, observed_ttft_ms=42.0, observed_tpot_ms=7.0)
    assert [(s.target, s.observed_ms) for s in samples] == [("ttft", 42.0), ("tpot", 7.0)]


def test_progress_sample_excludes_the_request_itself():
    reg = fleet(("d0", "decode"))
    occupy(reg, "d0", request_id="other", input_tokens=4000)
    occupy(reg, "d0", request_id="r", input_tokens=1000)
    (s,) = reg.progress("r", now_s=1.0, tokens_generated=50, observed_tpot_ms=6.0)
    # context held by others = 4000; running others = 1; kv = 4000 / 100000
    assert s.features["decode_tokens_in_flight"] == 4000
    assert s.features["running_requests"] == 1
    assert s.features["kv_usage_frac"] == pytest.approx(0.04)
    assert s.features["tokens_generated"] == 50 and s.observed_ms == 6.0


def test_expire_drops_requests_that_never_complete():
    reg = fleet(("d0", "decode"))
    occupy(reg, "d0", request_id="old", now_s=0.0)
    occupy(reg, "d0", request_id="new", now_s=500.0)
    assert reg.expire(now_s=1000.0, ttl_s=900.0) == ["old"]
    assert load(reg, "d0", 1000.0)["requests_in_flight"] == 1


def test_deregister_detaches_requests():
    reg = fleet(("p0", "prefill"), ("d0", "decode"))
    reg.dispatched(inflight("r", prefill="p0", decode="d0"))
    assert reg.deregister("p0") == 1
    reg.first_token("r", now_s=1.0)  # still tracked on d0
    assert load(reg, "d0")["waiting_requests"] == 0 and load(reg, "d0")["prefill_tokens_in_flight"] == 0
    reg.completed("r", now_s=2.0, output_tokens=2)
    assert reg.in_flight_count() == 0


def _with_samples(req: InFlight) -> InFlight:
    feats = lambda role: {k: 0.0 for k in RAW_FIELDS} | {"role": role}  # noqa: E731
    return replace(req, ttft_features=feats("prefill"), tpot_features=feats("decode"))


def test_drain_keeps_counting_until_the_last_request_then_removes():
    reg = fleet(("p0", "prefill"), ("p1", "prefill"), ("d0", "decode"), ("d1", "decode"))
    reg.dispatched(_with_samples(inflight("r1", prefill="p0", decode="d0", t=0.0)))
    reg.dispatched(_with_samples(inflight("r2", prefill="p1", decode="d0", t=0.0)))
    assert reg.drain("d0") == 2 and reg.drain("p0") == 1
    # Not picked any more, still counted and listed.
    assert reg.endpoint_ids(reg.candidates("decode")) == ["d1"]
    assert reg.endpoint_ids(reg.candidates("prefill")) == ["p1"]
    assert "d0" in reg and reg.is_draining("d0") and load(reg, "d0")["requests_in_flight"] == 2
    # r1's prefill returns: p0 has nothing left and goes; its TTFT sample is still made.
    ttft = reg.first_token("r1", now_s=0.1)
    assert [s.endpoint_id for s in ttft] == ["p0"] and "p0" not in reg
    reg.first_token("r2", now_s=0.1)
    tpot = reg.completed("r1", now_s=1.1, output_tokens=11)
    assert [(s.target, s.endpoint_id) for s in tpot] == [("tpot", "d0")] and tpot[0].observed_ms == pytest.approx(100)
    assert "d0" in reg and load(reg, "d0")["requests_in_flight"] == 1
    assert reg.completed("r2", now_s=2.1, output_tokens=2) and "d0" not in reg
    assert reg.in_flight_count() == 0 and len(reg) == 2


def test_drain_of_an_idle_endpoint_removes_it_and_registering_again_undoes_a_drain():
    reg = fleet(("d0", "decode"), ("d1", "decode"))
    assert reg.drain("d1") == 0 and "d1" not in reg
    occupy(reg, "d0", request_id="r", now_s=0.0)
    assert reg.drain("d0") == 1 and reg.candidates("decode").size == 0
    reg.register(Endpoint(id="d0", role="decode"))  # back before it emptied: picked again, load kept
    assert not reg.is_draining("d0") and reg.endpoint_ids(reg.candidates("decode")) == ["d0"]
    reg.completed("r", now_s=1.0, output_tokens=1)
    assert "d0" in reg and load(reg, "d0")["requests_in_flight"] == 0
    with pytest.raises(UnknownEndpointError):
        reg.drain("zz")


def test_expiry_completes_a_drain_whose_last_completion_never_comes():
    reg = fleet(("d0", "decode"))
    occupy(reg, "d0", request_id="lost", now_s=0.0)
    assert reg.drain("d0") == 1
    assert reg.expire(now_s=1000.0, ttl_s=900.0) == ["lost"] and "d0" not in reg


def test_registry_errors_name_the_problem():
    reg = fleet(("p0", "prefill"), ("d0", "decode"))
    with pytest.raises(RegistryError, match="role must be one of"):
        reg.register(Endpoint(id="x", role="router"))
    with pytest.raises(RegistryError, match=r"unknown levels \['region'\]"):
        reg.register(Endpoint(id="x", role="decode", domains={"region": "eu"}))
    with pytest.raises(UnknownEndpointError, match="unknown endpoint 'zz'"):
        reg.observe_metrics("zz", now_s=0, kv_usage_frac=0.1, waiting_requests=0, running_requests=0)
    with pytest.raises(RegistryError, match=r"kv_usage_frac must be finite and in \[0, 1.0\], got 1.5"):
        reg.observe_metrics("d0", now_s=0, kv_usage_frac=1.5, waiting_requests=0, running_requests=0)
    reg.dispatched(inflight("r", prefill="p0", decode="d0"))
    with pytest.raises(DuplicateRequestError, match="already in flight"):
        reg.dispatched(inflight("r", prefill="p0", decode="d0"))
    with pytest.raises(RegistryError, match="endpoint d0 has role decode, expected"):
        reg.dispatched(inflight("q", prefill="d0", decode="d0"))
    with pytest.raises(UnknownRequestError, match="unknown request 'nope'"):
        reg.first_token("nope", now_s=0)
    with pytest.raises(RegistryError, match="tokens_generated went back"):
        reg.progress("r", now_s=1, tokens_generated=5)
        reg.progress("r", now_s=2, tokens_generated=4)


def test_registry_grows_and_reuses_slots():
    reg = fleet(*[(f"e{i}", "decode") for i in range(40)])
    for i in range(0, 40, 2):
        reg.deregister(f"e{i}")
    reg.register(Endpoint(id="new", role="prefill"))
    assert len(reg) == 21
    assert reg.endpoint_ids(reg.candidates("prefill")) == ["new"]
    assert sorted(reg.endpoint_ids(reg.candidates("decode"))) == sorted(f"e{i}" for i in range(1, 40, 2))


def test_two_stage_dispatch_for_simulators():
    """pick_prefill -> dispatch to prefill; prefill done -> pick_decode -> assign_decode."""
    reg = fleet(("p0", "prefill", {"zone": "a"}), ("d0", "decode", {"zone": "a"}), ("d1", "decode", {"zone": "b"}))
    pk = picker({"topology": {"level": "zone"}})
    r = RouteRequest(request_id="r", input_tokens=2000, ttft_ms=500, itl_ms=50)
    first = pk.pick_prefill(r, reg, 0.0)
    assert first.routed and first.decode is None
    reg.dispatched(dispatch_record(r, first, now_s=0.0))
    assert load(reg, "p0")["prefill_tokens_in_flight"] == 2000
    second = pk.pick_decode(r, reg, 0.1, prefill_id="p0", prefill_ttft_ms=first.prefill.predicted_ttft_ms)
    assert second.decode.endpoint_id == "d0"  # same zone
    reg.assign_decode("r", "d0", tpot_features=second.decode.features,
                      predicted_tpot_ms=second.decode.predicted_tpot_ms)
    assert load(reg, "d0")["decode_tokens_in_flight"] == 2000 and load(reg, "d0")["waiting_requests"] == 1
    (ttft,) = reg.first_token("r", now_s=0.2)
    assert load(reg, "p0")["running_requests"] == 0 and load(reg, "d0")["waiting_requests"] == 0
    (tpot,) = reg.completed("r", now_s=1.2, output_tokens=101)
    assert (ttft.endpoint_id, tpot.endpoint_id, tpot.observed_ms) == ("p0", "d0", pytest.approx(10.0))
    with pytest.raises(RegistryError, match="expected decode"):
        reg.dispatched(inflight("q", prefill="p0"))
        reg.assign_decode("q", "p0")


def test_prefill_done_releases_prefill_and_picks_decode_then():
    """Dynamo's order: dispatch to prefill; prefill returns -> decode named; first token from decode."""
    reg = fleet(("p0", "prefill"), ("d0", "decode"), ("d1", "decode"))
    feats = dict.fromkeys(RAW_FIELDS, 0.0)
    a = replace(inflight("a", prefill="p0", input_tokens=1000, t=0.0), ttft_features=feats | {"role": "prefill"})
    reg.dispatched(a)
    reg.dispatched(inflight("b", prefill="p0", input_tokens=400, t=0.1))
    assert (load(reg, "p0")["prefill_tokens_in_flight"], load(reg, "p0")["waiting_requests"]) == (1400, 2)
    assert load(reg, "d0")["running_requests"] == 0  # no decode named yet
    # a's prefill returns at 0.5 s: it leaves p0's queue (b's batch starts), waits on d0 for KV + admission
    reg.prefill_done("a", now_s=0.5, decode_id="d0", tpot_features=feats | {"role": "decode"},
                    predicted_tpot_ms=9.0)
    assert (load(reg, "p0")["prefill_tokens_in_flight"], load(reg, "p0")["running_requests"]) == (400, 1)
    assert _batch(reg, "p0", 0.75) == (400, 250, 0)  # (0.75 - 0.5) s
    assert (load(reg, "d0")["waiting_requests"], load(reg, "d0")["running_requests"]) == (1, 1)
    assert load(reg, "d0")["decode_tokens_in_flight"] == 1000
    (ttft,) = reg.first_token("a", now_s=0.6)  # TTFT sample on p0's features at dispatch; p0 not released twice
    assert ttft.endpoint_id == "p0" and ttft.observed_ms == pytest.approx(600.0)
    assert load(reg, "p0")["prefill_tokens_in_flight"] == 400 and load(reg, "d0")["waiting_requests"] == 0
    (tpot,) = reg.completed("a", now_s=1.6, output_tokens=101)
    assert (tpot.endpoint_id, tpot.predicted_ms, tpot.observed_ms) == ("d0", 9.0, pytest.approx(10.0))
    assert load(reg, "d0")["running_requests"] == 0
    # b: prefill done without a decode pick (a one-token answer), then completion
    reg.prefill_done("b", now_s=0.9)
    assert load(reg, "p0")["requests_in_flight"] == 0 and load(reg, "p0")["prefill_tokens_in_flight"] == 0
    reg.completed("b", now_s=0.9, output_tokens=1, observed_ttft_ms=900.0)
    assert load(reg, "p0")["prefill_tokens_in_flight"] == 0 and reg.in_flight_count() == 0


def test_prefill_done_refusals_name_the_request():
    reg = fleet(("p0", "prefill"), ("d0", "decode"), ("a0", "aggregated"))
    reg.dispatched(inflight("agg", decode="a0"))
    with pytest.raises(RegistryError, match="'agg' is aggregated on a0"):
        reg.prefill_done("agg", now_s=1.0)
    reg.dispatched(inflight("both", prefill="p0", decode="d0"))
    with pytest.raises(RegistryError, match="already has decode endpoint d0"):
        reg.prefill_done("both", now_s=1.0, decode_id="d0")
    with pytest.raises(UnknownRequestError):
        reg.prefill_done("never", now_s=1.0)
    reg.prefill_done("both", now_s=1.0)  # decode named at dispatch: prefill_done only releases prefill
    assert load(reg, "p0")["running_requests"] == 0 and load(reg, "d0")["waiting_requests"] == 1


def _batch(reg, eid, t):
    v = load_features(reg, eid, t)
    return (v["prefill_batch_tokens"], v["prefill_batch_elapsed_ms"], v["prefill_queued_tokens"])


def load_features(reg, eid, t):
    return reg.raw_features(reg.slot_of(eid), input_tokens=1, prefix_cache_hit_frac=0.0, now_s=t)


def test_prefill_batch_progress_from_lifecycle_calls():
    reg = fleet(("p0", "prefill"), ("d0", "decode"))
    assert _batch(reg, "p0", 0.0) == (0, 0, 0)  # idle
    reg.dispatched(inflight("a", prefill="p0", decode="d0", input_tokens=1000, t=1.0))
    # idle endpoint: a starts at once -> batch 1000 tokens, started at 1.0 s
    assert _batch(reg, "p0", 1.25) == (1000, 250, 0)  # (1.25 - 1.0) s = 250 ms
    reg.dispatched(inflight("b", prefill="p0", decode="d0", input_tokens=400, hit=0.5, t=1.5))
    reg.dispatched(inflight("c", prefill="p0", decode="d0", input_tokens=300, t=1.6))
    # busy: b (400 * 0.5 = 200 uncached) and c (300) queue behind a's batch
    assert _batch(reg, "p0", 1.75) == (1000, 750, 500)
    reg.first_token("a", now_s=2.0)
    # a's first token ends its batch: the next starts at 2.0 s with all that waited, 200 + 300
    assert _batch(reg, "p0", 2.1) == (500, pytest.approx(100), 0)
    reg.dispatched(inflight("d", prefill="p0", decode="d0", input_tokens=50, t=2.2))
    assert _batch(reg, "p0", 2.2) == (500, pytest.approx(200), 50)
    reg.first_token("b", now_s=2.4)
    reg.first_token("c", now_s=2.4)
    # b and c released together: the batch restarts at 2.4 s with d alone
    assert _batch(reg, "p0", 2.5) == (50, pytest.approx(100), 0)
    reg.completed("d", now_s=3.0, output_tokens=1)  # completion without first token releases it too
    assert _batch(reg, "p0", 3.5) == (0, 0, 0)
    # decode endpoints never hold prefill work in disaggregated mode
    assert _batch(reg, "d0", 3.5) == (0, 0, 0)


def test_aggregated_endpoint_tracks_its_own_prefill_batch():
    reg = fleet(("a0", "aggregated"))
    reg.dispatched(inflight("r1", decode="a0", input_tokens=800, t=0.0))
    reg.dispatched(inflight("r2", decode="a0", input_tokens=200, t=0.1))
    assert _batch(reg, "a0", 0.2) == (800, pytest.approx(200), 200)
    reg.first_token("r1", now_s=0.3)
    assert _batch(reg, "a0", 0.3) == (200, 0, 0)


def test_dispatch_features_carry_the_batch_progress_into_the_ttft_sample():
    reg = fleet(("p0", "prefill"), ("d0", "decode"))
    reg.dispatched(inflight("a", prefill="p0", decode="d0", input_tokens=1000, t=0.0))
    feats = load_features(reg, "p0", 0.4)  # what the router computes when routing b at 0.4 s
    reg.dispatched(InFlight(request_id="b", prefill_id="p0", decode_id="d0", input_tokens=100, uncached_tokens=100,
                            ttft_ms=np.inf, itl_ms=np.inf, critical=False, dispatched_s=0.4,
                            ttft_features=feats, tpot_features=load_features(reg, "d0", 0.4)))
    reg.first_token("a", now_s=0.5)
    (s,) = reg.first_token("b", now_s=0.6)
    assert (s.features["prefill_batch_tokens"], s.features["prefill_batch_elapsed_ms"]) == (1000, pytest.approx(400))
    assert s.observed_ms == pytest.approx(200)  # (0.6 - 0.4) s


def _busy_fleet(seed: int):
    """A mixed fleet with requests in flight at several stages and fresh metrics on a few endpoints."""
    rng = np.random.default_rng(seed)
    specs = [(f"p{i}", "prefill") for i in range(6)] + [(f"d{i}", "decode") for i in range(6)] + \
        [(f"a{i}", "aggregated") for i in range(4)]
    reg = fleet(*specs)
    t = 0.0
    for k in range(60):
        t += 0.01
        p, d, a = f"p{rng.integers(6)}", f"d{rng.integers(6)}", f"a{rng.integers(4)}"
        agg = k % 3 == 0
        reg.dispatched(inflight(f"r{k}", prefill=None if agg else p, decode=a if agg else d,
                                input_tokens=int(rng.integers(10, 4000)), hit=float(rng.uniform(0, 0.6)),
                                ttft=float(rng.uniform(100, 900)), tpot=float(rng.uniform(5, 50)), t=t))
        if k % 4 == 1:
            reg.first_token(f"r{k - 1}", now_s=t)
        if k % 7 == 2:
            reg.completed(f"r{k - 2}", now_s=t, output_tokens=int(rng.integers(2, 300)))
    reg.observe_metrics("d1", now_s=t, kv_usage_frac=0.37, waiting_requests=2, running_requests=9)
    reg.observe_metrics("p2", now_s=t - 100.0, kv_usage_frac=0.9, waiting_requests=5, running_requests=5)  # stale
    return reg, t


@pytest.mark.parametrize("target, hit", [
    pytest.param("ttft", 0.25, id="ttft, one prefix-hit fraction for all"),
    pytest.param("tpot", "per endpoint", id="tpot, a prefix-hit fraction per endpoint"),
])
def test_view_block_gives_the_same_feature_matrix_as_the_named_fields(target, hit):
    # The registry hands its feature columns over as one block; the matrix built
    # from it must equal, value for value, the one built field by field.
    from routing.features import ENDPOINT_FIELDS, view_feature_matrix

    reg, t = _busy_fleet(seed=3)
    for role in ("prefill", "decode", "aggregated"):
        idx = reg.candidates(role)
        view = reg.view(idx, now_s=t + 0.05)
        hits = np.linspace(0, 0.5, idx.size) if hit == "per endpoint" else hit
        fast = view_feature_matrix(target, view, input_tokens=1234.0, prefix_cache_hit_frac=hits)
        slow = feature_matrix(target, role=view.role_code, input_tokens=1234.0, prefix_cache_hit_frac=hits,
                              tokens_generated=0.0, **{f: getattr(view, f) for f in ENDPOINT_FIELDS})
        assert np.array_equal(fast, slow)
        for j, f in enumerate(ENDPOINT_FIELDS):
            assert np.array_equal(view.block[j], getattr(view, f))
        assert fast[:, 2:].sum() > 0  # the fleet is busy: the comparison is not between zeros


def test_view_feature_matrix_still_refuses_bad_request_values():
    from routing.features import view_feature_matrix

    reg = fleet(("p0", "prefill"), ("d0", "decode"))
    view = reg.view(reg.candidates("prefill"), now_s=0.0)
    with pytest.raises(ValueError, match="feature input_tokens: row 0 must be finite and >= 0, got -5.0"):
        view_feature_matrix("ttft", view, input_tokens=-5.0, prefix_cache_hit_frac=0.0)
    with pytest.raises(ValueError, match="feature prefix_cache_hit_frac: row 0 must be finite and >= 0, got nan"):
        view_feature_matrix("tpot", view, input_tokens=5.0, prefix_cache_hit_frac=float("nan"))
