"""Simulator samples (sim.samples): lifecycle events and the samples a real RoutingService records.

Hand-made request timelines with hand-computed features, then a real trace
replayed by the simulated fleet.
"""

from __future__ import annotations

import numpy as np
import pytest

from routing.features import RAW_FIELDS
from sim.samples import RoutedRequests, endpoints, lifecycle_events, record_samples, samples_summary
from tests.support.fixtures_retrain import FLEET_PROFILE, require_data, simulated_requests

NAN = float("nan")


def routed(arrival, first, finish, isl, osl, pwid, dwid, prefill_done=None) -> RoutedRequests:
    a = lambda v, t=float: np.asarray(v, dtype=t)  # noqa: E731
    return RoutedRequests(a(arrival), a(first), a(finish), a(isl, np.int64), a(osl, np.int64), a(pwid, np.int64),
                          a(dwid, np.int64), ("zone-a/rack-1",), ("zone-a/rack-1", "zone-b/rack-2"),
                          None if prefill_done is None else a(prefill_done))


# A at 0 s (100 tokens in, 3 out) on prefill-0/decode-0: prefill done 0.04 s, first token 0.05 s, done 0.07 s.
# B at 0.01 s (200 in, 1 out) on prefill-0 only: prefill done = first token = finish = 0.06 s.
# C at 0.02 s never finished: left out.
TWO = routed([0.0, 0.01, 0.02], [0.05, 0.06, NAN], [0.07, 0.06, NAN], [100, 200, 50], [3, 1, 9], [0, 0, 0], [0, -1, 1],
             prefill_done=[0.04, 0.06, 0.03])


def test_lifecycle_events_in_time_order_with_observed_latencies():
    evs = lifecycle_events(TWO, decode_pick="at_dispatch")
    assert [(e.t_s, e.kind, e.request_id) for e in evs] == [
        (0.0, "dispatched", "r0"), (0.01, "dispatched", "r1"), (0.05, "first_token", "r0"),
        (0.06, "first_token", "r1"), (0.06, "completed", "r1"), (0.07, "completed", "r0")]
    d0, d1 = evs[0], evs[1]
    assert (d0.prefill_endpoint_id, d0.decode_endpoint_id, d0.input_tokens) == ("prefill-0", "decode-0", 100)
    assert (d1.prefill_endpoint_id, d1.decode_endpoint_id) == ("prefill-0", None)  # one token: no decode
    # TTFT (0.05 - 0) s = 50 ms; TPOT (0.07 - 0.05) s / (3 - 1) = 10 ms
    assert evs[2].observed_ttft_ms == pytest.approx(50.0)
    assert evs[5].observed_tpot_ms == pytest.approx(10.0) and evs[5].output_tokens == 3
    assert evs[4].observed_tpot_ms is None


def test_decode_is_named_when_prefill_returns_by_default():
    """The simulator (like Dynamo's frontend) picks decode when prefill ends: the events say so then."""
    evs = lifecycle_events(TWO)
    assert [(e.t_s, e.kind, e.request_id) for e in evs] == [
        (0.0, "dispatched", "r0"), (0.01, "dispatched", "r1"), (0.04, "prefill_done", "r0"),
        (0.05, "first_token", "r0"), (0.06, "first_token", "r1"), (0.06, "completed", "r1"),
        (0.07, "completed", "r0")]
    assert (evs[0].prefill_endpoint_id, evs[0].decode_endpoint_id) == ("prefill-0", None)
    assert evs[2].decode_endpoint_id == "decode-0"
    with pytest.raises(ValueError, match="needs the requests' prefill_done_s"):
        lifecycle_events(routed([0.0], [0.1], [0.2], [10], [5], [0], [0]))
    with pytest.raises(ValueError, match="decode_pick must be"):
        lifecycle_events(TWO, decode_pick="later")


def test_decode_features_are_taken_when_prefill_returns():
    """A's TPOT features see B, dispatched to decode-0 while A prefilled; named at dispatch, they would not."""
    require_data(FLEET_PROFILE)
    # A at 0 s, prefill done 0.5 s; B at 0.1 s, prefill done 0.2 s, both decode on decode-0.
    two = routed([0.0, 0.1], [0.55, 0.25], [1.55, 1.25], [1000, 2000], [101, 101], [0, 0], [0, 0],
                 prefill_done=[0.5, 0.2])
    late = {(s["target"], s["request_id"]): s for s in record_samples(two, profile_dir=str(FLEET_PROFILE))}
    early = {(s["target"], s["request_id"]): s for s in record_samples(
        two, profile_dir=str(FLEET_PROFILE), decode_pick="at_dispatch")}
    a_late, a_early = late["tpot", "r0"]["features"], early["tpot", "r0"]["features"]
    assert a_early["running_requests"] == 0 and a_early["decode_tokens_in_flight"] == 0
    # at 0.5 s B (2000 in) holds decode-0 and has had its first token at 0.25 s
    assert a_late["running_requests"] == 1 and a_late["decode_tokens_in_flight"] == 2000
    assert late["tpot", "r0"]["observed_ms"] == early["tpot", "r0"]["observed_ms"] == pytest.approx(10.0)


def test_endpoints_carry_topology_domains():
    assert endpoints(TWO) == [
        {"id": "prefill-0", "role": "prefill", "domains": {"zone": "zone-a", "rack": "rack-1"}},
        {"id": "decode-0", "role": "decode", "domains": {"zone": "zone-a", "rack": "rack-1"}},
        {"id": "decode-1", "role": "decode", "domains": {"zone": "zone-b", "rack": "rack-2"}},
    ]


def test_recorded_samples_have_the_routing_services_features():
    require_data(FLEET_PROFILE)
    samples = record_samples(TWO, profile_dir=str(FLEET_PROFILE))
    by = {(s["target"], s["request_id"]): s for s in samples}
    assert sorted(by) == [("tpot", "r0"), ("ttft", "r0"), ("ttft", "r1")]
    a_ttft, b_ttft, a_tpot = by["ttft", "r0"], by["ttft", "r1"], by["tpot", "r0"]
    # A found an idle fleet: every in-flight quantity is 0.
    assert a_ttft["features"] == dict.fromkeys(RAW_FIELDS, 0.0) | {"input_tokens": 100.0}
    # B arrived while A (100 uncached tokens) waited for its first token on prefill-0.
    f = b_ttft["features"]
    assert (f["waiting_requests"], f["running_requests"], f["prefill_tokens_in_flight"]) == (1.0, 1.0, 100.0)
    assert f["kv_usage_frac"] == pytest.approx(100 / 945029)  # lifecycle estimate: tokens held / max KV
    assert b_ttft["observed_ms"] == pytest.approx(50.0) and b_ttft["role"] == "prefill"
    assert a_tpot["role"] == "decode" and a_tpot["endpoint_id"] == "decode-0"
    assert a_tpot["observed_ms"] == pytest.approx(10.0)
    # recorded on the simulated clock: A's TTFT at 0.05 s; every sample has the store's fields
    assert a_ttft["recorded_at_s"] == pytest.approx(0.05)
    assert a_ttft["predicted_ms"] > 0 and a_ttft["model_version"] is None
    assert set(a_ttft) == {"seq", "target", "request_id", "endpoint_id", "role", "features", "observed_ms",
                           "predicted_ms", "model_version", "recorded_at_s"}


def test_real_trace_samples_match_the_simulated_outcomes():
    routed_reqs = simulated_requests(window_s=20.0)
    samples = record_samples(routed_reqs, profile_dir=str(FLEET_PROFILE))
    done = np.isfinite(routed_reqs.finish_s)
    assert done.all(), "the simulated fleet finishes every request of the window"
    n = len(routed_reqs)
    multi = int((routed_reqs.osl_tokens > 1).sum())
    summary = samples_summary(samples)
    assert summary["ttft"]["count"] == n and summary["tpot"]["count"] == multi
    ttft = {s["request_id"]: s["observed_ms"] for s in samples if s["target"] == "ttft"}
    expected = (routed_reqs.first_token_s - routed_reqs.arrival_s) * 1e3
    got = np.array([ttft[f"r{i}"] for i in range(n)])
    np.testing.assert_allclose(got, expected, rtol=1e-12)
    # Some requests met a busy endpoint: the features carry load, not only idle rows.
    assert max(s["features"]["waiting_requests"] for s in samples if s["target"] == "ttft") >= 1
    assert max(s["features"]["running_requests"] for s in samples if s["target"] == "tpot") >= 4
    assert [s["seq"] for s in samples] == sorted(s["seq"] for s in samples)
