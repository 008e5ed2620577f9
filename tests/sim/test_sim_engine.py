"""Simulator fidelity against the measured profile, scaling without loss, KV transfer topology."""

from __future__ import annotations

import math

import numpy as np
import pytest

from connectors.profiles import load_profile_dir
from sim.config import SimConfig
from sim.engine import FleetSim
from sim.fleet import FREE_TRANSFER
from sim.lookup import ProfileTables
from sim.routing import LeastLoadedRouter, RoundRobinRouter
from workloads.traces import Trace


@pytest.fixture(scope="module")
def profile(h200_profile_dir):
    return load_profile_dir(h200_profile_dir)


@pytest.fixture(scope="module")
def tables(profile):
    return ProfileTables(profile)


def _trace(arrival, isl, osl) -> Trace:
    n = len(arrival)
    return Trace(
        name="test",
        arrival_s=np.asarray(arrival, dtype=float),
        isl_tokens=np.broadcast_to(np.asarray(isl), (n,)).astype(np.int64),
        osl_tokens=np.broadcast_to(np.asarray(osl), (n,)).astype(np.int64),
    )


FREE = SimConfig(transfer=FREE_TRANSFER, startup_s=0.0)


@pytest.mark.parametrize("isl", [100, 1117, 3000, 8236, 16372], ids=lambda i: f"isl={i}")
def test_single_request_ttft_equals_profile_prefill_ttft(profile, tables, isl):
    sim = FleetSim(_trace([5.0], isl, 50), tables, config=FREE)
    sim.run_to_completion()
    ttft_ms = sim.results().ttft_ms[0]
    assert ttft_ms == pytest.approx(profile.prefill.ttft_ms_at(isl), rel=1e-9)


class _PickDomain:
    """A router that sends decode to the worker in a given domain."""

    name = "pick-domain"

    def __init__(self, domain):
        self.domain = domain

    def pick_prefill(self, rid, isl_tokens, workers):
        return workers[0]

    def pick_decode(self, rid, isl_tokens, osl_tokens, source, workers):
        return next(w for w in workers if w.domain == self.domain)


@pytest.mark.parametrize(
    "decode_domain, latency_ms, bytes_per_s",
    [
        pytest.param("z1/r1", 0.2, 50e9, id="same rack: 0.2 ms + 1000 x 131,072 B / 50 GB/s = 2.82 ms"),
        pytest.param("z1/r2", 0.5, 25e9, id="same zone: 0.5 ms + 131 MB / 25 GB/s = 5.74 ms"),
        pytest.param("z2/r1", 2.0, 5e9, id="cross zone: 2 ms + 131 MB / 5 GB/s = 28.21 ms"),
    ],
)
def test_transfer_adds_latency_plus_bytes_over_bandwidth(profile, tables, decode_domain, latency_ms, bytes_per_s):
    cfg = SimConfig(domains=("z1/r1", "z1/r2", "z2/r1"), startup_s=0.0)
    sim = FleetSim(_trace([0.0], 1000, 20), tables, config=cfg, initial_decode=3, router=_PickDomain(decode_domain))
    sim.run_to_completion()
    expected = profile.prefill.ttft_ms_at(1000) + latency_ms + 1000 * 131_072 / bytes_per_s * 1e3
    assert sim.results().ttft_ms[0] == pytest.approx(expected, rel=1e-9)


@pytest.mark.parametrize("mode", ["prefer", "require"])
def test_topology_aware_decode_stays_in_the_prefill_rack(tables, mode):
    cfg = SimConfig(domains=("z1/r1", "z2/r1"), startup_s=0.0)
    sim = FleetSim(
        _trace([0.0, 0.01, 0.02], 1000, 100), tables, config=cfg, initial_decode=2,
        router=LeastLoadedRouter(topology=mode),
    )
    sim.run_to_completion()
    # every request went through prefill-0 (z1/r1); the same-rack decode-0 took them all
    assert sim.prefill_workers[0].domain == "z1/r1" and sim.decode_workers[0].domain == "z1/r1"
    assert sim.decode_workers[0].steps > 0 and sim.decode_workers[1].steps == 0
    ignore = FleetSim(
        _trace([0.0, 0.01, 0.02], 1000, 100), tables, config=cfg, initial_decode=2,
        router=LeastLoadedRouter(topology="ignore"),
    )
    ignore.run_to_completion()
    assert ignore.decode_workers[1].steps > 0  # without topology the load spreads across zones


@pytest.mark.parametrize(
    "concurrency, isl, osl",
    [
        pytest.param(49, 2900, 200, id="ctx 3000, 49 running: kv 0.155 (measured row 2997)"),
        pytest.param(100, 5544, 200, id="ctx 5644, 100 running: kv ~0.6"),
        pytest.param(20, 8191, 200, id="ctx 8291, 20 running: kv ~0.18"),
    ],
)
def test_decode_itl_at_profiled_concurrency_within_5_percent(profile, tables, concurrency, isl, osl):
    # All requests reach the single decode worker together (one prefill worker per request),
    # so they run as one batch of `concurrency` with mean context isl + osl/2.
    sim = FleetSim(
        _trace([0.0] * concurrency, isl, osl), tables, config=FREE, initial_prefill=concurrency, initial_decode=1
    )
    sim.run_to_completion()
    itl = sim.results().itl_ms
    ctx = isl + osl / 2
    kv = profile.decode.kv_usage_for(concurrency, ctx)
    expected = profile.decode.itl_ms_at(kv, ctx)
    assert np.nanmean(itl) == pytest.approx(expected, rel=0.05)


def test_a_request_joining_a_busy_decoder_waits_for_the_step_in_progress(tables):
    # A decodes alone from its first token; B's first token lands mid-step, so its first gap starts
    # with the rest of A's step: join_wait_s, which lands B on A's step grid.
    sim = FleetSim(_trace([0.0, 0.2], [1000, 100], [400, 3]), tables, config=FREE,
                   initial_prefill=2, initial_decode=1)
    sim.run_to_completion()
    r = sim.results()
    assert (r.join_wait_s[0], r.join_step_s[0]) == (0.0, 0.0)  # an idle decoder: nothing to wait for
    wait, step = r.join_wait_s[1], r.join_step_s[1]
    assert 0.0 < wait < step
    steps_of_a = (r.first_token_s[1] + wait - r.first_token_s[0]) / step
    assert steps_of_a == pytest.approx(round(steps_of_a), abs=1e-6) and steps_of_a >= 1
    # B's two gaps: the wait, then two steps of the pair (each at least A's step alone).
    assert r.finish_s[1] - r.first_token_s[1] >= wait + 2 * step


def test_prefill_batches_within_token_budget(tables):
    # Ten 1000-token requests at once, budget 4096: batches of 4, 4, 2 (4 x 1000 <= 4096 < 5 x 1000)
    cfg = SimConfig(transfer=FREE_TRANSFER, startup_s=0.0, prefill_token_budget=4096)
    sim = FleetSim(_trace([0.0] * 10, 1000, 2), tables, config=cfg)
    sim.run_to_completion()
    done = np.array(sim.prefill_done_s)
    b1 = tables.prefill_ms(1000) * 1e-3  # the first arrival starts alone: the worker was idle
    b2 = b1 + tables.prefill_ms(4000) * 1e-3
    b3 = b2 + tables.prefill_ms(4000) * 1e-3
    b4 = b3 + tables.prefill_ms(1000) * 1e-3
    assert sorted(set(np.round(done, 9))) == pytest.approx([b1, b2, b3, b4])
    assert np.bincount(np.searchsorted([b1, b2, b3, b4], done - 1e-12)).tolist() == [1, 4, 4, 1]


def test_scale_down_drains_and_loses_nothing(tables):
    rng = np.random.default_rng(0)
    n = 3000
    arrival = np.sort(rng.uniform(0, 120, n))
    tr = _trace(arrival, rng.integers(100, 3000, n), rng.integers(2, 400, n))
    cfg = SimConfig(startup_s=10.0)
    sim = FleetSim(tr, tables, config=cfg, initial_prefill=4, initial_decode=4, router=RoundRobinRouter())
    sim.run_until(30.0)
    busy_before = [d.n for d in sim.decode_workers]
    assert max(busy_before) > 0
    sim.set_target("prefill", 1)
    sim.set_target("decode", 1)
    assert sim.allocated_count("decode") >= 1 and sim.ready_count("decode") == 1
    draining = [d for d in sim.decode_workers if d.draining]
    assert len(draining) == 3
    sim.run_until(60.0)
    sim.set_target("decode", 3)  # new workers serve only after startup_s
    assert sim.ready_count("decode") == 1
    sim.run_until(69.9)
    assert sim.ready_count("decode") == 1
    sim.run_until(70.1)
    assert sim.ready_count("decode") == 3
    sim.run_to_completion()
    r = sim.results()
    assert sim.completed == n
    assert not np.isnan(r.finish_s).any() and not np.isnan(r.first_token_s).any()
    assert np.all(r.finish_s >= r.first_token_s) and np.all(r.first_token_s > r.arrival_s)
    assert all(d.retired for d in draining)
    # a drained worker stops billing: GPU-seconds are below "4 workers all the time"
    gpu_s = sim.gpu_seconds()
    assert gpu_s["decode"] < 4 * sim.now_s


def test_scale_down_cancels_starting_workers_first(tables):
    sim = FleetSim(_trace([0.0], 100, 10), tables, config=SimConfig(startup_s=60.0))
    sim.set_target("prefill", 3, 0.0)  # two starting
    sim.set_target("prefill", 2, 1.0)  # cancel the newest starting one
    assert [w.retired for w in sim.prefill_workers] == [False, False, True]
    assert sim.ready_count("prefill") == 1


def test_requests_wait_at_the_frontend_until_a_worker_is_ready(tables, profile):
    sim = FleetSim(_trace([0.0], 500, 5), tables, config=SimConfig(startup_s=30.0, transfer=FREE_TRANSFER),
                   initial_prefill=0, initial_decode=1)
    sim.set_target("prefill", 1, 0.0)
    sim.run_to_completion()
    # waits 30 s for the prefill worker, then the profile's TTFT
    assert sim.results().ttft_ms[0] == pytest.approx(30_000 + profile.prefill.ttft_ms_at(500), rel=1e-9)


def test_decode_waits_when_kv_cache_is_full(tables):
    cap = tables.max_kv_tokens
    isl = cap // 2  # two fit only one at a time: 2 x (isl + osl) > cap
    sim = FleetSim(_trace([0.0, 0.0], isl, 10), tables, config=FREE, initial_prefill=2)
    sim.run_to_completion()
    r = sim.results()
    first, second = np.sort(r.first_token_s)
    assert second >= r.finish_s[np.argmin(r.first_token_s)] - 1e-12


def test_pod_metrics_report_kv_and_queue(tables):
    sim = FleetSim(_trace(np.linspace(0, 1, 50), 2000, 300), tables, config=FREE)
    sim.run_until(2.0)
    pods = sim.pod_metrics(2.0)
    dec = [p for p in pods if p.pool == "decode"][0]
    assert 0 < dec.kv_usage_frac < 1
    assert math.isfinite(dec.queue_length)


def test_the_simulated_frontend_counts_ttfts_into_dynamos_buckets(tables):
    """The interval's TTFT histogram holds every first token of the interval, each in the bucket of its TTFT."""
    from planner.signals.slo_attainment import DYNAMO_TTFT_BOUNDS_S, share_within
    from sim.observation import interval_observation

    rng = np.random.default_rng(3)
    n = 400
    trace = _trace(np.sort(rng.uniform(0, 50, n)), rng.integers(200, 6000, n), 20)
    sim = FleetSim(trace, tables, config=FREE, initial_prefill=1, initial_decode=2)  # one prefill: queues build
    sim.run_until(60.0)
    obs = interval_observation(sim.take_interval_stats(), taken_at_s=60.0, interval_s=60.0, history=None, pods=())
    ttft_s = sim.results().ttft_ms / 1e3
    done = ttft_s[np.isfinite(ttft_s)]
    h = obs.ttft_histogram
    assert h.upper_bounds_s == DYNAMO_TTFT_BOUNDS_S and h.count == done.size > 0
    for bound, cum in zip(h.upper_bounds_s, h.cumulative_counts):
        assert cum == np.sum(done <= bound)
    assert 0 < share_within(h, 0.22).share == np.mean(done <= 0.22) < 1
    # the next interval starts from zero
    assert interval_observation(sim.take_interval_stats(), taken_at_s=120.0, interval_s=60.0, history=None,
                                pods=()).ttft_histogram.count == 0


@pytest.mark.parametrize("engine_model", ["profile", "dynamo_mocker"])
def test_the_simulated_frontend_counts_every_token_gap_into_dynamos_itl_buckets(tables, engine_model):
    """One ITL observation per output token after the first (Dynamo's frontend), each in its decode step's bucket."""
    from planner.signals.slo_attainment import DYNAMO_ITL_BOUNDS_S, share_within
    from sim.observation import interval_observation

    rng = np.random.default_rng(5)
    n = 300
    osl = rng.integers(1, 400, n)
    trace = _trace(np.sort(rng.uniform(0, 40, n)), rng.integers(100, 3000, n), osl)
    config = SimConfig(engine_model=engine_model, transfer=FREE_TRANSFER, startup_s=0.0)
    sim = FleetSim(trace, tables, config=config, initial_prefill=2, initial_decode=1)  # one decode worker: big batches
    sim.run_to_completion()
    h = interval_observation(sim.take_interval_stats(), taken_at_s=1e4, interval_s=1e4, history=None,
                             pods=()).itl_histogram
    assert h.upper_bounds_s == DYNAMO_ITL_BOUNDS_S
    assert h.count == np.sum(osl - 1)
    # each gap is counted at its decode step's length: no request's mean gap is shorter than the shortest step
    mean_itl_s = sim.results().itl_ms[osl > 1] / 1e3
    bounds, cum = (0.0, *DYNAMO_ITL_BOUNDS_S), np.array((0.0, *h.cumulative_counts))
    assert bounds[int(np.argmax(cum > 0)) - 1] <= mean_itl_s.min()
    assert 0 < share_within(h, 0.011).share <= 1


def test_the_slo_window_sums_the_last_intervals_buckets():
    """sim.observation.SloWindow: the TTFT and ITL buckets of the last N intervals, as an increase over N intervals."""
    from sim.observation import IntervalStats, SloWindow

    window = SloWindow(window_intervals=2, interval_s=60.0)
    counts = []
    for k, ttft_s in enumerate((0.05, 0.15, 0.5)):
        st = IntervalStats()
        for _ in range(k + 1):
            st.first_token(ttft_s)
        st.token_gaps(0.004 * (k + 1), 10 * (k + 1))
        w = window.add_interval(st)
        counts.append((w.window_s, w.ttft.count, w.itl.count))
    assert counts == [(60.0, 1, 10), (120.0, 3, 30), (120.0, 5, 50)]  # the first interval drops out at the third
    assert w.ttft.cumulative_counts[w.ttft.upper_bounds_s.index(0.1)] == 0  # only the 0.15 s and 0.5 s ones
    assert w.ttft.cumulative_counts[w.ttft.upper_bounds_s.index(0.22)] == 2

