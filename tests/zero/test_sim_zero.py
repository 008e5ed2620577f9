"""Scale to zero in the simulator: the gap trace, the planner's zero and wake, and what the first requests pay.

azure2023_conv's first three 10-minute windows at x0.05 (seed 0: 479 requests, ~0.27 req/s while busy), each
followed by an hour without a request; H200 Llama-8B profile, SLA TTFT 200 ms / ITL 10 ms, 60 s interval,
workers start in 60 s, the wake run decides 10 s after the first held request.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from connectors.profiles import load_profile_dir
from planner.latency.profile_checks import ProfileRangeWarning
from sim.lookup import ProfileTables
from sim.policies import PlannerPolicy, default_planner_config
from sim.replay import ReplaySettings, replay
from workloads.traces import load_trace, multiply_load, with_idle_gaps


@pytest.fixture(scope="module")
def runs(shared_data, h200_profile_dir):
    profile = load_profile_dir(h200_profile_dir)
    tables = ProfileTables(profile)
    source = multiply_load(load_trace(shared_data / "traces" / "azure2023_conv.csv.gz"), 0.05, seed=0)
    trace = with_idle_gaps(source, busy_s=600, gap_s=3600, bursts=3)
    out = {}
    for zero in (False, True):
        cfg = default_planner_config(profile_dir=str(h200_profile_dir), ttft_ms=200, itl_ms=10, interval_s=60)
        if zero:
            d = cfg.decision.model_dump()
            d.update(allow_scale_to_zero=True, prefill={"min_replicas": 0, "max_replicas": 16},
                     decode={"min_replicas": 0, "max_replicas": 16}, scale_to_zero={"late_request_cost_gpu_h": 0.01})
            cfg = cfg.model_copy(update={"decision": type(cfg.decision).model_validate(d)})
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ProfileRangeWarning)
            out[zero] = replay(trace, tables, PlannerPolicy(cfg, profile), scenario=ReplaySettings())
    return trace, out


def test_gap_trace_is_the_source_windows_with_idle_hours(shared_data):
    source = load_trace(shared_data / "traces" / "azure2023_conv.csv.gz")
    gaps = with_idle_gaps(source, busy_s=600, gap_s=3600, bursts=3)
    third = source.arrival_s[(source.arrival_s >= 1200) & (source.arrival_s < 1800)]
    np.testing.assert_allclose(gaps.arrival_s[-len(third):], third - 1200 + 2 * 4200)
    assert not ((gaps.arrival_s >= 600) & (gaps.arrival_s < 4200)).any()
    with pytest.raises(ValueError, match="lasts 3502 s, 6 bursts of 600 s need 3600 s"):
        with_idle_gaps(source, busy_s=600, gap_s=60, bursts=6)


def test_scale_to_zero_saves_gpu_hours_and_wakes_on_the_first_request(runs):
    trace, out = runs
    off, on = out[False], out[True]
    assert off.wake_events == () and min(off.timeline.prefill_target + off.timeline.decode_target) >= 1
    # two gaps of an hour each: at zero for most of both (after the 10-minute quiet period and the forecast's
    # upper quantile falling), woken by the bursts at 4200 s and 8400 s
    assert [round(e.held_s) for e in on.wake_events] == [pytest.approx(4200, abs=10), pytest.approx(8400, abs=10)]
    assert off.gpu_hours - on.gpu_hours > 2.0, (off.gpu_hours, on.gpu_hours)
    for e in on.wake_events:
        assert e.decided_s == pytest.approx(e.held_s + 10.0)  # the wake run, not the next interval
        assert e.ready_s == pytest.approx(e.decided_s + 60.0, abs=1.0)  # the workers' startup
        first = int(np.searchsorted(trace.arrival_s, e.held_s))
        # the first request after the gap waited for the wake and the startup: ~70 s TTFT
        assert on.requests.ttft_ms[first] == pytest.approx((e.ready_s - e.held_s) * 1000.0, rel=0.02)
        assert off.requests.ttft_ms[first] < 200.0
