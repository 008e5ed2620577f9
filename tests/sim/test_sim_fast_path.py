"""The fast path on the simulated clock: the trigger, the windows its run collects, a replay with a surge."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest

from connectors.profiles import load_profile_dir
from planner.latency.profile_checks import ProfileRangeWarning
from sim.fast_path import ArrivalWindows, Trigger
from sim.lookup import ProfileTables
from sim.policies import PlannerPolicy, default_planner_config
from sim.replay import ReplaySettings, replay
from sim.whatif.report import markdown_report, summarize
from workloads.traces import Trace


@pytest.fixture(autouse=True)
def _quiet_profile_range():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ProfileRangeWarning)
        yield


# ---------------------------------------------------------------- trigger


def _run(trigger: Trigger, signal: dict[float, bool], until_s: float) -> list[tuple[float, float, float]]:
    """Poll every poll_s up to until_s; (onset, fired, run at) of every run that came due."""
    runs = []
    while trigger.next_time_s() <= until_s:
        now = trigger.next_time_s()
        due = trigger.take_due(now)
        if due is not None:
            runs.append((due[0], due[1], now))
        if now >= trigger.next_poll_s:
            trigger.poll(now, fire=signal.get(now, False), message="")
    return runs


@pytest.mark.parametrize(
    "fires_at, cooldown_s, dispatch_s, expected",
    [
        pytest.param([], 30, 10, [], id="never saturated: no run"),
        pytest.param([15], 30, 10, [(15, 15, 25)], id="one poll: fires at 15, runs 10 s later"),
        pytest.param([15, 20, 25, 30, 35, 40, 45, 50], 30, 10, [(15, 15, 25), (15, 45, 55)],
                     id="saturated 15-50: fires at 15, again at 45 (15 + 30), onset stays 15"),
        pytest.param([15, 25], 0, 10, [(15, 15, 25), (25, 25, 35)],
                     id="quiet at 20: onset restarts at 25"),
        pytest.param([15, 20, 25], 0, 10, [(15, 15, 25), (15, 25, 35)],
                     id="cooldown 0: no second firing while the first run is pending (20), fires at 25"),
        pytest.param([15], 30, 0, [(15, 15, 15)], id="dispatch 0: runs at the poll that fired"),
    ],
)
def test_trigger(fires_at, cooldown_s, dispatch_s, expected):
    trigger = Trigger(poll_s=5.0, cooldown_s=cooldown_s, dispatch_s=dispatch_s)
    assert _run(trigger, {float(t): True for t in fires_at}, until_s=120.0) == expected


def test_trigger_rejects_bad_settings():
    with pytest.raises(ValueError, match="poll_s > 0"):
        Trigger(poll_s=0.0, cooldown_s=30.0, dispatch_s=10.0)


# ---------------------------------------------------------------- windows


def test_arrival_windows_read_like_a_range_query_ending_now():
    # Arrivals at 10, 50, 70, 100, 110 s (ISL 100, 200, ..., 500; OSL 10 each).
    arrivals = np.array([10.0, 50.0, 70.0, 100.0, 110.0])
    w = ArrivalWindows(arrivals, np.array([100, 200, 300, 400, 500]), np.full(5, 10))
    o = w.observation(now_s=105.0, interval_s=60.0, history_intervals=288, peak_window_s=15.0, peak_step_s=5.0,
                      pods=(), avg_ttft_ms=80.0, avg_itl_ms=6.0)
    # floor(105 / 60) = 1 window: (45, 105] holds 50, 70, 100: 3 requests, ISL (200+300+400)/3 = 300.
    assert o.history.t_s == (105.0,)
    assert o.num_requests == 3.0 and o.avg_isl_tokens == 300.0 and o.avg_osl_tokens == 10.0
    # Peak: 15 s windows ending every 5 s in (45, 105]; at most one arrival in any: 1 / 15 rps.
    assert o.peak_rps == pytest.approx(1 / 15)
    assert (o.avg_ttft_ms, o.avg_itl_ms, o.taken_at_s) == (80.0, 6.0, 105.0)

    o = w.observation(now_s=130.0, interval_s=60.0, history_intervals=288, peak_window_s=None, peak_step_s=5.0,
                      pods=(), avg_ttft_ms=None, avg_itl_ms=None)
    # Two windows: (10, 70] holds 50, 70; (70, 130] holds 100, 110.
    assert o.history.t_s == (70.0, 130.0) and o.history.num_requests == (2.0, 2.0)
    assert o.history.avg_isl_tokens == (250.0, 450.0)
    assert o.peak_rps is None and o.history.peak_rps is None

    o = w.observation(now_s=200.0, interval_s=60.0, history_intervals=288, peak_window_s=None, peak_step_s=5.0,
                      pods=(), avg_ttft_ms=None, avg_itl_ms=None)
    # (140, 200] is empty: 0 requests, lengths undefined.
    assert o.num_requests == 0.0 and o.avg_isl_tokens is None and math.isnan(o.history.avg_isl_tokens[-1])


# ---------------------------------------------------------------- replay


RATE = 30.0  # rps from 130 s: two prefill replicas queue, the guardrail fires


def _surge(*, seed: int = 0) -> Trace:
    """Poisson arrivals, ISL 3000 / OSL 100: 2 rps until 130 s, then RATE until 300 s."""
    rng = np.random.default_rng(seed)
    parts = []
    for start, end, rate in ((0.0, 130.0, 2.0), (130.0, 300.0, RATE)):
        n = rng.poisson(rate * (end - start))
        parts.append(np.sort(rng.uniform(start, end, n)))
    t = np.concatenate(parts)
    return Trace("surge", t, np.full(len(t), 3000), np.full(len(t), 100))


@pytest.fixture(scope="module")
def surge_replays(h200_profile_dir):
    profile = load_profile_dir(h200_profile_dir)
    tables = ProfileTables(profile)
    base = default_planner_config(profile_dir=str(h200_profile_dir), ttft_ms=200, itl_ms=10, interval_s=60)
    out = {}
    for on in (False, True):
        cfg = base.model_copy(update={"fast_path": base.fast_path.model_copy(update={"enabled": on})})
        out[on] = replay(_surge(), tables, PlannerPolicy(cfg, profile, initial=(1, 1)), scenario=ReplaySettings())
    return out


def test_a_surge_between_intervals_scales_up_before_the_next_scheduled_run(surge_replays):
    off, on = surge_replays[False], surge_replays[True]
    assert off.fast_path_events == ()
    ups = [e for e in on.fast_path_events if e.applied]
    assert ups, [e.as_dict() for e in on.fast_path_events]
    first = ups[0]
    # The surge starts at 130 s; the scheduled runs are at 120 and 180 s. The trigger
    # polls every 5 s, the run decides 10 s after it fires, replicas serve 60 s later.
    assert 130.0 < first.onset_s <= first.fired_s < 180.0
    assert first.decided_s == first.fired_s + 10.0
    assert first.ready_s == first.decided_s + 60.0
    assert first.code == "fast_path_scale_up"
    assert first.to_replicas[0] > first.from_replicas[0]
    # The scheduled planner alone adds prefill replicas at 60 s (1 -> 2) and 180 s, none between.
    assert not [e for e in off.scale_log if e[1] == "prefill" and e[3] > e[2] and 120.0 < e[0] < 180.0]
    early = [e for e in on.scale_log if e[1] == "prefill" and e[3] > e[2] and 120.0 < e[0] < 180.0]
    assert early and early[0][0] == first.decided_s
    # Measured: 75.2% of requests within SLA without the fast path, 78.9% with it.
    assert on.sla_met().mean() > off.sla_met().mean() + 0.02


def test_the_report_shows_the_fast_path_events(surge_replays):
    on = surge_replays[True]
    s = summarize(on)
    fast = s["fast_path"]
    assert fast["events"] == len(on.fast_path_events) and fast["scale_ups"] >= 1
    assert fast["onset_to_ready_s"]["p50"] >= 70.0  # 10 s dispatch + 60 s startup, at least
    md = markdown_report(s)
    assert "fast-path events (scale-ups)" in md
    first = next(e for e in on.fast_path_events if e.applied)
    assert (f"| {first.onset_s:.0f} | {first.fired_s:.0f} | {first.decided_s:.0f} | {first.ready_s:.0f} | "
            f"{first.ready_s - first.onset_s:.0f} | fast_path_scale_up |") in md
    assert "fast_path" not in summarize(surge_replays[False])


def test_a_what_if_with_the_fast_path_reports_its_events(h200_profile_dir):
    from sim.whatif.scenario import WhatIfScenario, run_what_if

    def what_if(fast_path):
        sc = WhatIfScenario(trace="surge.csv", profile_dir=str(h200_profile_dir), fast_path=fast_path)
        return run_what_if(sc, trace=_surge())[0]

    on, default = what_if(True), what_if(None)
    assert on["fast_path"]["scale_ups"] >= 1
    assert "fast-path events (scale-ups)" in markdown_report(on)
    # Off by default (planner.fast_path.enabled): no polling, no events.
    assert "fast_path" not in default
