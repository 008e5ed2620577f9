"""Routers inside the simulator: round-robin, least-loaded, and the routing service's picker in-process."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from connectors.profiles import load_profile_dir
from planner.config import SloTarget
from routing.config import PickerConfig
from sim.config import SimConfig
from sim.engine import FleetSim
from sim.fleet import TransferModel
from sim.lookup import ProfileTables
from sim.picker_router import PickerRouter
from sim.routing import RoundRobinRouter, make_router
from workloads.traces import Trace


@pytest.fixture(scope="module")
def profile(h200_profile_dir):
    return load_profile_dir(h200_profile_dir)


@pytest.fixture(scope="module")
def tables(profile):
    return ProfileTables(profile)


def _trace(n: int, *, rate_rps: float, seed: int = 0) -> Trace:
    rng = np.random.default_rng(seed)
    t = np.cumsum(rng.exponential(1 / rate_rps, n))
    return Trace("t", t, rng.integers(200, 3000, n), rng.integers(2, 200, n))


def test_round_robin_cycles_through_workers(tables):
    sim = FleetSim(_trace(1, rate_rps=1), tables, initial_prefill=3, initial_decode=2)
    rr = RoundRobinRouter()
    picks = [rr.pick_prefill(i, 100, sim.prefill_serving).wid for i in range(6)]
    assert picks == [0, 1, 2, 0, 1, 2]
    src = sim.prefill_workers[0]
    assert [rr.pick_decode(i, 100, 10, src, sim.decode_serving).wid for i in range(4)] == [0, 1, 0, 1]


class _Recording(PickerRouter):
    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.pairs = []

    def pick_decode(self, rid, isl_tokens, osl_tokens, source, workers):
        d = super().pick_decode(rid, isl_tokens, osl_tokens, source, workers)
        self.pairs.append((source.domain, d.domain))
        return d


def test_picker_router_serves_everything_and_keeps_kv_in_the_rack(tables, profile):
    cfg = PickerConfig.model_validate({"topology": {"levels": ["zone", "rack"], "level": "rack", "policy": "fail"}})
    router = _Recording(profile, slo=SloTarget(ttft_ms=200, itl_ms=10), config=cfg, seed=1)
    sim = FleetSim(
        _trace(300, rate_rps=20), tables, router=router, initial_prefill=2, initial_decode=2,
        config=SimConfig(domains=("z1/r1", "z1/r2"), startup_s=0.0),
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sim.run_to_completion()
    assert sim.completed == 300 and router.picks == 600  # one prefill and one decode pick each
    # prefill-0 and decode-0 are in rack r1, prefill-1 and decode-1 in r2: with the hard rack
    # filter every KV transfer stayed inside its rack, and both racks were used
    assert len(router.pairs) == 300 and all(src == dst for src, dst in router.pairs)
    assert {src for src, _ in router.pairs} == {"z1/r1", "z1/r2"}


def test_picker_router_follows_scaling(tables, profile):
    router = make_router("picker", profile=profile, slo=SloTarget(), seed=0)
    sim = FleetSim(_trace(200, rate_rps=20), tables, router=router, config=SimConfig(startup_s=1.0))
    sim.set_target("prefill", 3, 0.0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sim.run_to_completion()
    assert sim.completed == 200
    assert {"prefill-0", "prefill-1", "prefill-2"} <= set(router._registered)


def test_make_router_errors():
    with pytest.raises(ValueError, match="needs the engine profile"):
        make_router("picker")
    with pytest.raises(ValueError, match="unknown name 'fastest'"):
        make_router("fastest")


def test_picker_router_feeds_the_registry_lifecycle_and_drains_it(tables, profile):
    # The adapter makes the service's lifecycle calls: while requests queue, the registry
    # counts their prompt tokens on the prefill endpoint (what the TTFT estimate reads);
    # once everything has finished, nothing is left in flight anywhere.
    router = make_router("picker", profile=profile, slo=SloTarget(ttft_ms=200, itl_ms=10), seed=0)
    trace = _trace(400, rate_rps=60, seed=3)
    sim = FleetSim(trace, tables, router=router, initial_prefill=2, initial_decode=2, config=SimConfig(startup_s=0.0))
    seen_tokens = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        t = 0.0
        while not sim.done:
            t += 0.5
            sim.run_until(t)
            loads = [router.registry.load_of(w.name, now_s=t) for w in sim.prefill_serving]
            seen_tokens.append(sum(ld["prefill_tokens_in_flight"] for ld in loads))
            # the registry never counts more prompt tokens than the workers still hold
            assert seen_tokens[-1] <= sum(w.queued_tokens for w in sim.prefill_serving) + 1e-6
    assert max(seen_tokens) > 0
    # One more request through both stages: the picks sweep what finished since the last look.
    extra = len(trace.arrival_s)
    src = router.pick_prefill(extra, 100, sim.prefill_serving)
    router.pick_decode(extra, 100, 10, src, sim.decode_serving)
    assert router.registry.in_flight_count() == 1  # only the extra request
    assert sum(router.registry.load_of(w.name, now_s=t)["requests_in_flight"] for w in sim.decode_serving) == 1
    assert sum(router.registry.load_of(w.name, now_s=t)["prefill_tokens_in_flight"] for w in sim.prefill_serving) == 0


def test_picker_router_drains_a_scaled_down_worker_and_keeps_its_samples(tables, profile):
    # Decode goes 3 -> 1 while busy: the two draining workers are not picked any more, their
    # requests still complete in the registry (each with its TPOT sample), and the registry
    # drops each worker after its last one.
    router = make_router("picker", profile=profile, slo=SloTarget(ttft_ms=200, itl_ms=10), seed=0)
    tpot_samples, drained_picks = [], []
    completed = router.registry.completed

    def counting(request_id, **kw):
        out = completed(request_id, **kw)
        tpot_samples.extend(x.endpoint_id for x in out if x.target == "tpot")
        return out

    router.registry.completed = counting
    trace = _trace(300, rate_rps=60, seed=5)
    sim = FleetSim(trace, tables, router=router, initial_prefill=2, initial_decode=3, config=SimConfig(startup_s=0.0))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sim.run_until(2.0)
        busy = {w.name: w.n + len(w.pending) + w.incoming for w in sim.decode_serving}
        sim.set_target("decode", 1, 2.0)
        sim.run_until(2.0)
        leaving = set(busy) - {w.name for w in sim.decode_serving}
        assert len(leaving) == 2 and sum(busy[n] for n in leaving) > 0
        while not sim.done:
            sim.run_until(sim.event_t_s + 0.5)
            drained_picks += [n for n in leaving if n in router._registered]
    src = router.pick_prefill(len(trace.arrival_s), 100, sim.prefill_serving)  # a last look sweeps the ends
    router.pick_decode(len(trace.arrival_s), 100, 10, src, sim.decode_serving)
    assert sim.completed == 300 and drained_picks == []
    assert len(tpot_samples) == 300 and leaving <= set(tpot_samples)
    assert router.registry.in_flight_count() == 1 and not leaving & {e.id for e in router.registry.endpoints()}


def test_picker_router_follows_dynamos_order(tables, profile):
    # Dynamo's frontend picks decode when prefill returns; the first token comes after the KV
    # transfer. With a 0.5 s transfer, request 0 sits between the two: released from its prefill
    # endpoint, waiting on its decode endpoint, no first token yet. Request 1's picks later
    # notice its first token, recorded at the true time.
    slow = TransferModel(same_rack_latency_s=0.5, same_zone_latency_s=0.5, cross_zone_latency_s=0.5)
    router = make_router("picker", profile=profile, slo=SloTarget(ttft_ms=200, itl_ms=10), seed=0)
    trace = Trace("t", np.array([0.0, 2.0]), np.array([1000, 1000]), np.array([50, 50]))
    sim = FleetSim(trace, tables, router=router, initial_prefill=1, initial_decode=1,
                   config=SimConfig(startup_s=0.0, transfer=slow))
    t = 0.0
    while not sim.prefill_done_s[0] == sim.prefill_done_s[0]:  # NaN until prefill returns
        t += 0.01
        sim.run_until(t)
    first = router.registry.in_flight("0")
    assert first.prefill_released and first.decode_id is not None and first.first_token_s is None
    (p,), (d,) = sim.prefill_serving, sim.decode_serving
    assert router.registry.load_of(p.name, now_s=t)["requests_in_flight"] == 0
    assert router.registry.load_of(p.name, now_s=t)["prefill_tokens_in_flight"] == 0
    assert router.registry.load_of(d.name, now_s=t)["requests_in_flight"] == 1
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        sim.run_to_completion()
    assert first.first_token_s == pytest.approx(sim.first_token_s[0])
    assert first.first_token_s >= sim.prefill_done_s[0] + 0.5
    assert router.registry.in_flight("1") is not None  # no later pick looked at request 1's end


def test_default_picker_beats_least_loaded_and_bin_packing_loses_on_a_busy_fleet(tables, profile):
    # 2 prefill x 2 decode at 60 req/s of 200-3000-token prompts (seeded): queues build. The
    # default picker (max headroom, 10% margin) prices what is left of each running prefill
    # batch, which least-loaded's queued-token count cannot see; `least` without a margin
    # packs onto the endpoint with just enough predicted headroom and misses far more.
    # Measured: least-loaded 39.8%, default picker 45.4%, least without margin 21.2%.
    slo = SloTarget(ttft_ms=200, itl_ms=10)

    def attainment(router) -> float:
        sim = FleetSim(_trace(1000, rate_rps=60, seed=0), tables, router=router, initial_prefill=2,
                       initial_decode=2, config=SimConfig(startup_s=0.0))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            sim.run_to_completion()
        return float(sim.results().sla_met(ttft_ms=slo.ttft_ms, itl_ms=slo.itl_ms).mean())

    levels = {"topology": {"levels": ["zone", "rack"]}}
    least_loaded = attainment(make_router("least-loaded"))
    default = attainment(PickerRouter(profile, slo=slo, config=PickerConfig.model_validate(levels)))
    packing = attainment(PickerRouter(profile, slo=slo, config=PickerConfig.model_validate(
        {**levels, "slo": {"strategy": "least", "headroom_margin_frac": 0.0}})))
    assert default >= least_loaded + 0.01, (default, least_loaded)
    assert packing <= least_loaded - 0.1, (packing, least_loaded)
