"""Fast path: the trigger's saturation signal and the scale-up-only decision, as tables.

Pools are written (prefill, decode). Unless a case says otherwise: bounds 1..16,
no GPU budget, cooldown 30 s, WVA's thresholds (saturated at KV >= 0.80 or
queue >= 5; scale up when average spare KV < 0.1 or spare queue < 3).
"""

from __future__ import annotations

import pytest

from planner.config import FastPathConfig, SaturationThresholds
from planner.decision.decide import decide
from planner.decision.gates import fast_path_cooldown_gate
from planner.saturation.fast_path import saturation_signal
from planner.types import DecisionRecord, PodMetrics, ReasonCode
from tests.planner.decision.test_decide import NOW, cfg, fleet, guardrail, obs, pool_pods, sizing

FAST = FastPathConfig(cooldown_s=30.0)


def pods(prefill, decode):
    return pool_pods("prefill", prefill) + pool_pods("decode", decode)


# ---------------------------------------------------------------- the trigger


@pytest.mark.parametrize(
    "prefill, decode, shed, fires, pools",
    [
        pytest.param([(0.2, 0)], [(0.3, 0)], None, False, (),
                     id="idle: spare KV 0.6/0.5, queue 5 >= triggers: quiet"),
        pytest.param([(0.2, 3)], [(0.3, 0)], None, True, ("prefill",),
                     id="prefill queue 3: spare queue 5-3 = 2 < 3: fires"),
        pytest.param([(0.2, 2)], [(0.3, 0)], None, False, (),
                     id="prefill queue 2: spare queue 3, not < 3: quiet"),
        pytest.param([(0.2, 0)], [(0.75, 0)], None, True, ("decode",),
                     id="decode KV 0.75: spare 0.05 < 0.1: fires"),
        pytest.param([(0.2, 0)], [(0.7, 0)], None, False, (),
                     id="decode KV 0.70: spare 0.10, not < 0.1: quiet"),
        pytest.param([(0.2, 0)], [(0.9, 0), (0.1, 0)], None, False, (),
                     id="one decode saturated, the other spare 0.7: average over non-saturated, quiet"),
        pytest.param([(0.85, 0)], [(0.9, 6)], None, True, ("prefill", "decode"),
                     id="all saturated: spare counts as 0, both fire"),
        pytest.param([(0.2, 0)], [(0.3, 0)], 1.0, True, (),
                     id="router shed 1 >= 1: fires with no pool short"),
        pytest.param([(0.2, 0)], [(0.3, 0)], 0.4, False, (),
                     id="router shed 0.4 (increase extrapolated) < 1: quiet"),
        pytest.param([(0.2, 0)], [(0.3, 0)], float("nan"), False, (), id="shed unknown (NaN): quiet"),
        pytest.param([], [], None, False, (), id="no pod reports: never fires"),
        pytest.param([(None, 4)], [(0.3, 0)], None, False, (),
                     id="prefill KV missing, queue 4 < 5: missing, not spare: quiet"),
    ],
)
def test_saturation_signal(prefill, decode, shed, fires, pools):
    s = saturation_signal(pods=pods(prefill, decode), thresholds=SaturationThresholds(), cfg=FAST,
                          shed_requests=shed)
    assert (s.fire, s.pools) == (fires, pools)
    assert s.shed == (shed is not None and shed == shed and shed >= 1.0)
    if fires:
        assert s.message and "no pool short" not in s.message


def test_saturation_signal_carries_its_numbers():
    s = saturation_signal(pods=pods([(0.2, 3)], [(0.75, 0), (0.65, 1)]), thresholds=SaturationThresholds(),
                          cfg=FAST, shed_requests=2.0)
    # decode spare KV: (0.05 + 0.15) / 2 = 0.10, not < 0.1; spare queue (5 + 4) / 2 = 4.5
    assert s.pools == ("prefill",) and s.shed
    assert s.numbers["prefill_avg_spare_queue"] == 2.0
    assert s.numbers["decode_avg_spare_kv_frac"] == pytest.approx(0.10)
    assert s.numbers["decode_reporting_replicas"] == 2.0
    assert s.numbers["shed_requests"] == 2.0
    assert "router shed 2 requests" in s.message


def test_saturation_signal_rejects_bad_metrics():
    with pytest.raises(ValueError, match="kv_usage_frac must be a fraction"):
        saturation_signal(pods=[PodMetrics("d-0", "decode", 80.0, 0.0)], thresholds=SaturationThresholds(),
                          cfg=FAST)


# ---------------------------------------------------------------- cooldown


@pytest.mark.parametrize(
    "last, cooldown_s, skipped",
    [
        pytest.param(None, 30.0, False, id="no decision yet: go"),
        pytest.param(DecisionRecord(4, NOW - 10, 3, 5, done=False), 30.0, True, id="10 s < 30 s: skip"),
        pytest.param(DecisionRecord(4, NOW - 30, 3, 5, done=True), 30.0, False, id="30 s >= 30 s: go"),
        pytest.param(DecisionRecord(4, NOW + 5, 3, 5, done=True), 30.0, True, id="stamped 5 s ahead (skew): skip"),
        pytest.param(DecisionRecord(4, NOW, 3, 5, done=True), 0.0, False, id="cooldown 0: off"),
    ],
)
def test_fast_path_cooldown_gate(last, cooldown_s, skipped):
    r = fast_path_cooldown_gate(fleet=fleet(last=last), cooldown_s=cooldown_s, now_s=NOW)
    assert (r is not None) == skipped
    if r is not None:
        assert r.code == ReasonCode.FAST_PATH_COOLDOWN
        assert r.numbers["age_s"] == NOW - last.decided_at_s and r.numbers["cooldown_s"] == cooldown_s


# ---------------------------------------------------------------- the decision

@pytest.mark.parametrize(
    "fl, sz, config, expected, first",
    [
        pytest.param(fleet(2, 4), sizing(3, 6), {}, (3, 6, True), ReasonCode.FAST_PATH_SCALE_UP,
                     id="sized above current: (2,4) -> (3,6)"),
        pytest.param(fleet(2, 4), sizing(1, 6), {}, (2, 6, True), ReasonCode.FAST_PATH_SCALE_UP,
                     id="never a scale-down: prefill sized 1 stays 2, decode 4 -> 6"),
        pytest.param(fleet(2, 4), sizing(1, 2), {}, (2, 4, False), ReasonCode.FAST_PATH_NOTHING_TO_ADD,
                     id="sized below current: nothing written"),
        pytest.param(fleet(2, 4, last=DecisionRecord(3, NOW - 40, 4, 4, done=False), ready=(2, 4)),
                     sizing(6, 4), {}, (6, 4, True), ReasonCode.FAST_PATH_SCALE_UP,
                     id="pending (4,4) 40 s old, no 600 s wait: a larger 6 goes past it"),
        pytest.param(fleet(2, 4, last=DecisionRecord(3, NOW - 40, 4, 4, done=False), ready=(2, 4)),
                     sizing(3, 5), {}, (4, 5, True), ReasonCode.FAST_PATH_SCALE_UP,
                     id="pending (4,4): prefill 3 < in-flight 4 keeps 4, decode 5 > 4"),
        pytest.param(fleet(2, 4, last=DecisionRecord(3, NOW - 40, 4, 4, done=False), ready=(2, 4)),
                     sizing(3, 3), {}, (4, 4, False), ReasonCode.FAST_PATH_NOTHING_TO_ADD,
                     id="pending (4,4), sized (3,3): the in-flight scale-up stands, nothing written"),
        pytest.param(fleet(2, 4, last=DecisionRecord(3, NOW - 10, 4, 4, done=False), ready=(2, 4)),
                     sizing(8, 8), {}, (4, 4, False), ReasonCode.FAST_PATH_COOLDOWN,
                     id="decision 10 s old < cooldown 30 s: skipped, in-flight kept"),
        pytest.param(fleet(2, 4, last=DecisionRecord(3, NOW - 10, 2, 4, done=True)),
                     sizing(8, 8), {}, (2, 4, False), ReasonCode.FAST_PATH_COOLDOWN,
                     id="a done decision 10 s old also cools down"),
        pytest.param(fleet(2, 4), sizing(20, 6), {}, (16, 6, True), ReasonCode.FAST_PATH_SCALE_UP,
                     id="max 16 caps prefill 20"),
        pytest.param(fleet(2, 4), sizing(6, 6), {"max_gpu_budget": 8}, (4, 4, True), ReasonCode.FAST_PATH_SCALE_UP,
                     id="budget 8: (6,6) x 8/12 = (4,4), none below current (2,4)"),
        pytest.param(fleet(2, 6), sizing(6, 6), {"max_gpu_budget": 7}, (2, 6, False),
                     ReasonCode.FAST_PATH_NOTHING_TO_ADD,
                     id="budget 7 < the 8 set: (6,6) x 7/12 -> (4,3), decode below 6: nothing written"),
        pytest.param(fleet(2, 4), sizing(8, 8), {"max_step_replicas": 2}, (4, 6, True),
                     ReasonCode.FAST_PATH_SCALE_UP, id="max step 2: (2,4) -> (4,6)"),
    ],
)
def test_decide_fast_path(fl, sz, config, expected, first):
    d = decide(sizing=sz, saturation=None, fleet=fl, obs=obs(),
               cfg=cfg(**config), now_s=NOW, fast_path=FAST)
    assert (d.prefill_replicas, d.decode_replicas, d.apply) == expected
    assert d.reasons[0].code == first
    assert d.based_on == (fl.prefill.current_replicas, fl.decode.current_replicas)


def test_decide_fast_path_adds_the_guardrails_replica():
    fl = fleet(2, 4)
    hot = pods([(0.2, 0)] * 2, [(0.75, 0)] * 4)  # decode spare KV 0.05 < 0.1: +1
    d = decide(sizing=sizing(2, 4), saturation=guardrail(fl, hot), fleet=fl, obs=obs(pods=hot), cfg=cfg(),
               now_s=NOW, fast_path=FAST)
    assert (d.prefill_replicas, d.decode_replicas, d.apply) == (2, 5, True)
    assert ReasonCode.SATURATION_SCALE_UP.value in d.codes()
    first = d.reasons[0]
    assert first.code == ReasonCode.FAST_PATH_SCALE_UP
    assert first.numbers["decode_current_replicas"] == 4 and first.numbers["decode_to_replicas"] == 5
    assert "decode 4 -> 5" in first.message


def test_decide_fast_path_holds_on_stale_metrics():
    d = decide(sizing=sizing(8, 8), saturation=None, fleet=fleet(2, 4), obs=obs(stale=("prometheus down",)),
               cfg=cfg(), now_s=NOW, fast_path=FAST)
    assert (d.prefill_replicas, d.decode_replicas, d.apply) == (2, 4, False)
    assert d.reasons[0].code == ReasonCode.HOLD_STALE_METRICS


def test_scheduled_run_still_waits_for_the_pending_decision():
    # The same inputs as the "pending (4,4), larger 6" case: without the fast path the
    # 40 s old decision holds the run (scale_up_past_pending waits 600 s).
    fl = fleet(2, 4, last=DecisionRecord(3, NOW - 40, 4, 4, done=False), ready=(2, 4))
    d = decide(sizing=sizing(6, 4), saturation=None, fleet=fl, obs=obs(), cfg=cfg(), now_s=NOW)
    assert (d.prefill_replicas, d.decode_replicas, d.apply) == (4, 4, False)
    assert d.reasons[0].code == ReasonCode.HOLD_PREVIOUS_NOT_DONE


@pytest.mark.parametrize("enabled, expected", [
    pytest.param(False, (4, 4, False), id="off: the scheduled run waits 600 s for the pending (4,4)"),
    pytest.param(True, (6, 4, True), id="on: the scheduled run goes past the fast path's pending (4,4) to 6"),
])
def test_with_the_fast_path_on_scheduled_runs_scale_up_past_a_pending_decision(h200_profile_dir, enabled, expected):
    from planner.config import PlannerConfig, ProfileConfig
    from planner.steps import decision_config

    planner = PlannerConfig(profile=ProfileConfig(dir=str(h200_profile_dir)), fast_path=FastPathConfig(enabled=enabled))
    fl = fleet(2, 4, last=DecisionRecord(3, NOW - 40, 4, 4, done=False), ready=(2, 4))
    d = decide(sizing=sizing(6, 4), saturation=None, fleet=fl, obs=obs(), cfg=decision_config(planner), now_s=NOW)
    assert (d.prefill_replicas, d.decode_replicas, d.apply) == expected
    assert planner.decision.scale_up_past_pending_s == 600.0  # the configured value itself is untouched
