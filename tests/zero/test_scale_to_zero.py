"""Scale to zero: the measured startup time, the rule's arithmetic and its place in `decide`.

Pools are written (prefill, decode). Unless a case says otherwise: interval 60 s, TTFT target 2 s, 1 GPU per
replica, late request worth 0.1 GPU-h, quiet period 600 s.
"""

from __future__ import annotations

import math

import pytest

from planner.config import DecisionConfig, PoolBounds, ScaleToZeroConfig
from planner.decision.decide import decide
from planner.decision.scale_to_zero import ZeroCase, quiet_for_s, scale_to_zero, zero_pools
from planner.signals.startup_time import StartupTime, measured_startups_s, startup_times
from planner.types import FleetState, LoadHistory, Observation, PoolSizing, PoolState

NOW = 10_000.0


def t(prefill, decode):
    return {"prefill": prefill, "decode": decode}


# -- startup time -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("applied, ready, pool, expected", [
    pytest.param([(0, 1, 1), (100, 1, 3)], [(90, 1, 1), (130, 1, 2), (145, 1, 3)], "decode", [45.0],
                 id="1 -> 3 at 100 s, 3 ready at 145 s: 45 s"),
    pytest.param([(0, 1, 1), (100, 1, 3)], [(130, 1, 2)], "decode", [],
                 id="still starting: not measured"),
    pytest.param([(0, 1, 1), (100, 1, 3), (120, 1, 1)], [(125, 1, 1), (200, 1, 3)], "decode", [],
                 id="changed before ready (3 -> 1 at 120 s): not its own end"),
    pytest.param([(0, 0, 0), (50, 1, 1), (500, 0, 0), (900, 2, 2)],
                 [(40, 0, 0), (58, 1, 1), (600, 0, 0), (930, 1, 1), (961, 2, 2)], "prefill", [8.0, 61.0],
                 id="two wakes from zero: 58-50 = 8 s, 961-900 = 61 s"),
    pytest.param([(0, 2, 1), (100, 1, 1)], [(101, 1, 1)], "prefill", [], id="scale-down: nothing to measure"),
    pytest.param([(100, 1, 3), (0, 1, 1)], [(145, 1, 3)], "decode", [45.0], id="applied out of order: sorted"),
])
def test_measured_startups(applied, ready, pool, expected):
    assert measured_startups_s(pool, applied=applied, ready=ready) == pytest.approx(expected)


def test_startup_times_median_else_configured():
    applied = [(0, 1, 1), (100, 1, 2), (200, 1, 3), (300, 1, 4)]
    ready = [(110, 1, 2), (240, 1, 3), (390, 1, 4)]  # decode: 10, 40, 90 s -> median 40
    out = startup_times(applied=applied, ready=ready, configured_s=60.0)
    assert (out["decode"].startup_s, out["decode"].source, out["decode"].measured_s) == (40.0, "measured",
                                                                                        (10.0, 40.0, 90.0))
    assert (out["prefill"].startup_s, out["prefill"].source) == (60.0, "configured")
    assert "median of 3 measured" in out["decode"].describe() and "configured" in out["prefill"].describe()
    two = startup_times(applied=applied, ready=ready, configured_s=60.0, min_measured=4)
    assert two["decode"].source == "configured"  # 3 measured < 4 asked


@pytest.mark.parametrize("kw, message", [
    (dict(min_measured=0), "min_measured must be >= 1, got 0"),
    (dict(configured_s=-1.0), "configured_s must be >= 0 s, got -1.0"),
])
def test_startup_times_bad_input(kw, message):
    args = dict(applied=(), ready=(), configured_s=60.0) | kw
    with pytest.raises(ValueError, match=message):
        startup_times(**args)


# -- quiet period -----------------------------------------------------------------------------------------


def history(counts, interval_s=60.0):
    n = len(counts)
    return LoadHistory(t_s=tuple(60.0 * (k + 1) for k in range(n)), num_requests=tuple(counts),
                       avg_isl_tokens=(100.0,) * n, avg_osl_tokens=(10.0,) * n, interval_s=interval_s)


@pytest.mark.parametrize("counts, latest, expected", [
    pytest.param([5, 0, 0, 0], 0.0, 180.0, id="three trailing empty intervals: 3 x 60 s"),
    pytest.param([0, 0, 3], 3.0, 0.0, id="latest had requests"),
    pytest.param([0, math.nan, 0], 0.0, 60.0, id="unknown interval ends the quiet"),
    pytest.param([0, 0], None, 0.0, id="latest unknown: not quiet"),
])
def test_quiet_for_s(counts, latest, expected):
    assert quiet_for_s(history(counts), num_requests=latest) == expected


# -- the rule ---------------------------------------------------------------------------------------------


def startup(prefill_s, decode_s, source="measured"):
    return {"prefill": StartupTime("prefill", prefill_s, source, (prefill_s,)),
            "decode": StartupTime("decode", decode_s, source, (decode_s,))}


def case(*, quiet_s=900.0, upper_rps=0.0, ttft_s=2.0, start=(30.0, 60.0), gpus=(1, 1)):
    return ZeroCase(quiet_s=quiet_s, upper_rps=upper_rps, ttft_target_s=ttft_s, interval_s=60.0,
                    startup=startup(*start), gpus_per_replica=t(*gpus))


@pytest.mark.parametrize("targets, current, c, expected, code", [
    pytest.param(t(1, 2), t(1, 2), case(), t(0, 0), "scale_to_zero",
                 id="quiet 900 s >= 600, upper 0 rps: cost 0 < saved 3 x 60/3600 = 0.05 GPU-h"),
    pytest.param(t(0, 0), t(1, 2), case(quiet_s=300.0), t(1, 1), "kept_above_zero",
                 id="quiet 300 s < 600: sizing's 0 raised to 1"),
    pytest.param(t(1, 3), t(1, 3), case(quiet_s=300.0), t(1, 3), None,
                 id="not quiet, targets above zero: untouched"),
    # upper 0.004 rps x 60 s startup = 0.24 late x 0.1 = 0.024 GPU-h < saved (1+2) x 60/3600 = 0.05
    pytest.param(t(1, 2), t(1, 2), case(upper_rps=0.004), t(0, 0), "scale_to_zero", id="0.024 < 0.05 GPU-h: zero"),
    # upper 0.01 rps x 60 s = 0.6 late x 0.1 = 0.06 GPU-h >= 0.05
    pytest.param(t(0, 0), t(1, 2), case(upper_rps=0.01), t(1, 1), "kept_above_zero", id="0.06 >= 0.05 GPU-h: kept"),
    # the same load but startup 1.5 s within the 2 s TTFT target: nobody is late, cost 0
    pytest.param(t(1, 2), t(1, 2), case(upper_rps=0.01, start=(1.0, 1.5)), t(0, 0), "scale_to_zero",
                 id="startup 1.5 s <= TTFT 2 s: no late request"),
    # 8 GPUs a decode replica: saved (1 + 2 x 8) x 60/3600 = 0.283 GPU-h > 0.06
    pytest.param(t(1, 2), t(1, 2), case(upper_rps=0.01, gpus=(1, 8)), t(0, 0), "scale_to_zero",
                 id="bigger replicas save more: 0.06 < 0.283 GPU-h"),
    pytest.param(t(0, 0), t(0, 0), case(upper_rps=5.0), t(0, 0), None, id="already at zero: left to the others"),
    pytest.param(t(2, 2), t(0, 0), case(quiet_s=0.0), t(2, 2), None, id="waking: left to the others"),
    pytest.param(t(0, 0), t(1, 2), None, t(1, 1), "kept_above_zero", id="no case (data missing): kept"),
])
def test_scale_to_zero_rule(targets, current, c, expected, code):
    out, reasons = scale_to_zero(targets, current=current, zero_pools=("prefill", "decode"), case=c,
                                 quiet_needed_s=600.0, late_request_cost_gpu_h=0.1)
    assert out == expected
    assert {r.code.value for r in reasons} == ({code} if code else set())


def test_scale_to_zero_reason_says_which_numbers_decided():
    _, [p, d] = scale_to_zero(t(1, 2), current=t(1, 2), zero_pools=("prefill", "decode"),
                              case=case(upper_rps=0.004), quiet_needed_s=600.0, late_request_cost_gpu_h=0.1)
    assert d.message == ("decode: 2 -> 0: quiet 900 s; upper forecast 0.004 rps x decode startup 60 s "
                         "(median of 1 measured scale-ups) = 0.24 requests late against TTFT 2 s, cold start "
                         "0.024 GPU-h < 0.05 GPU-h saved until the next decision")
    assert d.numbers["startup_s"] == 60.0 and d.numbers["saved_gpu_h"] == pytest.approx(0.05)
    assert d.numbers["cold_start_cost_gpu_h"] == pytest.approx(0.024) and d.numbers["startup_measured"] == 1.0


def test_only_pools_with_min_zero_go():
    assert zero_pools(allow=True, min_replicas=t(1, 0)) == ("decode",)
    assert zero_pools(allow=False, min_replicas=t(0, 0)) == ()
    out, _ = scale_to_zero(t(1, 2), current=t(1, 2), zero_pools=("decode",), case=case(), quiet_needed_s=600.0,
                           late_request_cost_gpu_h=0.1)
    assert out == t(1, 0)


# -- in decide --------------------------------------------------------------------------------------------


def zero_cfg(**kw):
    return DecisionConfig(prefill=PoolBounds(min_replicas=0, max_replicas=4),
                          decode=PoolBounds(min_replicas=0, max_replicas=4), allow_scale_to_zero=True,
                          scale_down_min_history_intervals=0,
                          scale_to_zero=ScaleToZeroConfig(quiet_s=600.0, **kw))


def zero_sizing(upper_rps=0.0):
    numbers = {"ttft_target_ms": 2000.0, "forecast_upper_rps": upper_rps, "replica_startup_s": 60.0}
    return {p: PoolSizing(p, 0, numbers, "no load") for p in ("prefill", "decode")}


def quiet_obs(counts):
    return Observation(taken_at_s=NOW, interval_s=60.0, num_requests=float(counts[-1]), avg_isl_tokens=None,
                       avg_osl_tokens=None, avg_ttft_ms=None, avg_itl_ms=None, history=history(counts))


def zero_fleet(prefill=1, decode=2, **kw):
    return FleetState(prefill=PoolState(prefill, prefill), decode=PoolState(decode, decode), **kw)


def test_decide_goes_to_zero_after_the_quiet_period_past_the_stabilization_window():
    # recommendations of 1 and 2 within the 300 s window would hold the scale-down; ten quiet minutes override
    recent = ((NOW - 120, 1, 2),)
    d = decide(sizing=zero_sizing(), saturation=None, fleet=zero_fleet(recent_targets=recent),
               obs=quiet_obs([9] + [0] * 10), cfg=zero_cfg(), now_s=NOW)
    assert (d.prefill_replicas, d.decode_replicas, d.apply) == (0, 0, True)
    assert "scale_to_zero" in d.codes()


def test_decide_keeps_one_replica_before_the_quiet_period():
    d = decide(sizing=zero_sizing(), saturation=None, fleet=zero_fleet(), obs=quiet_obs([9] + [0] * 5),
               cfg=zero_cfg(), now_s=NOW)
    assert (d.prefill_replicas, d.decode_replicas) == (1, 1)
    assert "kept_above_zero" in d.codes()


def test_decide_measures_startup_from_the_fleets_history():
    # decode woke 0 -> 1 at 1000 s and was ready at 1300 s: 300 s startup; upper 0.002 rps x 300 s = 0.6
    # late x 0.1 = 0.06 GPU-h >= saved 3 x 60/3600 = 0.05: kept; with the configured 60 s it would go (0.012)
    fl = zero_fleet(applied_targets=((900, 0, 0), (1000, 1, 1)), ready_history=((1100, 1, 0), (1300, 1, 1)))
    d = decide(sizing=zero_sizing(upper_rps=0.002), saturation=None, fleet=fl, obs=quiet_obs([0] * 12),
               cfg=zero_cfg(), now_s=NOW)
    assert (d.prefill_replicas, d.decode_replicas) == (1, 1)
    kept = next(r for r in d.reasons if r.code.value == "kept_above_zero")
    assert kept.numbers["startup_s"] == 300.0 and kept.numbers["startup_measured"] == 1.0
    d = decide(sizing=zero_sizing(upper_rps=0.002), saturation=None, fleet=zero_fleet(), obs=quiet_obs([0] * 12),
               cfg=zero_cfg(), now_s=NOW)
    assert (d.prefill_replicas, d.decode_replicas) == (0, 0)


# -- what the run says ------------------------------------------------------------------------------------


def test_the_run_message_names_scale_to_zero_and_kept_above_zero():
    from types import SimpleNamespace

    from flows.report import run_message

    fl = zero_fleet(recent_targets=((NOW - 120, 1, 2),))
    d = decide(sizing=zero_sizing(), saturation=None, fleet=fl, obs=quiet_obs([9] + [0] * 10), cfg=zero_cfg(),
               now_s=NOW)
    # the stabilization window's hold comes before the rule in the reasons; the message names what decided
    assert run_message(SimpleNamespace(decision=d, fleet=fl, start_note=""), record=None,
                       applying=True) == "scaled down: scale to zero (not written)"
    kept = decide(sizing=zero_sizing(), saturation=None, fleet=zero_fleet(1, 1), obs=quiet_obs([9] + [0] * 5),
                  cfg=zero_cfg(), now_s=NOW)
    assert run_message(SimpleNamespace(decision=kept, fleet=zero_fleet(1, 1), start_note=""), record=None,
                       applying=True) == "unchanged: kept above zero"
