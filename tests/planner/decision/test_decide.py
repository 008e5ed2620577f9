"""Decision step: one table per rule, then `decide` end to end.

Pools are written (prefill, decode). Unless a case says otherwise: bounds 1..16,
no GPU budget, no step limit, stabilization 300 s, 1 GPU per replica.
"""

from __future__ import annotations

import math

import pytest

from planner.config import DecisionConfig, PoolBounds, SaturationThresholds
from planner.decision.decide import decide, finish
from planner.decision.gates import missing_load_metrics, partial_metrics_gate, previous_decision_gate, stale_gate
from planner.decision.rules import apply_guardrail, clamp_to_bounds, hold_on_partial_metrics, limit_step, sizing_targets
from planner.decision.gpu_budget import fit_gpu_budget
from planner.decision.stabilization import floor_scale_down, hold_scale_down_in_warmup, stabilize_scale_down, start_from_warmup
from planner.saturation.guardrail import analyze_pool
from planner.types import (
    DecisionRecord,
    LoadHistory,
    FleetState,
    Observation,
    PodMetrics,
    PoolSizing,
    PoolState,
    ReasonCode,
    ScrapeCoverage,
    StartFloor,
)

NOW = 10_000.0


def t(prefill, decode):
    return {"prefill": prefill, "decode": decode}


def cfg(**kw):
    for pool in ("prefill", "decode"):
        if isinstance(kw.get(pool), tuple):
            kw[pool] = PoolBounds(min_replicas=kw[pool][0], max_replicas=kw[pool][1])
    return DecisionConfig(**kw)


def fleet(prefill=2, decode=4, *, gpus=(1, 1), last=None, history=(), ready=None):
    ready = ready or (prefill, decode)
    return FleetState(
        prefill=PoolState(current_replicas=prefill, ready_replicas=ready[0], gpus_per_replica=gpus[0]),
        decode=PoolState(current_replicas=decode, ready_replicas=ready[1], gpus_per_replica=gpus[1]),
        last_decision=last,
        recent_targets=tuple(history),
    )


def obs(*, num_requests=600.0, isl=1000.0, osl=200.0, taken_at_s=NOW, stale=(), pods=(), coverage=()):
    return Observation(
        taken_at_s=taken_at_s, interval_s=60.0, num_requests=num_requests, avg_isl_tokens=isl,
        avg_osl_tokens=osl, avg_ttft_ms=120.0, avg_itl_ms=9.0, pods=tuple(pods), stale_reasons=tuple(stale),
        coverage=tuple(coverage),
    )


def frontends(expected, present, detail=""):
    return ScrapeCoverage("frontend targets", expected, present, detail)


def sizing(prefill, decode):
    return {
        "prefill": PoolSizing("prefill", prefill, {"load_rps": 10.0}, "prefill sized"),
        "decode": PoolSizing("decode", decode, {"load_rps": 10.0}, "decode sized"),
    }


def pool_pods(pool, kv_and_queue):
    return [PodMetrics(pod=f"{pool}-{i}", pool=pool, kv_usage_frac=kv, queue_length=q)
            for i, (kv, q) in enumerate(kv_and_queue)]


def guardrail(fl, pods, **kw):
    """Pool verdicts from the real analyzer with WVA's defaults."""
    return {p: analyze_pool(pool=p, pods=pods, state=getattr(fl, p), thresholds=SaturationThresholds(), **kw)
            for p in ("prefill", "decode")}


def codes(reasons):
    return [(r.code, r.pool) for r in reasons]


# ---------------------------------------------------------------- gates


@pytest.mark.parametrize(
    "last, hold, timed_out",
    [
        pytest.param(None, False, False, id="no previous decision: decide"),
        pytest.param(DecisionRecord(7, NOW - 100, 3, 5, done=True), False, False, id="previous done: decide"),
        pytest.param(DecisionRecord(7, NOW - 100, 3, 5, done=False), True, False,
                     id="not done, 100 s < 1800 s: hold"),
        pytest.param(DecisionRecord(7, NOW - 1800, 3, 5, done=False), False, True,
                     id="not done, 1800 s >= 1800 s: timed out, decide again"),
    ],
)
def test_previous_decision_gate(last, hold, timed_out):
    h, note = previous_decision_gate(fleet=fleet(last=last), cfg=cfg(), now_s=NOW)
    assert (h is not None, note is not None) == (hold, timed_out)
    if h:
        assert h.code == ReasonCode.HOLD_PREVIOUS_NOT_DONE and h.numbers["age_s"] == 100
    if note:
        assert note.code == ReasonCode.PREVIOUS_DECISION_TIMED_OUT and note.numbers["decision_id"] == 7


@pytest.mark.parametrize(
    "o, max_age, stale",
    [
        pytest.param(obs(), None, False, id="fresh"),
        pytest.param(obs(stale=("prometheus: newest sample 340 s old",)), None, True, id="collect flagged stale"),
        pytest.param(obs(taken_at_s=NOW - 121), None, True, id="121 s old > 2 x 60 s interval"),
        pytest.param(obs(taken_at_s=NOW - 120), None, False, id="120 s old = 2 x 60 s: still fresh"),
        pytest.param(obs(taken_at_s=NOW - 31), 30.0, True, id="31 s > configured 30 s"),
    ],
)
def test_stale_gate(o, max_age, stale):
    r = stale_gate(obs=o, cfg=cfg(max_observation_age_s=max_age), now_s=NOW)
    assert (r is not None) == stale
    if r:
        assert r.code == ReasonCode.HOLD_STALE_METRICS


@pytest.mark.parametrize(
    "o, missing",
    [
        pytest.param(obs(), (), id="all present"),
        pytest.param(obs(num_requests=None), ("num_requests",), id="requests None"),
        pytest.param(obs(num_requests=math.nan), ("num_requests",), id="requests NaN"),
        pytest.param(obs(isl=math.nan, osl=None), ("avg_isl_tokens", "avg_osl_tokens"), id="ISL NaN, OSL None"),
        pytest.param(obs(num_requests=0.0, isl=math.nan, osl=math.nan), (),
                     id="0 requests: ISL/OSL undefined, not missing"),
    ],
)
def test_missing_load_metrics(o, missing):
    assert missing_load_metrics(o) == missing


# ---------------------------------------------------------------- rules


@pytest.mark.parametrize(
    "coverage, max_frac, held",
    [
        pytest.param((), 0.0, False, id="not measured: no hold"),
        pytest.param((frontends(2, 2),), 0.0, False, id="2 of 2 frontend targets up"),
        pytest.param((frontends(2, 1, "down: fe-b"),), 0.0, True, id="1 of 2 down: 0.5 > 0"),
        pytest.param((frontends(0, 0, "not checked: no up series"),), 0.0, False, id="none expected: not checked"),
        pytest.param((frontends(4, 3),), 0.25, False, id="1 of 4 = 0.25, not > 0.25"),
        pytest.param((frontends(4, 2),), 0.25, True, id="2 of 4 = 0.5 > 0.25"),
        pytest.param((ScrapeCoverage("decode workers", 4, 3),), 0.0, True, id="3 of 4 decode workers report"),
        pytest.param((ScrapeCoverage("decode workers", 2, 3),), 0.0, False, id="3 pods, 2 ready: none missing"),
    ],
)
def test_partial_metrics_gate(coverage, max_frac, held):
    reason = partial_metrics_gate(obs=obs(coverage=coverage), cfg=cfg(partial_metrics_max_missing_frac=max_frac))
    assert (reason is not None) == held
    if held:
        assert reason.code == ReasonCode.HOLD_PARTIAL_METRICS and reason.pool is None


def test_partial_metrics_gate_names_what_is_missing_with_numbers():
    reason = partial_metrics_gate(obs=obs(coverage=(frontends(2, 1, "down: 10.0.0.7:8000"), frontends(0, 0))),
                                  cfg=cfg())
    assert reason.message.startswith("metrics partial: 1 of 2 frontend targets missing (down: 10.0.0.7:8000): ")
    assert reason.numbers == {"max_missing_frac": 0.0, "frontend_targets_expected": 2.0,
                              "frontend_targets_present": 1.0}


@pytest.mark.parametrize(
    "targets, expected",
    [
        pytest.param(t(1, 1), t(2, 4), id="sized down on half the load: held at current"),
        pytest.param(t(3, 6), t(3, 6), id="a scale-up from what is present is a lower bound: stands"),
        pytest.param(t(1, 6), t(2, 6), id="one pool down (held), the other up (stands)"),
    ],
)
def test_hold_on_partial_metrics(targets, expected):
    partial = partial_metrics_gate(obs=obs(coverage=(frontends(2, 1),)), cfg=cfg())
    out, reasons = hold_on_partial_metrics(targets, current=t(2, 4), partial=partial)
    assert out == expected
    assert codes(reasons) == [(ReasonCode.HOLD_PARTIAL_METRICS, None)]
    assert reasons[0].numbers["prefill_sized_replicas"] == targets["prefill"]
    assert hold_on_partial_metrics(targets, current=t(2, 4), partial=None) == (targets, [])


def test_sizing_targets_take_the_sla_sizing():
    targets, reasons = sizing_targets(sizing=sizing(3, 6), current=t(2, 4), missing=())
    assert targets == t(3, 6)
    assert codes(reasons) == [(ReasonCode.SLA_SIZING, "prefill"), (ReasonCode.SLA_SIZING, "decode")]
    assert reasons[1].numbers == {"load_rps": 10.0, "sizing_replicas": 6.0}


@pytest.mark.parametrize(
    "sz, missing, expected",
    [
        pytest.param(sizing(1, 1), ("num_requests",), t(2, 4), id="load missing: hold current (2, 4)"),
        pytest.param({"prefill": sizing(1, 1)["prefill"]}, (), t(1, 4), id="decode sizing absent: decode holds 4"),
    ],
)
def test_sizing_targets_hold_current_when_data_is_missing(sz, missing, expected):
    targets, reasons = sizing_targets(sizing=sz, current=t(2, 4), missing=missing)
    assert targets == expected
    assert any(r.code == ReasonCode.HOLD_MISSING_METRICS for r in reasons)


def test_sizing_targets_reject_negative_sizing():
    with pytest.raises(ValueError, match="sizing for prefill must be an integer >= 0 replicas, got -1"):
        sizing_targets(sizing=sizing(-1, 1), current=t(2, 4), missing=())


@pytest.mark.parametrize(
    "requested, decode_pods, expected, code",
    [
        pytest.param(4, [(0.75, 1), (0.76, 1), (0.7, 1), (0.7, 1)], 5, ReasonCode.SATURATION_SCALE_UP,
                     id="KV spare 0.0675 < 0.1: sizing 4 raised to 4+1 = 5"),
        pytest.param(8, [(0.75, 1), (0.76, 1), (0.7, 1), (0.7, 1)], 8, None,
                     id="sizing 8 already above the guardrail's 5: kept"),
        pytest.param(2, [(0.6, 0), (0.6, 0), (0.6, 0), (0.6, 0)], 4, ReasonCode.SATURATION_VETO_SCALE_DOWN,
                     id="KV 0.6 x4: 0.8-0.6*4/3 < 0.1, unsafe: scale-down to 2 vetoed, keep 4"),
        pytest.param(1, [(0.3, 0)] * 4, 2, ReasonCode.SATURATION_VETO_SCALE_DOWN,
                     id="KV 0.3 x4: at most 2 can go (0.8-0.3*4/2 = 0.2): 1 limited to 2"),
        pytest.param(3, [(0.3, 0)] * 4, 3, None, id="KV 0.3 x4: sizing 3 is within the safe 2"),
        pytest.param(2, [(0.3, 0)] * 3, 4, ReasonCode.TRANSITION_IN_PROGRESS,
                     id="3 of 4 decode pods report: frozen at 4"),
    ],
)
def test_apply_guardrail(requested, decode_pods, expected, code):
    fl = fleet(2, 4)
    sat = guardrail(fl, pool_pods("decode", decode_pods))
    targets, reasons = apply_guardrail(t(2, requested), saturation=sat, current=t(2, 4))
    assert targets == t(2, expected)
    got = [r.code for r in reasons if r.pool == "decode"]
    if code is None:
        assert not any(c in (ReasonCode.SATURATION_SCALE_UP, ReasonCode.SATURATION_VETO_SCALE_DOWN) for c in got)
    else:
        assert code in got
    for r in reasons:
        assert "floor_replicas" in r.numbers and "avg_spare_kv_frac" in r.numbers or r.code in (
            ReasonCode.TRANSITION_IN_PROGRESS, ReasonCode.HOLD_MISSING_METRICS)


def test_apply_guardrail_vetoes_on_missing_pod_metrics_and_says_so():
    fl = fleet(2, 2)
    sat = guardrail(fl, pool_pods("decode", [(0.1, 0), (None, None)]))
    targets, reasons = apply_guardrail(t(2, 1), saturation=sat, current=t(2, 2))
    assert targets == t(2, 2)
    assert (ReasonCode.HOLD_MISSING_METRICS, "decode") in codes(reasons)


def test_apply_guardrail_disabled_changes_nothing():
    assert apply_guardrail(t(1, 1), saturation=None, current=t(2, 4)) == (t(1, 1), [])


def test_apply_guardrail_lets_an_idle_pool_reach_zero_when_allowed():
    fl = fleet(1, 1)
    sat = guardrail(fl, pool_pods("prefill", [(0.0, 0)]) + pool_pods("decode", [(0.0, 0)]))
    assert apply_guardrail(t(0, 0), saturation=sat, current=t(1, 1), idle_scale_to_zero=True)[0] == t(0, 0)
    assert apply_guardrail(t(0, 0), saturation=sat, current=t(1, 1))[0] == t(1, 1)


def test_apply_guardrail_rejects_a_verdict_from_another_fleet_read():
    sat = guardrail(fleet(2, 4), pool_pods("decode", [(0.1, 0)] * 4))
    with pytest.raises(ValueError, match="saturation for prefill saw 2 replicas, fleet says 3"):
        apply_guardrail(t(2, 4), saturation=sat, current=t(3, 4))


@pytest.mark.parametrize(
    "targets, bounds, expected, reason",
    [
        pytest.param(t(3, 5), {}, t(3, 5), [], id="inside 1..16"),
        pytest.param(t(0, 5), {}, t(1, 5), [(ReasonCode.CLAMPED_MIN, "prefill")], id="0 -> min 1"),
        pytest.param(t(3, 20), {"decode": (2, 12)}, t(3, 12), [(ReasonCode.CLAMPED_MAX, "decode")], id="20 -> max 12"),
    ],
)
def test_clamp_to_bounds(targets, bounds, expected, reason):
    out, reasons = clamp_to_bounds(targets, cfg=cfg(**bounds))
    assert out == expected and codes(reasons) == reason


@pytest.mark.parametrize(
    "targets, history, expected",
    [
        pytest.param(t(2, 2), [(NOW - 100, 3, 6)], t(2, 4), id="decode 4->2, recommended 6 100 s ago: min(4, 6) = 4"),
        pytest.param(t(2, 2), [(NOW - 100, 2, 3)], t(2, 3), id="decode 4->2, max recent 3: down to 3 only"),
        pytest.param(t(2, 2), [(NOW - 301, 2, 6)], t(2, 2), id="6 was 301 s ago, outside 300 s: down to 2"),
        pytest.param(t(1, 2), [(NOW - 200, 2, 3), (NOW - 50, 1, 2)], t(2, 3),
                     id="max over window: prefill max(1,2,1) = 2, decode max(2,3,2) = 3"),
        pytest.param(t(5, 6), [(NOW - 10, 1, 1)], t(5, 6), id="scale-ups are never delayed"),
        pytest.param(t(1, 1), [], t(1, 1), id="no history: nothing to hold on to"),
    ],
)
def test_stabilize_scale_down(targets, history, expected):
    out, reasons = stabilize_scale_down(targets, current=t(2, 4), history=history, window_s=300.0, now_s=NOW)
    assert out == expected
    assert all(r.code == ReasonCode.STABILIZATION_WINDOW for r in reasons)
    assert len(reasons) == sum(out[p] != targets[p] for p in ("prefill", "decode"))


@pytest.mark.parametrize(
    "targets, history, rank, expected",
    [
        pytest.param(t(1, 1), [(NOW - 200, 1, 2), (NOW - 100, 2, 4)], 2, t(1, 2),
                     id="one burst (2, 4) among two runs: held at what the other reached, (1, 2)"),
        pytest.param(t(1, 1), [(NOW - 100, 2, 4)], 2, t(2, 4),
                     id="a single run in the window: fewer than rank, held at the lowest of them"),
        pytest.param(t(1, 1), [(NOW - 200, 2, 3), (NOW - 100, 2, 4)], 2, t(2, 3),
                     id="two runs: prefill 2 reached twice, decode 3 reached twice (4 once)"),
        pytest.param(t(1, 1), [(NOW - 250, 1, 4), (NOW - 200, 1, 2), (NOW - 100, 2, 3)], 3, t(1, 2),
                     id="rank 3: the third highest of prefill (2, 1, 1) and decode (4, 3, 2)"),
        pytest.param(t(1, 1), [(NOW - 100, 2, 4)], 1, t(2, 4), id="rank 1 is HPA's highest"),
        pytest.param(t(1, 1), [(NOW - 350, 2, 4), (NOW - 340, 2, 4), (NOW - 200, 1, 1), (NOW - 10, 1, 3)], 2,
                     t(1, 1), id="recurrences outside the window do not count"),
    ],
)
def test_stabilize_scale_down_holds_what_recurred(targets, history, rank, expected):
    out, reasons = stabilize_scale_down(targets, current=t(2, 4), history=history, window_s=300.0, now_s=NOW,
                                        rank=rank, why=" (why)")
    assert out == expected
    assert all(f"in the last 300 s (why) was {out[r.pool]}" in r.message for r in reasons)
    assert len(reasons) == sum(out[p] != targets[p] for p in ("prefill", "decode"))


def test_stabilize_scale_down_refuses_rank_zero():
    with pytest.raises(ValueError, match="rank must be >= 1, got 0"):
        stabilize_scale_down(t(1, 1), current=t(2, 4), history=[(NOW, 2, 4)], window_s=300.0, now_s=NOW, rank=0)


@pytest.mark.parametrize(
    "targets, history, window_s, frac, expected",
    [
        pytest.param(t(1, 1), [(NOW - 3000, 7, 3)], 3600.0, 0.5, t(2, 2),
                     id="highest 7 and 3 within the hour: down to ceil(3.5) = 4, capped at current 2; ceil(1.5) = 2"),
        pytest.param(t(1, 1), [(NOW - 3000, 4, 7)], 3600.0, 0.5, t(2, 4),
                     id="decode's floor ceil(3.5) = 4 is its current: held there"),
        pytest.param(t(1, 2), [(NOW - 3000, 2, 6), (NOW - 60, 1, 1)], 3600.0, 0.5, t(1, 3),
                     id="the highest of the window counts, not the newest: decode down to 3"),
        pytest.param(t(1, 1), [(NOW - 3601, 9, 9)], 3600.0, 0.5, t(1, 1), id="older than the window: no floor"),
        pytest.param(t(1, 1), [(NOW - 100, 2, 5)], 3600.0, 0.25, t(1, 2),
                     id="a quarter: ceil(0.5) = 1, ceil(1.25) = 2"),
        pytest.param(t(1, 1), [(NOW - 100, 9, 9)], None, 0.5, t(1, 1), id="no window: off"),
        pytest.param(t(5, 6), [(NOW - 100, 9, 9)], 3600.0, 0.5, t(5, 6), id="scale-ups are never touched"),
    ],
)
def test_floor_scale_down(targets, history, window_s, frac, expected):
    out, reasons = floor_scale_down(targets, current=t(2, 4), history=history, window_s=window_s, frac=frac,
                                    now_s=NOW)
    assert out == expected
    assert [r.pool for r in reasons] == [p for p in ("prefill", "decode") if out[p] != targets[p]]
    assert all(r.code == ReasonCode.SCALE_DOWN_FLOOR and f"{frac:.0%} of the highest" in r.message for r in reasons)


def test_decide_keeps_a_share_of_the_hours_highest_after_the_stabilization_window():
    """A burst 50 min ago sized prefill 8: the 300 s window has let go, the floor keeps 4 of the 6 running."""
    history = [(NOW - 3000, 8, 1), (NOW - 200, 2, 1), (NOW - 100, 2, 1)]
    d = run(fl=fleet(6, 1, history=history), sz=sizing(2, 1), sat=None)  # the default: an hour, half
    assert (d.prefill_replicas, d.recommended_prefill_replicas) == (4, 2)
    assert (ReasonCode.SCALE_DOWN_FLOOR, "prefill") in codes(d.reasons)
    off = run(fl=fleet(6, 1, history=history), sz=sizing(2, 1), sat=None, scale_down_floor_s=None)
    assert off.prefill_replicas == 2 and "scale_down_floor" not in off.codes()


def _sized_on(prefill, decode, *, mean):
    out = sizing(prefill, decode)
    for s in out.values():
        s.numbers["sized_on_mean"] = 1.0 if mean else 0.0
    return out


@pytest.mark.parametrize(
    "mean, config, expected_decode",
    [
        pytest.param(True, {"independent_stabilization_s": 360.0}, 3,
                     id="sized on the mean, recurrence hold on: decode 3 recurred (6 once, 340 s ago counts)"),
        pytest.param(False, {"independent_stabilization_s": 360.0}, 4,
                     id="sized on the p90 (arrivals clump): HPA's highest over 300 s, 4 (capped at current)"),
        pytest.param(True, {}, 4, id="sized on the mean, recurrence hold off (the default): HPA's highest"),
        pytest.param(True, {"independent_stabilization_s": 360.0, "independent_stabilization_rank": 1}, 4,
                     id="rank 1 over 360 s: the highest"),
    ],
)
def test_decide_holds_by_recurrence_only_when_arrivals_look_independent(mean, config, expected_decode):
    history = [(NOW - 340, 2, 3), (NOW - 200, 2, 6), (NOW - 100, 2, 3)]
    d = run(fl=fleet(2, 4, history=history), sz=_sized_on(2, 1, mean=mean), sat=None, **config)
    assert d.decode_replicas == expected_decode and d.recommended_decode_replicas == 1
    held = [r for r in d.reasons if r.code == ReasonCode.STABILIZATION_WINDOW]
    recurrence = mean and "independent_stabilization_s" in config
    assert len(held) == 1 and ("arrivals look independent" in held[0].message) == recurrence


def test_recommendation_window_covers_every_hold():
    assert cfg().recommendation_window == ("scale_down_floor_s", 3600.0)  # the default floor's hour
    hpa = {"scale_down_floor_s": None}
    assert cfg(**hpa).recommendation_window == ("scale_down_stabilization_s", 300.0)
    assert cfg(**hpa, independent_stabilization_s=360.0).recommendation_window == ("independent_stabilization_s",
                                                                                   360.0)
    assert cfg(**hpa, independent_stabilization_s=120.0).recommendation_window == ("scale_down_stabilization_s",
                                                                                   300.0)
    assert cfg(scale_down_floor_s=3600.0, independent_stabilization_s=4200.0).recommendation_window == (
        "independent_stabilization_s", 4200.0)


@pytest.mark.parametrize(
    "targets, history_intervals, min_intervals, expected",
    [
        pytest.param(t(1, 1), 1, 5, t(2, 4), id="1 of 5 intervals: both scale-downs held at current (2, 4)"),
        pytest.param(t(1, 6), 4, 5, t(2, 6), id="4 of 5: prefill down held, decode up goes ahead"),
        pytest.param(t(1, 1), 5, 5, t(1, 1), id="5 of 5: enough history, scale down"),
        pytest.param(t(1, 1), None, 5, t(1, 1), id="no history collected: the rule does not apply"),
        pytest.param(t(1, 1), 0, 0, t(1, 1), id="min 0: off"),
        pytest.param(t(3, 9), 1, 5, t(3, 9), id="scale-ups are never delayed"),
    ],
)
def test_hold_scale_down_in_warmup(targets, history_intervals, min_intervals, expected):
    out, reasons = hold_scale_down_in_warmup(
        targets, current=t(2, 4), history_intervals=history_intervals, min_intervals=min_intervals)
    assert out == expected
    assert [r.pool for r in reasons] == [p for p in ("prefill", "decode") if out[p] != targets[p]]
    assert all(r.code == ReasonCode.WARMUP_NO_SCALE_DOWN and r.numbers["history_intervals"] == history_intervals
               for r in reasons)


def _history(n):
    return LoadHistory(t_s=tuple(NOW - 60.0 * i for i in range(n, 0, -1)), num_requests=(600.0,) * n,
                       avg_isl_tokens=(1000.0,) * n, avg_osl_tokens=(200.0,) * n, interval_s=60.0)


def test_decide_does_not_scale_down_a_just_started_planner():
    """One interval of history: the sizing's (1, 1) is held at the start fleet; with five, it goes ahead."""
    import dataclasses

    young = run(sz=sizing(1, 1), o=dataclasses.replace(obs(), history=_history(1)))
    assert (young.prefill_replicas, young.decode_replicas, young.apply) == (2, 4, False)
    assert (ReasonCode.WARMUP_NO_SCALE_DOWN, "decode") in codes(young.reasons)
    assert (young.recommended_prefill_replicas, young.recommended_decode_replicas) == (1, 1)
    grown = run(sz=sizing(1, 1), o=dataclasses.replace(obs(), history=_history(5)))
    assert (grown.prefill_replicas, grown.decode_replicas, grown.apply) == (1, 1, True)


@pytest.mark.parametrize(
    "targets, floor, expected",
    [
        pytest.param(t(2, 1), t(5, 2), t(5, 2), id="both below the warm-up's window: raised to it (a scale-up)"),
        pytest.param(t(6, 1), t(5, 2), t(6, 2), id="prefill above the floor keeps its sizing, decode raised"),
        pytest.param(t(5, 2), t(5, 2), t(5, 2), id="at the floor: nothing to raise"),
        pytest.param(t(1, 1), None, t(1, 1), id="no floor (no warm-up, or the window is the planner's own)"),
    ],
)
def test_start_from_warmup(targets, floor, expected):
    out, reasons = start_from_warmup(
        targets, floor=None if floor is None else StartFloor(targets=floor, intervals=3, window_s=300.0))
    assert out == expected
    assert [r.pool for r in reasons] == [p for p in ("prefill", "decode") if out[p] != targets[p]]
    assert all(r.code == ReasonCode.WARMUP_START_FLOOR and r.numbers["warmup_intervals"] == 3
               and "last 3 intervals" in r.message for r in reasons)


@pytest.mark.parametrize(
    "config, expected",
    [
        pytest.param({}, (6, 2), id="from (2, 4): prefill up to the warm-up's 6, decode down only to its 2"),
        pytest.param({"max_step_replicas": 2}, (4, 2), id="the step limit holds for the floor too"),
        pytest.param({"prefill": (1, 5)}, (5, 2), id="the bounds win over the floor"),
    ],
)
def test_decide_starts_a_warmed_planner_where_its_warmup_held(config, expected):
    """The recommendation stays the sizing's (the window the planner fills is its own); only the targets rise."""
    floor = StartFloor(targets=t(6, 2), intervals=4, window_s=300.0)
    d = decide(sizing=sizing(2, 1), saturation=None, fleet=fleet(), obs=obs(), cfg=cfg(**config), now_s=NOW,
               start_floor=floor)
    assert (d.prefill_replicas, d.decode_replicas) == expected
    assert (d.recommended_prefill_replicas, d.recommended_decode_replicas) == (2, 1)
    assert (ReasonCode.WARMUP_START_FLOOR, "prefill") in codes(d.reasons)


def test_stabilization_window_zero_disables_it():
    assert stabilize_scale_down(t(1, 1), current=t(2, 4), history=[(NOW, 9, 9)], window_s=0, now_s=NOW) == (t(1, 1), [])


@pytest.mark.parametrize(
    "targets, max_step, expected",
    [
        pytest.param(t(9, 1), 2, t(4, 2), id="step 2 from (2, 4): 9 -> 2+2 = 4, 1 -> 4-2 = 2"),
        pytest.param(t(3, 5), 2, t(3, 5), id="within the step"),
        pytest.param(t(9, 4), None, t(9, 4), id="no step limit"),
    ],
)
def test_limit_step(targets, max_step, expected):
    out, reasons = limit_step(targets, current=t(2, 4), max_step=max_step)
    assert out == expected
    assert {r.pool for r in reasons} == {p for p in ("prefill", "decode") if out[p] != targets[p]}


@pytest.mark.parametrize(
    "targets, gpus, budget, bounds, expected",
    [
        pytest.param(t(4, 6), (1, 1), 10, {}, t(4, 6), id="4+6 = 10 GPUs fit 10"),
        pytest.param(t(10, 10), (1, 1), 10, {}, t(5, 5), id="20 GPUs -> 10: both halved, 5/5"),
        pytest.param(t(6, 9), (1, 1), 10, {}, t(4, 6),
                     id="15 -> 10: x2/3 = 4.0/6.0 -> 4/6"),
        pytest.param(t(5, 8), (1, 1), 10, {}, t(4, 6),
                     id="13 -> 10: x10/13 = 3.85/6.15 -> 3/6, +1 to larger remainder prefill (.85) -> 4/6"),
        pytest.param(t(4, 8), (2, 1), 12, {}, t(3, 6),
                     id="16 GPUs -> 12: x3/4 = 3 (6 GPUs) / 6 (6 GPUs)"),
        pytest.param(t(10, 10), (1, 1), 10, {"prefill": (7, 16)}, t(7, 3),
                     id="10x0.5 = 5 < min 7: prefill held at 7, decode gets the other 3"),
        pytest.param(t(3, 3), (4, 4), 10, {}, t(1, 1),
                     id="6 x 4 = 24 GPUs -> 10: x10/24 = 1.25 -> 1/1 (8 GPUs), +1 would need 12"),
        pytest.param(t(5, 5), (1, 1), 3, {"prefill": (2, 16), "decode": (2, 16)}, t(2, 2),
                     id="mins need 4 > 3: unsatisfiable, hold the mins"),
    ],
)
def test_fit_gpu_budget(targets, gpus, budget, bounds, expected):
    out, reasons = fit_gpu_budget(targets, gpus_per_replica=t(*gpus), cfg=cfg(max_gpu_budget=budget, **bounds))
    assert out == expected
    assert all(out[p] <= targets[p] for p in out)
    if out != targets:
        assert [r.code for r in reasons] == [ReasonCode.GPU_BUDGET]
        assert reasons[0].numbers["max_gpu_budget"] == budget


def test_fit_gpu_budget_rejects_bad_gpus_per_replica():
    with pytest.raises(ValueError, match="decode gpus_per_replica must be an integer >= 1, got 0"):
        fit_gpu_budget(t(1, 1), gpus_per_replica=t(1, 0), cfg=cfg(max_gpu_budget=4))


def test_finish_marks_unchanged_and_changes():
    same = finish(t(2, 4), baseline=t(2, 4), reasons=[], recommended=t(2, 4))
    assert not same.apply and same.codes() == ["unchanged"]
    moved = finish(t(3, 2), baseline=t(2, 4), reasons=[], recommended=t(3, 1))
    assert moved.apply and moved.codes() == ["scale_up", "scale_down"]
    assert (moved.recommended_prefill_replicas, moved.recommended_decode_replicas) == (3, 1)


# ---------------------------------------------------------------- decide end to end


def run(*, fl=None, sz=None, o=None, sat="auto", **config):
    fl = fl or fleet()
    o = o or obs()
    if sat == "auto":
        sat = guardrail(fl, o.pods) if o.pods else None
    return decide(sizing=sz or sizing(2, 4), saturation=sat, fleet=fl, obs=o, cfg=cfg(**config), now_s=NOW)


def steady_pods(prefill=2, decode=4, kv=0.5, queue=1):
    """Every pod at the same KV usage and queue (default 0.5 / 1: spare 0.3 / 4, no scale-up)."""
    return pool_pods("prefill", [(kv, queue)] * prefill) + pool_pods("decode", [(kv, queue)] * decode)


@pytest.mark.parametrize(
    "sz, pods, expected, apply, must_have",
    [
        pytest.param(sizing(2, 4), steady_pods(), (2, 4), False, ["sla_sizing", "unchanged"],
                     id="sizing = current: unchanged, apply False"),
        pytest.param(sizing(3, 6), steady_pods(), (3, 6), True, ["scale_up"], id="SLA scale-up to (3, 6)"),
        pytest.param(sizing(2, 3), steady_pods(), (2, 3), True, ["scale_down"],
                     id="SLA asks decode 3, KV 0.5 x4: 0.8-0.5*4/3 = 0.133 >= 0.1, one may go -> 3"),
        pytest.param(sizing(2, 2), steady_pods(), (2, 3), True, ["saturation_veto_scale_down", "scale_down"],
                     id="SLA asks decode 2, KV 0.5 x4: two fewer leaves 0.8-0.5*2 < 0.1 -> limited to 3"),
        pytest.param(sizing(2, 2), steady_pods(kv=0.6), (2, 4), False, ["saturation_veto_scale_down", "unchanged"],
                     id="SLA asks decode 2, KV 0.6 x4: 0.8-0.6*4/3 = 0 < 0.1 -> vetoed, keep 4"),
        pytest.param(sizing(2, 4), steady_pods(kv=0.75), (3, 5), True, ["saturation_scale_up", "scale_up"],
                     id="KV 0.75 everywhere: spare 0.05 < 0.1 -> both pools +1"),
        pytest.param(sizing(2, 2), steady_pods(kv=0.1, queue=0), (2, 2), True, ["scale_down"],
                     id="KV 0.1 x4, no history: 0.8-0.1*4/2 = 0.6 safe for 2 removals -> decode 2"),
    ],
)
def test_decide_combines_sizing_and_guardrail(sz, pods, expected, apply, must_have):
    d = run(sz=sz, o=obs(pods=pods))
    assert (d.prefill_replicas, d.decode_replicas, d.apply) == (*expected, apply)
    for code in must_have:
        assert code in d.codes()


def test_decide_holds_while_previous_decision_in_flight():
    last = DecisionRecord(3, NOW - 60, 3, 6, done=False)
    d = run(fl=fleet(2, 4, last=last), sz=sizing(8, 8), o=obs(pods=steady_pods()))
    assert (d.prefill_replicas, d.decode_replicas, d.apply) == (3, 6, False)
    assert d.codes() == ["hold_previous_not_done", "unchanged"]


def test_decide_decides_again_once_previous_times_out():
    last = DecisionRecord(3, NOW - 1800, 3, 6, done=False)
    d = run(fl=fleet(2, 4, last=last), sz=sizing(8, 8), o=obs(pods=steady_pods()), wait_for_previous_s=1800)
    assert (d.prefill_replicas, d.decode_replicas, d.apply) == (8, 8, True)
    assert d.codes()[0] == "previous_decision_timed_out"


@pytest.mark.parametrize(
    "age_s, sz, bound, expected, first",
    [
        pytest.param(60, sizing(8, 8), 600, (3, 6, False), "hold_previous_not_done",
                     id="pending 60 s < 600 s: hold"),
        pytest.param(600, sizing(8, 8), 600, (8, 8, True), "scale_up_past_pending",
                     id="pending 600 s, more needed: scale up past it"),
        pytest.param(900, sizing(5, 2), 600, (5, 6, True), "scale_up_past_pending",
                     id="prefill up, decode would shrink: up only, decode keeps 6"),
        pytest.param(900, sizing(2, 2), 600, (3, 6, False), "hold_previous_not_done",
                     id="nothing larger needed: hold"),
        pytest.param(0, sizing(8, 8), 0, (8, 8, True), "scale_up_past_pending",
                     id="bound 0: a larger scale-up never waits"),
    ],
)
def test_decide_scales_up_past_a_pending_decision_after_the_bound(age_s, sz, bound, expected, first):
    last = DecisionRecord(3, NOW - age_s, 3, 6, done=False)
    d = run(fl=fleet(3, 6, last=last, ready=(2, 5)), sz=sz, o=obs(pods=steady_pods(3, 6)),
            scale_up_past_pending_s=bound, max_step_replicas=None)
    assert (d.prefill_replicas, d.decode_replicas, d.apply) == expected
    assert d.codes()[0] == first
    if first == "scale_up_past_pending":
        assert "ready: prefill 2, decode 5" in d.reasons[0].message
        assert "hold_previous_not_done" not in d.codes()


def test_decide_scale_up_past_pending_waits_on_stale_data():
    last = DecisionRecord(3, NOW - 900, 3, 6, done=False)
    d = run(fl=fleet(3, 6, last=last), sz=sizing(8, 8), o=obs(stale=("prometheus down",), pods=steady_pods(3, 6)))
    assert (d.prefill_replicas, d.decode_replicas, d.apply) == (3, 6, False)
    assert d.codes()[0] == "hold_previous_not_done"


def test_decide_hold_still_enforces_changed_bounds():
    last = DecisionRecord(3, NOW - 60, 3, 12, done=False)
    d = run(fl=fleet(2, 4, last=last), decode=(1, 8))
    assert (d.prefill_replicas, d.decode_replicas, d.apply) == (3, 8, True)
    assert "clamped_max" in d.codes()


@pytest.mark.parametrize(
    "o",
    [
        pytest.param(obs(stale=("prometheus: newest sample 340 s old",), pods=steady_pods(kv=0.1, queue=0)),
                     id="stale"),
        pytest.param(obs(taken_at_s=NOW - 600, pods=steady_pods(kv=0.1, queue=0)), id="10 min old"),
        pytest.param(obs(num_requests=None, pods=steady_pods(kv=0.1, queue=0)), id="requests missing"),
        pytest.param(obs(num_requests=math.nan, pods=steady_pods(kv=0.1, queue=0)), id="requests NaN"),
        pytest.param(obs(isl=None, pods=steady_pods(kv=0.1, queue=0)), id="ISL missing"),
        pytest.param(obs(pods=pool_pods("prefill", [(None, None)] * 2) + pool_pods("decode", [(math.nan, 0)] * 4)),
                     id="every pod's metrics missing/NaN"),
        pytest.param(obs(pods=steady_pods(kv=0.1, queue=0), coverage=(frontends(2, 1),)),
                     id="1 of 2 frontend targets down"),
    ],
)
def test_decide_never_shrinks_on_missing_or_stale_data(o):
    d = run(fl=fleet(2, 4), sz=sizing(1, 1), o=o)
    assert (d.prefill_replicas, d.decode_replicas, d.apply) == (2, 4, False)
    assert any(c.startswith("hold_") for c in d.codes())


def test_decide_holds_on_partial_frontend_scrapes_and_scales_down_once_whole():
    """Half the frontends down: the load looks halved and sizes (1, 1); the run holds (2, 4) and says why.
    Both up: the same sizing goes ahead."""
    half = run(fl=fleet(2, 4), sz=sizing(1, 1), o=obs(coverage=(frontends(2, 1, "down: fe-b"),)), sat=None)
    assert (half.prefill_replicas, half.decode_replicas, half.apply) == (2, 4, False)
    assert "hold_partial_metrics" in half.codes()
    (reason,) = [r for r in half.reasons if r.code == ReasonCode.HOLD_PARTIAL_METRICS]
    assert "1 of 2 frontend targets missing (down: fe-b)" in reason.message
    assert (reason.numbers["frontend_targets_expected"], reason.numbers["frontend_targets_present"]) == (2, 1)
    whole = run(fl=fleet(2, 4), sz=sizing(1, 1), o=obs(coverage=(frontends(2, 2),)), sat=None)
    assert (whole.prefill_replicas, whole.decode_replicas, whole.apply) == (1, 1, True)
    assert "hold_partial_metrics" not in whole.codes()


def test_decide_scales_up_on_partial_metrics():
    d = run(fl=fleet(2, 4), sz=sizing(3, 6), o=obs(coverage=(frontends(2, 1),)), sat=None)
    assert (d.prefill_replicas, d.decode_replicas, d.apply) == (3, 6, True)
    assert "hold_partial_metrics" in d.codes() and "scale_up" in d.codes()


def test_decide_missing_load_still_lets_the_guardrail_scale_up():
    d = run(fl=fleet(2, 4), sz=sizing(1, 1), o=obs(num_requests=None, pods=steady_pods(kv=0.78)))
    assert (d.prefill_replicas, d.decode_replicas) == (3, 5)
    assert "hold_missing_metrics" in d.codes() and "saturation_scale_up" in d.codes()


def test_decide_stabilization_uses_recommendation_history():
    history = [(NOW - 200, 2, 4), (NOW - 100, 2, 3)]
    d = run(fl=fleet(2, 4, history=history), sz=sizing(2, 1), sat=None)
    # recommendation 1, max in window max(4, 3) = 4 = current: held
    assert (d.decode_replicas, d.apply) == (4, False)
    assert d.recommended_decode_replicas == 1
    assert "stabilization_window" in d.codes()


def test_decide_never_scales_to_zero_unless_configured():
    d = run(fl=fleet(1, 1), sz=sizing(0, 0), o=obs(num_requests=0.0, isl=math.nan, osl=math.nan), sat=None)
    assert (d.prefill_replicas, d.decode_replicas) == (1, 1)
    idle = steady_pods(1, 1, kv=0.0, queue=0)
    d = run(fl=fleet(1, 1), sz=sizing(0, 0), o=obs(num_requests=0.0, isl=math.nan, osl=math.nan, pods=idle),
            allow_scale_to_zero=True, prefill=(0, 4), decode=(0, 4))
    # Allowed, but only after the quiet period with a cold start worth it (tests/zero): no history, kept at 1.
    assert (d.prefill_replicas, d.decode_replicas, d.apply) == (1, 1, False)
    assert "kept_above_zero" in d.codes()


@pytest.mark.parametrize(
    "fl, sz, config, expected",
    [
        pytest.param(fleet(2, 9, history=[(NOW - 100, 2, 9)]), sizing(2, 1), {"decode": (1, 6)}, (2, 6),
                     id="max lowered to 6 below current 9: window says 9, bounds say 6"),
        pytest.param(fleet(2, 1), sizing(2, 9), {"decode": (5, 16), "max_step_replicas": 1}, (2, 5),
                     id="min raised to 5 above current 1: step allows 2, bounds say 5"),
    ],
)
def test_decide_bounds_win_over_stabilization_and_step(fl, sz, config, expected):
    d = run(fl=fl, sz=sz, sat=None, **config)
    assert (d.prefill_replicas, d.decode_replicas) == expected


def test_decide_orders_limits_bounds_then_step_then_budget():
    # sizing (9, 12) -> max 10 -> step 3 from (2, 4): (5, 7) -> budget 10: x10/12 = 4.17/5.83 -> 4/5 +1 decode
    d = run(fl=fleet(2, 4), sz=sizing(9, 12), sat=None, decode=(1, 10), max_step_replicas=3, max_gpu_budget=10)
    assert (d.prefill_replicas, d.decode_replicas) == (4, 6)
    assert [c for c in d.codes() if c in ("clamped_max", "max_step", "gpu_budget")] == [
        "clamped_max", "max_step", "max_step", "gpu_budget"]
    assert (d.recommended_prefill_replicas, d.recommended_decode_replicas) == (9, 10)


def test_decision_reasons_are_machine_readable():
    d = run(sz=sizing(3, 2), o=obs(pods=steady_pods(kv=0.6)))
    doc = d.as_dict()
    assert doc["decode_replicas"] == 4
    veto = next(r for r in doc["reasons"] if r["code"] == "saturation_veto_scale_down")
    assert veto["pool"] == "decode"
    assert veto["numbers"]["avg_spare_kv_frac"] == pytest.approx(0.2)
    assert veto["numbers"]["spare_kv_after_removal_frac"] == pytest.approx(0.0)
    assert veto["numbers"]["requested_replicas"] == 2


def test_the_run_message_names_the_floors():
    """A scale-down the floor held and a scale-up the warm-up's floor made say so in the run's state message."""
    from types import SimpleNamespace

    from flows.report import run_message

    fl = fleet(6, 1, history=[(NOW - 3000, 8, 1), (NOW - 200, 2, 1), (NOW - 100, 2, 1)])
    held = run(fl=fl, sz=sizing(2, 1), sat=None, scale_down_floor_s=3600.0)
    assert run_message(SimpleNamespace(decision=held, fleet=fl), record=None, applying=False) == (
        "dry run, would have scaled down: scale-down floor")
    start = decide(sizing=sizing(2, 1), saturation=None, fleet=fleet(), obs=obs(), cfg=cfg(), now_s=NOW,
                   start_floor=StartFloor(targets=t(6, 2), intervals=4, window_s=300.0))
    # From (2, 4): prefill up to the warm-up's 6, decode down only to its 2; both pools name the floor once.
    assert run_message(SimpleNamespace(decision=start, fleet=fleet()), record=None, applying=False) == (
        "dry run, would have rebalanced: warm-up floor")
